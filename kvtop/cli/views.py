"""The headless views: status, ranks, rooms, failures, events, and the `check` health probe."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import (
    At,
    Bootstrap,
    Connect,
    CurveKeysDir,
    Follow,
    Interval,
    Json,
    Model,
    ModelAt,
    ReplayPath,
    SGLangLog,
    Since,
    Until,
    Wait,
    fail,
    require_source,
)
from kvtop.cli.source import ModelChoice, Opened, journaled, model_choice, nobody_answered, opened
from kvtop.cli.when import Past, past_of

if TYPE_CHECKING:
    from kvtop.attach.wire import State
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.sglang import SGLangLogs
    from kvtop.views.check import Thresholds
    from transport.events import Event

_LOG_POLL_S = 0.25
_MODEL_POLL_S = 1.0
"""`kvtop events --follow --model` asks again this often (each ask costs the model process a keyframe)."""


def _frames(
    bootstrap: str,
    connect: list[str],
    wait: float,
    follow: bool = False,
    interval: float = 1.0,
    sglang_log: list[str] | None = None,
    past: Past | None = None,
    curve_keys: str = "",
    dashboard: ModelChoice | None = None,
) -> Iterator[tuple[ClusterModel, float, SGLangLogs | None, Opened]]:
    """The model once every agent's snapshot is in; with `follow`, again every `interval` until Ctrl-C.

    Yields (model, now, the log source or None, the source) under the source's lock, so a view reads a
    consistent model. Exit 1 when the bootstrap address or every agent stays silent, or when the collector
    stops while following (its error on stderr). With SGLang logs, "now" is the latest time they mention
    (or --at); with a recording (`past`), the replayed instant; with a dashboard's model, the instant it was
    read at (asked again each frame). Exit 1 when it does not answer, 2 when several run and none was named.
    """
    from kvtop.attach.client import ModelAmbiguous, ModelUnavailable
    from transport.errors import BootstrapError

    try:
        with opened(bootstrap, connect, wait, sglang_log, past=past, curve_keys=curve_keys,
                    dashboard=dashboard) as source:  # fmt: skip
            _say_what_was_heard(source, bootstrap, connect, wait)
            while True:
                if source.collector is not None and source.collector.died:
                    raise fail(source.collector.error)
                with source.lock:
                    source.model.update_incidents()  # what came since the source's last sweep
                    yield source.model, source.now(), source.logs, source
                if not follow:
                    return
                time.sleep(interval)
                source.refresh()
    except (BootstrapError, ModelUnavailable) as error:
        raise fail(str(error)) from None
    except ModelAmbiguous as error:
        raise fail(str(error), 2) from None
    except KeyboardInterrupt:
        return


def _say_what_was_heard(source: Opened, bootstrap: str, connect: list[str], wait: float) -> None:
    """The logs' summary (or the recording's damage) on stderr; exit 1 with one line when no agent answered."""
    if source.logs is not None:
        typer.echo(source.logs.stats().summary(), err=True)
    if source.damage:
        typer.echo(f"kvtop: {source.damage}", err=True)
    if source.attached is not None:
        _say_what_the_model_said(source.attached.state)
    if not source.heard():
        if source.attached is not None:
            raise fail(f"no agent answered the dashboard's model ({source.attached.state.source}) "
                       f"in its {source.attached.state.listening_s:.0f}s")  # fmt: skip
        with source.lock:
            unreachable = dict(source.model.intake.unreachable)
        raise fail(nobody_answered(bootstrap, connect, wait, unreachable))


def _say_what_the_model_said(state: State) -> None:
    """On stderr: the dashboard's source's error, and the asks its model process refused (counted)."""
    if state.error:
        typer.echo(f"kvtop: the dashboard's source: {state.error}", err=True)
    if state.refused:
        counts = ", ".join(f"{reason} {count}" for reason, count in sorted(state.refused.items()))
        typer.echo(f"kvtop: the dashboard's model refused {sum(state.refused.values())} asks ({counts})", err=True)


def _past(replay: str, at: str, since: str, until: str, sglang_log: list[str], follow: bool = False) -> Past:
    """The recording and times a view was asked to read (usage errors exit 2)."""
    try:
        past = past_of(replay, at, since, until, sglang_log)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if follow and past.given:
        raise typer.BadParameter("--follow reads what arrives; a recording or --at/--since has no more to come")
    return past


@contextlib.contextmanager
def _until_ctrl_c() -> Iterator[None]:
    """Ctrl-C ends a view cleanly (exit 0) wherever it lands: between frames or while one is printed."""
    with contextlib.suppress(KeyboardInterrupt):
        yield


def dumps(data: object, indent: int | None = None) -> str:
    """Strict JSON: a number that is not finite is a bug to name, never `NaN` in a script's input."""
    try:
        return json.dumps(data, indent=indent, separators=None if indent else (",", ":"), allow_nan=False)
    except ValueError as error:
        raise fail(f"internal error: {error} (a number that is not finite reached the JSON)") from None


def _show(text: str, data: object, as_json: bool, follow: bool) -> None:
    """One frame of a view: text for people, JSON for scripts (JSON Lines when following)."""
    if as_json:
        typer.echo(dumps(data) if follow else dumps(data, indent=2))
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
        int,
        typer.Option(
            min=0, help="CRITICAL below this many live ranks (0: every rank listed by --connect or discovered)."
        ),
    ] = 0,
    max_gaps: Annotated[int, typer.Option(min=0, help="WARNING above this many lost event batches.")] = 0,
    window: Annotated[float, typer.Option(min=1.0, help="Seconds of finished rooms the failure rate covers.")] = 60.0,
    incident_rooms: Annotated[
        int,
        typer.Option(
            min=1,
            help="CRITICAL while a cluster incident of at least this many rooms is ongoing (on logs, a recording "
            "or --since: any incident in the span read); WARNING below. Client aborts are no incident.",
        ),
    ] = 1,
    incident_rate: Annotated[
        float,
        typer.Option(min=0.0, help="... and only when it fails at least this many rooms a minute (0: any rate)."),
    ] = 0.0,
    incident_class: Annotated[
        list[str],
        typer.Option(
            help="CLASS=ROOMS: a room threshold of its own for incidents of this class (CLASS=off: never "
            "CRITICAL, only WARNING), e.g. timeout_bootstrap=5. Repeat for several classes."
        ),
    ] = [],  # noqa: B006
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
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """Health check for cron, Nagios/Icinga, Kubernetes exec probes and CI gates.

    Prints `KVTOP <STATUS> - <text> | <perfdata>` (or JSON) and exits 0 OK, 1 WARNING, 2 CRITICAL
    (including: an incident ongoing, cluster unreachable, no agent answering, a rank gone, a rank kvtop
    could not open a socket for (its own open-files limit: named with the limit), failure rate, abort rate
    or stuck rooms over the limit), 3 UNKNOWN (bad arguments, internal error). The first problem
    of an incident names its suspect: `KVTOP CRITICAL - incident: prefill-0/TP1 sends corrupt KV (checksum)
    since 10:02:11, 31 rooms | ...`. A rank listed (--connect, or by the bootstrap service) that does not
    answer within --wait is gone; one that answered is stale after 3 s of silence and gone after 10 s.
    With --sglang-log or --replay, check judges the span it reads (--since/--until; default the whole
    span): every incident in it counts, so logs that hold failures are never OK unless the thresholds say
    so; ranks from logs have no liveness and logs give no failure rate (they name no room that succeeded).
    With --model, the running dashboard's model is judged as it is (a rank that never answered it since it
    started is gone); a model that does not answer within --wait is CRITICAL, as a cluster that does not
    answer.
    """
    from kvtop.views.check import Thresholds

    past = _past(replay, at, since, until, sglang_log)
    dashboard = model_choice(model, model_at, past, sglang_log)
    require_source(bootstrap, connect, sglang_log, replay, dashboard is not None)
    limits = Thresholds(
        max_failure_rate, max_stuck, stuck_after, min_ranks, max_gaps, window, max_abort_rate, incident_rooms,
        incident_rate, _class_thresholds(incident_class),
    )  # fmt: skip
    raise typer.Exit(run_check(bootstrap, connect, limits, wait, as_json, sglang_log, past, curve_keys, dashboard))


def _class_thresholds(values: list[str]) -> tuple[tuple[str, int | None], ...]:
    """`--incident-class CLASS=ROOMS|off` into (class, rooms or None) pairs; a usage error names the bad one."""
    found: list[tuple[str, int | None]] = []
    for value in values:
        name, _, rooms = value.partition("=")
        if not name or not (rooms == "off" or (rooms.isdigit() and int(rooms) >= 1)):
            raise typer.BadParameter(f"{value!r} is not CLASS=ROOMS (ROOMS at least 1) or CLASS=off",
                                     param_hint="--incident-class")  # fmt: skip
        found.append((name, None if rooms == "off" else int(rooms)))
    return tuple(found)


def run_check(
    bootstrap: str,
    connect: list[str],
    limits: Thresholds,
    wait: float,
    as_json: bool,
    sglang_log: list[str],
    past: Past | None = None,
    curve_keys: str = "",
    dashboard: ModelChoice | None = None,
) -> int:
    """Judge the source against `limits`, print the verdict; returns its Nagios exit code."""
    from kvtop.attach.client import ModelAmbiguous, ModelUnavailable
    from kvtop.views.check import Verdict, evaluate, source_failing, unanswered, unreachable
    from transport.errors import BootstrapError

    try:
        source_opened = opened(
            bootstrap, connect, wait, sglang_log, past=past, curve_keys=curve_keys, dashboard=dashboard
        )
        with source_opened as source, source.lock:
            if source.damage:
                typer.echo(f"kvtop: {source.damage}", err=True)
            window = source.span_window() if source.span else source.window(limits.window_s)
            limits = dataclasses.replace(limits, window_s=window)
            result = evaluate(
                source.model, limits, source.now(), source.waited(wait), span=source.span, since=source.when.since
            )
            if source.attached is not None and source.attached.state.error:
                result = source_failing(result, f"the dashboard's source: {source.attached.state.error}")
    except BootstrapError as error:
        result = unreachable(bootstrap, str(error))
    except ModelUnavailable as error:
        result = unanswered(str(error))
    except ModelAmbiguous as error:
        typer.echo(f"KVTOP UNKNOWN - {error}")
        return int(Verdict.UNKNOWN)
    except typer.Exit:  # a log that cannot be read (said on stderr)
        return int(Verdict.UNKNOWN)
    except Exception as error:  # a check must answer UNKNOWN, never a traceback
        typer.echo(f"KVTOP UNKNOWN - internal error: {error!r}")
        return int(Verdict.UNKNOWN)
    try:
        text = json.dumps(result.as_dict(), indent=2, allow_nan=False) if as_json else result.nagios(limits)
    except ValueError as error:
        typer.echo(f"KVTOP UNKNOWN - internal error: {error}")
        return int(Verdict.UNKNOWN)
    typer.echo(text)
    return int(result.verdict)


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
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """One screen of cluster health: ranks, rooms, throughput, latency, failures, stuck rooms, links.

    A window the data does not fully cover is named by the span it does (`finished in the last 26s
    (snapshot history)`; JSON `span_s`, `span_limit`). From --sglang-log the window ends at the latest
    time the logs mention, and the logs' failed rooms stand in for a failure rate (logs name no room that
    succeeded; JSON `failure_rate` is null, `rooms_failed` counts them). Also counts what was rejected
    (events, frames) and the rooms retired as lost. Exit 1 when nobody answers.

    Also what was refused on the way in: bootstrap entries kvtop could not use (named), ranks it could not
    open a socket for (its own open-files limit, named with the limit: JSON `ranks.unreachable`,
    `collector.unreachable`), frames its collector rejected, registrations the bootstrap service refused
    (each client's latest, named with its address). With --follow, exit 1 if the collector stops (its
    error on stderr).
    """
    from kvtop.views.tables import status_json, status_text

    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log)
    with _until_ctrl_c():
        frames = _frames(bootstrap, connect, wait, follow, interval, sglang_log, past, curve_keys, dashboard)
        for read, now, logs, source in frames:
            span = source.window(window)
            text, data = status_text(read, now, span), status_json(read, now, span)
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
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """Every rank: role, instance, liveness (alive/stale/gone; log), host, pid, rooms in flight, origins, echoes,
    and the frames each of its sockets rejected (control, data, consensus, bootstrap, events, snapshot).

    An endpoint given by --connect that never answered is listed as a gone rank under its endpoint. A rank
    kvtop could not open a socket for (its own open-files limit) says so, and why (JSON `unreachable`).
    Exit 1 when nobody answers.
    """
    from kvtop.views.tables import ranks_json, ranks_text

    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log)
    with _until_ctrl_c():
        for read, now, _, _ in _frames(bootstrap, connect, wait, follow, interval, sglang_log, past, curve_keys,
                                       dashboard):  # fmt: skip
            _show(ranks_text(read, now), ranks_json(read, now), as_json, follow)


def rooms(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    wait: Wait = 2.0,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """Rooms still open on some rank: state per rank, bytes, age, idle time, link; STUCK after 10 s idle.

    A room nobody said anything of for 5 minutes is retired as lost. From --sglang-log: every room the
    logs name (a log names a room only where it failed), Failed on each rank that logged its failure;
    ages as of the latest time the logs mention. Exit 1 when nobody answers.
    """
    from kvtop.views.tables import rooms_json, rooms_text

    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log)
    with _until_ctrl_c():
        for read, now, logs, _ in _frames(bootstrap, connect, wait, follow, interval, sglang_log, past, curve_keys,
                                          dashboard):  # fmt: skip
            ended = logs is not None
            _show(rooms_text(read, now, ended), rooms_json(read, now, ended), as_json, follow)


def events(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events (and lost batches) until Ctrl-C.")
    ] = False,
    level: Annotated[
        str,
        typer.Option(help="Lowest level shown: debug, info, warning, error (all but one line per failure are debug)."),
    ] = "info",
    debug: Annotated[bool, typer.Option("--debug", help="Show everything (as --level debug).")] = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line.")] = False,
    wait: Wait = 2.0,
    sglang_log: SGLangLog = [],  # noqa: B006
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """The event tail as log lines, in time order across agents: what every agent remembers (its snapshot), then,
    with --follow, live (each batch that arrives in time order).

    Levels follow the fold: each failure group shows one line, its origin (else its earliest echo), at
    its level; every other member (the same failure seen by other ranks, propagated and cross-instance
    echoes) is debug. JSON Lines carry `level` (as shown) and `raw_level` (as the rank logged it).
    Live, agents the bootstrap address lists later are picked up; event batches that never arrived are
    a `gap` line (warning) each; events whose values make no sense are skipped and counted on stderr.
    Exit 1 when nobody answers. From --sglang-log: the failures and batch lines' queue depths (as
    heartbeats, debug) of the files, merged by time, then, with --follow, what they gain. With --model:
    the dashboard's own event tail (its journal), then, with --follow, what it gains, asked every second
    (lost batches counted on stderr).
    """
    from kvtop.model.live_fold import LiveFold
    from kvtop.views.event_lines import LEVELS, gap_json, gap_line, level_of, shown, snapshot_events, to_json, to_line

    level = "debug" if debug else level
    if level not in LEVELS:
        raise typer.BadParameter(f"{level!r} is not one of {', '.join(LEVELS)}", param_hint="--level")
    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log, journal=True)
    require_source(bootstrap, connect, sglang_log, replay, dashboard is not None)
    render = to_json if jsonl else to_line
    fold = LiveFold()

    def emit(model: ClusterModel, items: list[tuple[str, Event]]) -> None:
        """Print what is shown of `items` in time order across agents (each agent's own order kept for equal
        times), their failures' levels as the fold of the model's failures says."""
        fold.sync(model.failures, model.failures_total)
        for label, event in sorted(items, key=lambda item: item[1].ts):
            if shown(event, level, fold.leads):
                typer.echo(render(label, event, level_of(event, fold.leads)))

    if dashboard is not None:
        _model_events(bootstrap, connect, wait, follow, emit, dashboard)
        return
    if replay:
        _replayed_events(past, emit, gap_json if jsonl else gap_line, level)
        return
    if sglang_log:
        _log_events(sglang_log, follow, emit, past)
        return
    from kvtop.sources.live import Heard, News
    from transport.errors import BootstrapError

    news: queue.SimpleQueue[News] = queue.SimpleQueue()
    held: list[tuple[str, Event]] = []
    """One-shot: everything until every snapshot is in, so each failure's level is the whole fold's."""
    try:
        with opened(bootstrap, connect, wait, news=news, curve_keys=curve_keys) as source:
            _say_what_was_heard(source, bootstrap, connect, wait)
            with source.lock:
                for name, why in source.model.intake.bad_entries.items():
                    typer.echo(f"kvtop: skipped {name}: {why}", err=True)
            while True:
                with contextlib.suppress(queue.Empty):
                    while True:
                        item = news.get(block=follow, timeout=0.1)
                        if isinstance(item, Heard):
                            events = snapshot_events(item.events) if item.snapshot else item.events
                            held.extend((item.label, event) for event in events)
                            if follow:
                                with source.lock:
                                    emit(source.model, held)
                                held = []
                        elif level != "error":
                            typer.echo((gap_json if jsonl else gap_line)(item.label, item.batches, item.ts))
                if not follow:
                    break
            with source.lock:
                emit(source.model, held)
                rejected = source.model.rejected + source.model.rejected_frames
    except BootstrapError as error:
        raise fail(str(error)) from None
    except KeyboardInterrupt:
        return
    if rejected:
        typer.echo(f"kvtop: {rejected} events or batches rejected (values out of range or malformed)", err=True)


def _model_events(
    bootstrap: str,
    connect: list[str],
    wait: float,
    follow: bool,
    emit: Callable[[ClusterModel, list[tuple[str, Event]]], None],
    dashboard: ModelChoice,
) -> None:
    """`kvtop events --model`: the dashboard's event journal, then (following) what it gains, asked every
    `_MODEL_POLL_S`; lost batches and rejected events counted on stderr."""
    gaps = rejected = 0
    with _until_ctrl_c():
        for read, _, _, source in _frames(bootstrap, connect, wait, follow, _MODEL_POLL_S, dashboard=dashboard):
            assert source.attached is not None
            emit(read, journaled(source.attached))
            if read.gaps > gaps:
                typer.echo(f"kvtop: {read.gaps - gaps} event batches lost (counted by the dashboard's model)", err=True)
                gaps = read.gaps
            if not source.attached.state.journaling:
                typer.echo("kvtop: the dashboard's model keeps no event journal", err=True)
            rejected = read.rejected + read.rejected_frames
    if rejected:
        typer.echo(f"kvtop: {rejected} events or batches rejected (values out of range or malformed)", err=True)


def _replayed_events(
    past: Past,
    emit: Callable[[ClusterModel, list[tuple[str, Event]]], None],
    gap: Callable[[str, int, float], str],
    level: str,
) -> None:
    """`kvtop events --replay`: what the recording's collector heard from --since (its start) to --at (its end),
    each failure at the level the fold of the whole model at --at gives it."""
    from kvtop.record.records import Gapped
    from kvtop.views.event_lines import snapshot_events

    with opened("", [], 0.0, past=past, news_since=True) as source:
        if source.damage:
            typer.echo(f"kvtop: {source.damage}", err=True)
        held: list[tuple[str, Event]] = []
        for item in source.replayed:
            if isinstance(item, Gapped):
                emit(source.model, held)
                held = []
                if level != "error":
                    typer.echo(gap(item.label, item.batches, item.now))
            else:
                events = snapshot_events(item.events) if item.snapshot else item.events
                held.extend((item.label, event) for event in events)
        emit(source.model, held)


def _log_events(
    sglang_log: list[str],
    follow: bool,
    emit: Callable[[ClusterModel, list[tuple[str, Event]]], None],
    past: Past,
) -> None:
    """`kvtop events --sglang-log`: the logs' events in time order (from --since to --at), then what they gain."""
    with opened("", [], 0.0, sglang_log, past=past, log_events=True) as source:
        applied = source.loaded
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                emit(source.model, applied)
                if not follow:
                    break
                time.sleep(_LOG_POLL_S)
                applied = source.refresh()
        assert source.logs is not None
        typer.echo(source.logs.stats().summary(), err=True)


def failures(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    debug: Annotated[bool, typer.Option("--debug", help="List every echo under its origin.")] = False,
    as_json: Json = False,
    wait: Wait = 2.0,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """Recent failures of a live cluster or of SGLang logs, summarised by incident first (what broke: `kvtop
    incidents`), then each origin once with its echo count and the time it started (with the date once the
    groups fall on more than one day).

    Reads every agent's snapshot (its last 512 failures) and what agents publish meanwhile, or the logs
    (origins inferred; lines near a group shown with it, transport-library lines as its likely cause).
    Client aborts are listed as groups of class `aborted` and counted apart on stderr.
    The model keeps the newest 50,000 failures: a last line says how many older ones it did not keep.
    JSON: {groups, not_kept (those older failures)}, groups a list of {room, incident (its id in `kvtop
    incidents`, 0 for none), origin: {rank, role, instance, reason, reason_class, ts, level, raw_level} or null,
    origin_label, aborted (a client's abort, not a cluster fault), echo_count, echoes (level debug, raw_level as
    logged, origin), context}. Exit 1 when the cluster does not answer.
    """
    from kvtop.sources.sglang.context import published_context
    from kvtop.views.failures import failures_json, not_kept, render_groups
    from kvtop.views.incidents import in_span, render
    from kvtop.views.times import spans_days, stamp

    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log)
    with _until_ctrl_c():
        for read, now, logs, source in _frames(bootstrap, connect, wait, follow, interval, sglang_log, past,
                                               curve_keys, dashboard):  # fmt: skip
            groups = read.groups()
            if source.when.since is not None:
                groups = [group for group in groups if group.first_ts >= source.when.since]
            context = logs.context_for(groups) if logs is not None else published_context(read, groups)
            ids = [incident.id if (incident := read.incidents.incident_of(g)) else 0 for g in groups]
            start = groups[0].first_ts if groups else now
            summary = render(in_span(read, start, now), now, read.incidents.quiet_gap_s) + "\n\n"
            cut = not_kept(read, source.when.since)
            text = summary + render_groups(groups, debug, context, (cut, read.failures.maxlen or 0))
            _show(text, failures_json(groups, context, ids, cut), as_json, follow)
            aborted = sum(group.aborted for group in groups)
            dated = spans_days([start, now])
            typer.echo(
                f"{len(groups) - aborted} failures, {aborted} client aborts from {len(read.ranks)} ranks, "
                f"{stamp(start, dated)[:-4]} to {stamp(now, dated)[:-4]} (what the agents' snapshots and the model "
                "keep, or the logs hold)",
                err=True,
            )


def incidents(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    debug: Annotated[bool, typer.Option("--debug", help="List each incident's failure groups under it.")] = False,
    as_json: Json = False,
    wait: Wait = 2.0,
    follow: Follow = False,
    interval: Interval = 1.0,
    sglang_log: SGLangLog = [],  # noqa: B006
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    since: Since = "",
    until: Until = "",
    model: Model = False,
    model_at: ModelAt = "",
) -> None:
    """What broke, where, since when, how bad: one line per incident, newest first.

    An incident is one cause seen across rooms: the failure groups of one suspect (what most likely broke:
    a rank, an instance, the other side of an instance, the client; `unknown` when nothing names one) and
    one kind of failure (corrupt KV, stopped answering, refusing, failing), close in time; it has ended
    after 120 s without a new failure group. Columns: state (ongoing/ended), suspect, what it does, the
    class of failure that first showed it, rooms, since, for how long, origins (who noticed) / echoes,
    and the evidence for the suspect. Client aborts are an incident of `the client`, never of the cluster.
    JSON: {"incidents": [{id, state, kind, class, classes, headline, suspect: {kind, name, role},
    suspect_text, evidence, client, rooms (every room id, as strings), room_count, rooms_complete, origins,
    echoes, noticed_by, first_seen, last_seen, duration_s, rooms_per_min}], ongoing, now, since,
    quiet_gap_s}. Exit 1 when nobody answers.
    """
    from kvtop.views.incidents import by_incident, counted, in_span, render, to_json

    past = _past(replay, at, since, until, sglang_log, follow)
    dashboard = model_choice(model, model_at, past, sglang_log)
    with _until_ctrl_c():
        for read, now, _, source in _frames(bootstrap, connect, wait, follow, interval, sglang_log, past, curve_keys,
                                            dashboard):  # fmt: skip
            kept = in_span(read, source.when.since, now)
            gap = read.incidents.quiet_gap_s
            groups = by_incident(read, read.groups()) if debug else None
            _show(render(kept, now, gap, groups), to_json(kept, now, gap, source.when.since), as_json, follow)
            typer.echo(counted(kept, now, gap, source.start if source.span else None), err=True)


def register(app: typer.Typer) -> None:
    app.command("incidents")(incidents)
    app.command("status")(status)
    app.command("ranks")(ranks)
    app.command("rooms")(rooms)
    app.command("events")(events)
    app.command("failures")(failures)
    app.command("check")(check)
