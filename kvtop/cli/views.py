"""The headless views: status, ranks, rooms, failures, events, and the `check` health probe."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import (
    Bootstrap,
    Connect,
    Follow,
    Interval,
    Json,
    SGLangLog,
    Wait,
    fail,
    open_sglang_logs,
    require_source,
)

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.sglang import SGLangLogs
    from transport.events import Event

_LOG_POLL_S = 0.25

check_ran = threading.Event()
"""Set once `kvtop check` got past argument parsing: its exit 2 is then CRITICAL, not a usage error."""


def _log_models(
    sglang_log: list[str], follow: bool, interval: float
) -> Iterator[tuple[ClusterModel, float, SGLangLogs | None]]:
    """The model of the logs read to their end; with `follow`, again every `interval` with what they gained."""
    from kvtop.model.cluster import ClusterModel

    logs = open_sglang_logs(sglang_log)
    model = ClusterModel()
    try:
        logs.load(model)
        typer.echo(logs.stats().summary(), err=True)
        while True:
            yield model, logs.now, logs
            if not follow:
                return
            time.sleep(interval)
            logs.poll(model)
    except KeyboardInterrupt:
        return
    finally:
        logs.close()


def _models(
    bootstrap: str,
    connect: list[str],
    wait: float,
    follow: bool = False,
    interval: float = 1.0,
    sglang_log: list[str] | None = None,
) -> Iterator[tuple[ClusterModel, float, SGLangLogs | None]]:
    """The model once every agent's snapshot is in; with `follow`, again every `interval` until Ctrl-C.

    Yields (model, now, the log source or None) under the collector's lock, so a view reads a consistent
    model. Exit 1 when nobody answers, or when the collector stops while following (its error on stderr).
    With SGLang logs, "now" is the latest time they mention.
    """
    from kvtop.sources.live import Collector
    from transport.errors import BootstrapError

    require_source(bootstrap, connect, sglang_log)
    if sglang_log:
        yield from _log_models(sglang_log, follow, interval)
        return
    collector = Collector(bootstrap, connect)
    try:
        collector.start(discover_timeout_s=wait)
        collector.wait_synced(wait)
        while True:
            if collector.died:
                raise fail(collector.error)
            with collector.lock:
                yield collector.model, time.time(), None
            if not follow:
                return
            time.sleep(interval)
    except BootstrapError as error:
        raise fail(str(error)) from None
    except KeyboardInterrupt:
        return
    finally:
        collector.close()


@contextlib.contextmanager
def _until_ctrl_c() -> Iterator[None]:
    """Ctrl-C ends a view cleanly (exit 0) wherever it lands: between frames or while one is printed."""
    with contextlib.suppress(KeyboardInterrupt):
        yield


def _show(text: str, data: object, as_json: bool, follow: bool) -> None:
    """One frame of a view: text for people, JSON for scripts (JSON Lines when following)."""
    if as_json:
        typer.echo(json.dumps(data, separators=(",", ":")) if follow else json.dumps(data, indent=2))
    else:
        typer.echo(f"--- {time.strftime('%H:%M:%S')}\n{text}\n" if follow else text)


def check(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    max_failure_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="CRITICAL above this failed fraction of rooms, client aborts left out (WARNING at half).",
        ),
    ] = 0.05,
    max_stuck: Annotated[int, typer.Option(min=0, help="CRITICAL above this many stuck rooms.")] = 0,
    stuck_after: Annotated[
        float, typer.Option(min=0.1, help="Seconds without progress that make a room stuck.")
    ] = 10.0,
    min_ranks: Annotated[
        int, typer.Option(min=0, help="CRITICAL below this many live ranks (0: every listed rank).")
    ] = 0,
    max_gaps: Annotated[int, typer.Option(min=0, help="WARNING above this many lost event batches.")] = 0,
    window: Annotated[float, typer.Option(min=1.0, help="Seconds of finished rooms the failure rate covers.")] = 60.0,
    max_abort_rate: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="CRITICAL above this fraction of rooms aborted by clients (WARNING at half; default: no limit). "
            "Client aborts never count in the failure rate.",
        ),
    ] = None,
    wait: Wait = 2.0,
    as_json: Json = False,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """Health check for cron, Nagios/Icinga, Kubernetes exec probes and CI gates.

    Prints `KVTOP <STATUS> - <text> | <perfdata>` (or JSON) and exits 0 OK, 1 WARNING, 2 CRITICAL
    (including: cluster unreachable, a rank gone, failure rate, abort rate or stuck rooms over the limit),
    3 UNKNOWN (bad arguments, internal error). With --sglang-log, ranks from logs have no liveness
    and the window ends at the last time the logs mention.
    """
    require_source(bootstrap, connect, sglang_log)
    check_ran.set()
    from kvtop.sources.live import Collector
    from kvtop.views.check import Thresholds, Verdict, evaluate, unreachable
    from transport.errors import BootstrapError

    limits = Thresholds(max_failure_rate, max_stuck, stuck_after, min_ranks, max_gaps, window, max_abort_rate)
    if sglang_log:
        try:
            for model, now, _ in _log_models(sglang_log, False, 0.0):
                result = evaluate(model, limits, now)
        except typer.Exit:  # a log that cannot be read (said on stderr)
            raise typer.Exit(int(Verdict.UNKNOWN)) from None
        except Exception as error:  # a check must answer UNKNOWN, never a traceback
            typer.echo(f"KVTOP UNKNOWN - internal error: {error!r}")
            raise typer.Exit(int(Verdict.UNKNOWN)) from None
        typer.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.nagios(limits))
        raise typer.Exit(int(result.verdict))
    collector = Collector(bootstrap, connect)
    try:
        collector.start(discover_timeout_s=wait)
        collector.wait_synced(wait)
        with collector.lock:
            result = evaluate(collector.model, limits)
    except BootstrapError as error:
        result = unreachable(bootstrap, str(error))
    except Exception as error:  # a check must answer UNKNOWN, never a traceback
        typer.echo(f"KVTOP UNKNOWN - internal error: {error!r}")
        raise typer.Exit(int(Verdict.UNKNOWN)) from None
    finally:
        collector.close()
    typer.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.nagios(limits))
    raise typer.Exit(int(result.verdict))


def status(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    window: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds the rates and failures cover (less, and the output says so, where the agents' "
            "snapshots hold less: each keeps its last 512 rooms).",
        ),
    ] = 60.0,
    wait: Wait = 2.0,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """One screen of cluster health: ranks, rooms, throughput, latency, failures, stuck rooms, links.

    A window the data does not fully cover is named by the span it does (`finished in the last 26s
    (snapshot history)`; JSON `span_s`, `span_limit`). From --sglang-log the window ends at the latest
    time the logs mention, and the logs' failed rooms stand in for a failure rate (logs name no room that
    succeeded; JSON `failure_rate` is null, `rooms_failed` counts them).

    Also what was refused on the way in: bootstrap entries kvtop could not use (named), frames its
    collector rejected, registrations the bootstrap service refused. With --follow, exit 1 if the
    collector stops (its error on stderr).
    """
    from kvtop.views.tables import status_json, status_text

    with _until_ctrl_c():
        for model, now, logs in _models(bootstrap, connect, wait, follow, interval, sglang_log):
            text, data = status_text(model, now, window), status_json(model, now, window)
            if logs is not None:
                stats = logs.stats()
                text += f"\nlogs    {stats.summary().removeprefix('sglang logs: ')}"
                data["logs"] = dataclasses.asdict(stats)
            _show(text, data, as_json, follow)


def ranks(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    wait: Wait = 2.0,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """Every rank: role, instance, liveness (alive/stale/gone; log), host, pid, rooms in flight, origins, echoes,
    and the frames each of its sockets rejected (control, data, consensus, bootstrap, events, snapshot)."""
    from kvtop.views.tables import ranks_json, ranks_text

    with _until_ctrl_c():
        for model, now, _ in _models(bootstrap, connect, wait, follow, interval, sglang_log):
            _show(ranks_text(model, now), ranks_json(model, now), as_json, follow)


def rooms(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    wait: Wait = 2.0,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """Rooms still open on some rank: state per rank, bytes, age, idle time, link; STUCK after 10 s idle.

    From --sglang-log: every room the logs name (a log names a room only where it failed), Failed on
    each rank that logged its failure; ages as of the latest time the logs mention.
    """
    from kvtop.views.tables import rooms_json, rooms_text

    with _until_ctrl_c():
        for model, now, logs in _models(bootstrap, connect, wait, follow, interval, sglang_log):
            ended = logs is not None
            _show(rooms_text(model, now, ended), rooms_json(model, now, ended), as_json, follow)


def events(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
    level: Annotated[
        str,
        typer.Option(help="Lowest level shown: debug, info, warning, error (all but one line per failure are debug)."),
    ] = "info",
    debug: Annotated[bool, typer.Option("--debug", help="Show everything (as --level debug).")] = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line.")] = False,
    wait: Wait = 2.0,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """The event tail as log lines: what every agent remembers (its snapshot), then, with --follow, live.

    Levels follow the fold: each failure group shows one line, its origin (else its earliest echo), at
    its level; every other member (the same failure seen by other ranks, propagated and cross-instance
    echoes) is debug. JSON Lines carry `level` (as shown) and `raw_level` (as the rank logged it).
    From --sglang-log: the failures and batch lines' queue depths (as heartbeats, debug) of the files,
    merged by time, then, with --follow, what they gain.
    """
    from kvtop.model.cluster import ClusterModel
    from kvtop.model.live_fold import LiveFold
    from kvtop.views.event_lines import LEVELS, level_of, shown, snapshot_events, to_json, to_line
    from transport.bootstrap import BootstrapClient
    from transport.errors import BootstrapError
    from transport.events import Snapshot
    from transport.subscriber import EventSubscriber

    level = "debug" if debug else level
    if level not in LEVELS:
        raise typer.BadParameter(f"{level!r} is not one of {', '.join(LEVELS)}", param_hint="--level")
    require_source(bootstrap, connect, sglang_log)
    render = to_json if jsonl else to_line
    model, fold = ClusterModel(), LiveFold()

    def emit(items: list[tuple[str, Event]]) -> None:
        """Print what is shown of `items`, their failures' levels as the fold of everything so far says."""
        fold.sync(model.failures, model.failures_total)
        for label, event in items:
            if shown(event, level, fold.leads):
                typer.echo(render(label, event, level_of(event, fold.leads)))

    if sglang_log:
        _log_events(sglang_log, follow, model, emit)
        return
    agents = []
    if bootstrap:
        try:
            with BootstrapClient(bootstrap, timeout_s=wait) as client:
                agents = client.list_agents()
        except BootstrapError as error:
            raise fail(str(error)) from None
    subscriber = EventSubscriber()
    for agent in agents:
        subscriber.connect(agent)
    for endpoint in connect:
        subscriber.connect_endpoint(endpoint)
    for name, why in subscriber.refused.items():
        typer.echo(f"kvtop: skipped {name}: {why}", err=True)
    deadline = time.monotonic() + wait
    held: list[tuple[str, Event]] = []
    """One-shot: everything until every snapshot is in, so each failure's level is the whole fold's."""
    try:
        while follow or (time.monotonic() < deadline and not subscriber.synced()):
            for delivered in subscriber.poll(0.1):
                item = delivered.item
                model.apply(delivered.label, item, time.time())
                batch = snapshot_events(item) if isinstance(item, Snapshot) else item.events
                held.extend((delivered.label, event) for event in batch)
            if follow:
                emit(held)
                held = []
    except KeyboardInterrupt:
        pass
    finally:
        subscriber.close()
    emit(held)


def _log_events(
    sglang_log: list[str], follow: bool, model: ClusterModel, emit: Callable[[list[tuple[str, Event]]], None]
) -> None:
    """`kvtop events --sglang-log`: the logs' events in time order, then what they gain."""
    logs = open_sglang_logs(sglang_log)
    try:
        applied = logs.load(model)
        while True:
            emit(applied)
            if not follow:
                break
            time.sleep(_LOG_POLL_S)
            applied = logs.poll(model)
    except KeyboardInterrupt:
        pass
    finally:
        logs.close()
    typer.echo(logs.stats().summary(), err=True)


def failures(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    debug: Annotated[bool, typer.Option("--debug", help="List every echo under its origin.")] = False,
    as_json: Json = False,
    wait: Wait = 2.0,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
) -> None:
    """Recent failures of a live cluster or of SGLang logs, each origin once with its echo count and the time
    it started (with the date once the groups fall on more than one day).

    Reads every agent's snapshot (its last 512 failures) and what agents publish meanwhile, or the logs
    (origins inferred; lines near a group shown with it, transport-library lines as its likely cause).
    Client aborts are listed as groups of class `aborted` and counted apart on stderr.
    JSON: a list of groups {room, origin: {rank, role, instance, reason, reason_class, ts, level, raw_level}
    or null, origin_label, aborted (a client's abort, not a cluster fault), echo_count, echoes (level debug,
    raw_level as logged, origin), context}.
    Exit 1 when the cluster does not answer.
    """
    from kvtop.views.failures import render_groups, to_json

    with _until_ctrl_c():
        for model, _, logs in _models(bootstrap, connect, wait, follow, interval, sglang_log):
            groups = model.groups()
            context = logs.context_for(groups) if logs is not None else None
            _show(render_groups(groups, debug, context), to_json(groups, context), as_json, follow)
            aborted = sum(group.aborted for group in groups)
            typer.echo(
                f"{len(groups) - aborted} failures, {aborted} client aborts from {len(model.ranks)} ranks", err=True
            )


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("ranks")(ranks)
    app.command("rooms")(rooms)
    app.command("events")(events)
    app.command("failures")(failures)
    app.command("check")(check)
