"""`kvtop agent --sglang-log FILE ...`: the log sidecar as a command (`kvtop agent` without it runs our agent)."""

from __future__ import annotations

import errno
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from kvtop.cli.options import MAX_INTERVAL_S, Bootstrap, Insecure, fail, key_folder, load_curve

sidecar_app = typer.Typer(
    add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]}
)


def _log_file(path: Path) -> Path:
    """--sglang-log: a file, or a path not there yet (waited for); a folder, a device or stdin is refused at start."""
    if str(path) == "-":  # a view reads a log piped in; a sidecar would wait for a file named `-`
        raise typer.BadParameter("'-' (stdin): a sidecar follows a log file by its path: give the server's log file")
    if path.is_dir():
        raise typer.BadParameter(f"{str(path)!r} is a folder: give the server's log file in it")
    if path.is_symlink() and not path.exists() and _loops(path):
        raise typer.BadParameter(f"{str(path)!r} is a symlink loop: give the server's log file")
    if path.exists() and not path.is_file():
        raise typer.BadParameter(
            f"{str(path)!r} is not a regular file (a device or a pipe): give the server's log file"
        )
    return path


def _loops(path: Path) -> bool:
    """Whether resolving `path` goes round a loop of links (a link to a file not there yet is waited for)."""
    try:
        path.stat()
    except OSError as error:
        return error.errno == errno.ELOOP
    return False


@sidecar_app.command(name="agent")
def sidecar(
    sglang_log: Annotated[
        Path,
        typer.Option(
            "--sglang-log",
            callback=_log_file,
            help="The SGLang server log to follow (tail -f; rotation by rename or copytruncate; a file that is "
            "not there yet is waited for, a folder, a device or a symlink loop refused; container-runtime and "
            "dashboard wrappers understood; a record at its end, such as a traceback, is published once the file "
            "gained nothing for 1 s).",
        ),
    ],
    bootstrap: Bootstrap = "",
    role: Annotated[str, typer.Option(help="prefill or decode (default: from the file's name or its lines).")] = "",
    instance: Annotated[
        str,
        typer.Option(
            help="The server instance's name, unique in the cluster (default: from the file's name, e.g. "
            "prefill-0.log, else the container a docker compose wrapper names, else ROLE-0). Give it when several "
            "sidecars share a bootstrap."
        ),
    ] = "",
    tp: Annotated[
        int,
        typer.Option(
            min=1,
            max=1024,
            help="Ranks to publish from the start (TP0..N-1); others as the log names them "
            "(its server_args line's tp_size, or a line's TP tag). A later node's log of a server over several "
            "nodes publishes its node's ranks alone.",
        ),
    ] = 1,
    host: Annotated[
        str, typer.Option(help="Address to bind the ranks' event and snapshot sockets to (and to advertise).")
    ] = "127.0.0.1",
    metrics: Annotated[
        str,
        typer.Option(
            help="The server's Prometheus endpoint (http://HOST:PORT/metrics, SGLang's `--enable-metrics`): its KV "
            "transfer metrics go into the heartbeat; one that never moved shows as 'no data'."
        ),
    ] = "",
    metrics_interval: Annotated[
        float, typer.Option(min=0.5, max=MAX_INTERVAL_S, help="Seconds between scrapes (at most an hour).")
    ] = 5.0,
    idle_after: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds without a new line after which the rank's state is idle (or down "
            "when --metrics does not answer either).",
        ),
    ] = 30.0,
    poll_interval: Annotated[
        float, typer.Option(min=0.005, max=5.0, help="Seconds between looks at a quiet file.")
    ] = 0.05,
    curve_keys: Annotated[
        str,
        typer.Option(
            "--curve-keys",
            metavar="DIR",
            callback=key_folder,
            help="The cluster's CURVE key folder (`kvtop keys generate DIR`, with the server secret and allowed/): "
            "the ranks' sockets answer only clients in DIR/allowed; the registrations dial --bootstrap with it.",
        ),
    ] = "",
    insecure: Insecure = False,
) -> None:
    """Follow one SGLang server's log and publish its events per rank (instance/TPn) on the event plane.

    Each rank has an event (PUB) and a snapshot (ROUTER) socket, registered with --bootstrap (refreshed every
    second; deregistered on exit); without --bootstrap, each rank's event endpoint is printed for a view's `--connect`.
    Heartbeats (every second) carry the file, the read position, the garbled lines and the scraped metrics.
    Diagnostics go to stderr. Exit codes: 0 when stopped (SIGTERM, Ctrl-C), 1 when one of its threads died,
    2 for bad usage (a key folder that cannot serve, a --host beyond loopback without --curve-keys or --insecure,
    a --sglang-log that is a folder, a device or a symlink loop, or whose wrapper names several servers: docker
    compose logs of more than one).
    """
    import zmq

    from kvtop.sidecar.ranks import identity_problem
    from kvtop.sidecar.sidecar import Sidecar, SidecarOptions
    from kvtop.sidecar.tail import LogTail
    from kvtop.sources.sglang import LogSpec
    from transport.curve import exposure_problem
    from transport.signals import stop_on

    if role and role not in ("prefill", "decode"):
        raise typer.BadParameter(f"{role!r} (expected prefill or decode)", param_hint="--role")
    if metrics and not metrics.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{metrics!r} is not an http(s) URL", param_hint="--metrics")
    if problem := exposure_problem([host], bool(curve_keys), insecure):
        raise fail(problem, 2)
    keys = load_curve(curve_keys, serve=True)
    tail = LogTail(LogSpec(sglang_log, role), instance, idle_after)
    if instance and (problem := identity_problem(tail.role or "decode", instance)):
        raise typer.BadParameter(problem, param_hint="--instance")
    options = SidecarOptions(tail, bootstrap, tp, host, metrics, metrics_interval, poll_interval, keys)

    def say(line: str) -> None:
        print(f"kvtop agent: {line}", file=sys.stderr, flush=True)

    stop = threading.Event()
    try:
        with stop_on(stop, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            code = Sidecar(options, say).run(stop)
    except zmq.ZMQError as error:  # an address it cannot bind
        raise fail(f"agent --sglang-log: cannot bind on {host}: {error}") from None
    raise typer.Exit(code)


def main(args: list[str]) -> int:
    """Run the sidecar with `kvtop agent`'s arguments; returns the exit code."""
    code = sidecar_app(args, prog_name="kvtop agent", standalone_mode=False)
    return int(code) if isinstance(code, int) else 0
