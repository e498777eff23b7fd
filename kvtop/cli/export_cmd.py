"""`kvtop export`: Prometheus metrics of a live cluster or of SGLang logs; the dashboards' `--export` option."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import MAX_INTERVAL_S, fail
from kvtop.cli.source import SilenceSaid, reading, reads_source
from kvtop.source.spec import SourceSpec

if TYPE_CHECKING:
    from kvtop.export.server import MetricsServer
    from kvtop.model.cluster import ClusterModel

_POLL_S = 0.25


def _listen(value: str) -> str:
    """HOST:PORT, checked before anything binds ("" passes: the option was not given, and bare `kvtop`'s own
    `--export` is checked before every subcommand: no import for it, or every command starts ~0.1 s later)."""
    if value:
        from kvtop.export.server import parse_listen

        try:
            parse_listen(value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None
    return value


def _given_listen(value: str) -> str:
    """`_listen` for `kvtop export`, where the address is always given: "" is no address."""
    if not value:
        raise typer.BadParameter("'' is not HOST:PORT (e.g. 127.0.0.1:9464, or 127.0.0.1:0 for a free port)")
    return _listen(value)


Listen = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_EXPORT_LISTEN",
        callback=_given_listen,
        help="HOST:PORT to serve /metrics on (PORT 0: a free one; the first stdout line is the URL). Loopback "
        "by default: plain HTTP has no authentication, so a non-loopback address is allowed but said on stderr.",
    ),
]
Export = Annotated[
    str,
    typer.Option(
        "--export",
        callback=_listen,
        help="Also serve Prometheus metrics of what the dashboard shows on HOST:PORT (e.g. 127.0.0.1:9464), "
        "as `kvtop export` does.",
    ),
]


@contextlib.contextmanager
def exporting(
    listen: str,
    model: ClusterModel,
    lock: contextlib.AbstractContextManager[object],
    source: str,
    now: Callable[[], float] = time.time,
    error: Callable[[], str] = lambda: "",
) -> Iterator[MetricsServer | None]:
    """Serve `model` on `listen` for the block ("" serves nothing), its URL said on stderr; exit 1 with one line
    when it cannot bind."""
    if not listen:
        yield None
        return
    from kvtop.export.server import is_loopback, parse_listen, serving

    host, _ = parse_listen(listen)
    if not is_loopback(host):
        typer.echo(f"kvtop: serving metrics on {host}, beyond loopback, over plain HTTP (no authentication)", err=True)
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(serving(model, lock, listen, now=now, source=source, error=error))
        except OSError as bind_error:
            raise fail(f"cannot serve metrics on {listen}: {bind_error}") from None
        typer.echo(f"kvtop: Prometheus metrics at {server.url}", err=True)
        yield server


@reads_source(span=False)
def export(
    source: SourceSpec,
    listen: Listen = "127.0.0.1:9464",
    model_every: Annotated[
        float,
        typer.Option(
            min=0.5,
            max=MAX_INTERVAL_S,
            help="With --model: seconds between asks for the dashboard's model (the metrics are at most this old; "
            "each ask costs its model process a keyframe, ~0.3 s of a core at 100k rooms).",
        ),
    ] = 5.0,
) -> None:
    """Serve Prometheus metrics of a live cluster, of SGLang logs, of a recording or of a running dashboard's
    model on /metrics until Ctrl-C or SIGTERM.

    Read from the model at each scrape: failure origins and echoes as separate counters (one alert per
    cause, not one per rank that saw it), client aborts apart, rooms finished by outcome, stuck rooms,
    bytes per prefill-decode link, a transfer duration histogram, rank states, event gaps and rejections,
    and the scrape's own cost. Counters never go down while kvtop runs, although the model keeps bounded
    windows. docs/export.md lists every metric; kvtop/export/grafana/kvtop.json is a dashboard on them.
    With --sglang-log the files are followed as they grow; with --replay the model is the recording's at --at
    (default: its end), judged at that instant; with --model, the dashboard's model as it was at the last
    ask (every --model-every). The first stdout line is the /metrics URL. No agent answered within --wait (a
    bootstrap that lists none): said on stderr once, and when the first does; kvtop_ranks is 0 meanwhile. Every
    agent quiet for longer than --wait (3 s at least) later on (a cluster stopped): said once too, and when one
    answers again.
    Exit 0 on Ctrl-C, SIGTERM or SIGHUP; 1 when the bootstrap address (or the dashboard's model) does not answer,
    the address cannot be bound, or the collector stops (its error on stderr).
    """
    from kvtop.sources.live import tune_gc
    from transport.signals import STOP_SIGNALS, ignore, interrupt

    every = model_every if source.dashboard is not None else _POLL_S
    for signum in STOP_SIGNALS:  # once: a second one does not cut the stop short
        signal.signal(signum, interrupt)
    tune_gc()  # a long-lived collecting process
    try:
        with contextlib.suppress(KeyboardInterrupt), reading(source) as read:
            if read.damage:
                typer.echo(f"kvtop: {read.damage}", err=True)
            with exporting(listen, read.model, read.lock, source.kind, read.now) as server:
                assert server is not None
                typer.echo(server.url)
                silence = SilenceSaid(read, source.wait, "kvtop", f"serving on: {_UNTIL_ONE_ANSWERS}", _WHILE_QUIET)
                while not (stopped := read.stopped()):
                    time.sleep(every)
                    silence.check()
                    read.refresh()  # a dashboard's model asked again: served from then on
                    for line in read.said():  # a followed log gone from its path: no quiet server
                        typer.echo(line, err=True)
                    with read.lock:
                        server.metrics.model = read.model
                raise fail(stopped)
    finally:
        ignore(*STOP_SIGNALS)  # stopped: a late one must not kill the interpreter's exit (-15)


_UNTIL_ONE_ANSWERS = "kvtop_ranks says 0 until an agent answers"
"""What the exporter says it does while no agent answered: it serves on (a cluster may start after it)."""
_WHILE_QUIET = "serving on: kvtop_ranks counts the quiet ranks stale, then gone"
"""What the exporter says it does once every agent that answered went quiet."""


def register(app: typer.Typer) -> None:
    app.command("export")(export)
