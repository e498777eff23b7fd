"""The headless views: status, ranks, rooms, failures, events, and the `check` health probe."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import INTERRUPTED, MAX_SPAN_S, Follow, Interval, Json, fail, quiet_stdout
from kvtop.cli.source import SilenceSaid, reading, reads_source, say_what_was_heard
from kvtop.source.spec import SourceSpec
from kvtop.views.safe import terminal_safe

if TYPE_CHECKING:
    from kvtop.source import Source
    from kvtop.views.check import CheckResult, Thresholds


def _frames(spec: SourceSpec, follow: bool = False, interval: float = 1.0) -> Iterator[Source]:
    """The source once opened; with `follow`, again every `interval` (refreshed) until Ctrl-C.

    Yields under the source's lock, so a view reads a consistent model. Exit 1 when nobody answers (read once
    through a relay that says why, after the one frame: `say_what_was_heard`) or the source stops while following
    (its error on stderr); the errors of opening it as `reading` says. Ctrl-C
    after a followed frame ends it cleanly (exit 0); before any frame, it exits 130, saying so (a view that
    printed nothing exited 0, as if it had shown something).
    """
    shown = False
    try:
        with reading(spec) as source:
            unheard = say_what_was_heard(source, follow)
            while True:
                if stopped := source.stopped():
                    raise fail(stopped)
                with source.lock:
                    source.model.update_incidents()  # what came since the source's last sweep
                    yield source
                shown = True
                if not follow:
                    if unheard:  # shown (the ranks unheard, the relay's upstream named), yet no agent answered
                        raise fail(unheard)
                    return
                time.sleep(interval)
                source.refresh()
                for line in source.said():  # a followed log gone from its path: no quiet server
                    typer.echo(terminal_safe(line), err=True)
    except KeyboardInterrupt:
        if not shown:
            raise fail("interrupted before the source answered", INTERRUPTED) from None


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
        typer.echo(terminal_safe(f"--- {time.strftime('%H:%M:%S')}\n{text}\n" if follow else text))


@reads_source()
def check(
    source: SourceSpec,
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
        float, typer.Option(min=0.1, max=MAX_SPAN_S, help="Seconds without progress that make a room stuck.")
    ] = 10.0,
    min_ranks: Annotated[
        int,
        typer.Option(
            min=0, help="CRITICAL below this many live ranks (0: every rank listed by --connect or discovered)."
        ),
    ] = 0,
    max_gaps: Annotated[int, typer.Option(min=0, help="WARNING above this many lost event batches.")] = 0,
    window: Annotated[
        float, typer.Option(min=1.0, max=MAX_SPAN_S, help="Seconds of finished rooms the failure rate covers.")
    ] = 60.0,
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
        typer.Option(
            min=0.0, max=1e9, help="... and only when it fails at least this many rooms a minute (0: any rate)."
        ),
    ] = 0.0,
    incident_class: Annotated[
        list[str],
        typer.Option(
            metavar="CLASS=ROOMS",
            help="CLASS=ROOMS: a room threshold of its own for incidents of this class (CLASS=off: never "
            "CRITICAL, only WARNING), e.g. timeout_bootstrap=5. Repeat for several classes.",
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
    as_json: Json = False,
) -> None:
    """Health check for cron, Nagios/Icinga, Kubernetes exec probes and CI gates.

    Prints `KVTOP <STATUS> - <text> | <perfdata>` (or JSON) and exits 0 OK, 1 WARNING, 2 CRITICAL
    (including: a rank's scheduler crashed (its log says so), an incident ongoing, cluster unreachable, no
    agent answering, a rank gone, a rank kvtop could not open a socket for (its own open-files limit: named
    with the limit), failure rate, abort rate or stuck rooms over the limit), 3 UNKNOWN (bad arguments, a log
    or recording that cannot be read, an internal error: said on stdout, without perfdata). The first problem
    of an incident names its suspect:
    `KVTOP CRITICAL - incident: prefill-0/TP1 sends corrupt KV (checksum) since 10:02:11, 31 rooms | ...`.
    A rank listed (--connect, or by the bootstrap service) that does not answer within --wait is gone; one
    that answered is stale after 3 s of silence and gone after 10 s.
    With --sglang-log or --replay, check judges the span it reads (--since/--until; default the whole
    span): every incident in it counts, so logs that hold failures are never OK unless the thresholds say
    so; ranks from logs have no liveness and logs give no failure rate (they name no room that succeeded).
    With --model, the running dashboard's model is judged as it is (a rank that never answered it since it
    started is gone); a model that does not answer within --wait is CRITICAL, as a cluster that does not
    answer. A shortfall of live ranks (none listed, too few, none of a role) names the latest registration the
    bootstrap service refused that can explain it: one refused within --window (and, for `no decode rank
    alive`, a decode rank's). An agent alive but listed nowhere (its heartbeat says the service refuses its
    registration: no peer finds it) is CRITICAL; a sidecar's or plugin's rank so, WARNING.
    """
    from kvtop.views.check import Thresholds

    limits = Thresholds(
        max_failure_rate, max_stuck, stuck_after, min_ranks, max_gaps, window, max_abort_rate, incident_rooms,
        incident_rate, _class_thresholds(incident_class),
    )  # fmt: skip
    raise typer.Exit(run_check(source, limits, as_json))


def _class_thresholds(values: list[str]) -> tuple[tuple[str, int | None], ...]:
    """`--incident-class CLASS=ROOMS|off` into (class, rooms or None) pairs; a usage error names the bad one (a
    misspelt class would never take effect)."""
    from kvtop.model.suspects import BOOTSTRAP_ERROR
    from transport.errors import ReasonClass

    classes = list(dict.fromkeys([*(str(reason) for reason in ReasonClass), BOOTSTRAP_ERROR]))
    found: list[tuple[str, int | None]] = []
    for value in values:
        name, _, rooms = value.partition("=")
        if not name or not (rooms == "off" or (rooms.isdigit() and int(rooms) >= 1)):
            raise typer.BadParameter(f"{value!r} is not CLASS=ROOMS (ROOMS at least 1) or CLASS=off",
                                     param_hint="--incident-class")  # fmt: skip
        if name not in classes:
            raise typer.BadParameter(f"{name!r} is no class of failure (one of: {', '.join(classes)})",
                                     param_hint="--incident-class")  # fmt: skip
        found.append((name, None if rooms == "off" else int(rooms)))
    return tuple(found)


def run_check(spec: SourceSpec, limits: Thresholds, as_json: bool) -> int:
    """Judge the source against `limits`, print the verdict; returns its Nagios exit code."""
    from kvtop.attach.errors import ModelAmbiguous, ModelUnavailable
    from kvtop.model.cluster import ClusterModel
    from kvtop.source import SourceError, open_source
    from kvtop.views.check import evaluate, source_failing, unanswered, unknown, unreachable
    from transport.errors import BootstrapError

    try:
        with open_source(spec, ClusterModel(series=False)) as source, source.lock:  # a check reads no rate
            if source.damage:
                typer.echo(f"kvtop: {source.damage}", err=True)
            if nothing := source.nothing_to_judge():
                raise SourceError(nothing)
            window = source.span_window() if source.span else source.window(limits.window_s)
            limits = dataclasses.replace(limits, window_s=window)
            now = source.now()
            result = evaluate(source.model, limits, now, source.waited(), span=source.span, since=source.when.since,
                              transport_errors=source.transport_errors(0.0, now),
                              whole_cluster=spec.kind == "bootstrap", unread=source.partly_read(),
                              clocks=source.clocks_differ())  # fmt: skip
            if feed_error := source.feed_error():
                result = source_failing(result, feed_error)
    except BootstrapError as error:
        result = unreachable(spec.bootstrap, str(error))
    except ModelUnavailable as error:
        result = unanswered(str(error))
    except ModelAmbiguous as error:
        result = unknown(str(error))
    except SourceError as error:  # a log, a recording or a key folder that cannot be used
        result = unknown(str(error))
    except KeyboardInterrupt:  # stdout still says why, where monitoring reads it
        result = unknown("interrupted before the source was judged")
    except Exception as error:  # a check must answer UNKNOWN, never a traceback
        result = unknown(f"internal error: {error!r}")
    if threading.current_thread() is threading.main_thread():  # judged: a Ctrl-C cannot part the code from the line
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return print_verdict(result, limits, as_json)


def print_verdict(result: CheckResult, limits: Thresholds, as_json: bool) -> int:
    """Print a check's verdict on stdout, where monitoring systems read it (a Nagios line, or JSON); returns
    its exit code."""
    from kvtop.views.check import Verdict

    try:
        text = json.dumps(result.as_dict(), indent=2, allow_nan=False) if as_json else result.nagios(limits)
    except ValueError as error:
        typer.echo(f"KVTOP UNKNOWN - internal error: {error}")
        return int(Verdict.UNKNOWN)
    try:
        typer.echo(text)
    except BrokenPipeError:  # its reader went away: the verdict stands, and its code
        quiet_stdout()
    return int(result.verdict)


@reads_source()
def status(
    source: SourceSpec,
    window: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            max=MAX_SPAN_S,
            show_default=False,
            help="Seconds the rates and failures cover (less, and the output says so, where the agents' "
            "snapshots hold less: each keeps its last 512 rooms). Default 60; from --sglang-log the logs' "
            "whole span (from --since when given), as check judges it.",
        ),
    ] = None,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
) -> None:
    """One screen of cluster health: ranks, rooms, throughput, latency, failures, stuck rooms, links.

    A window the data does not fully cover is named by the span it does (`finished in the last 26s
    (snapshot history)`; JSON `span_s`, `span_limit`). From --sglang-log the window ends at the latest
    time the logs mention and, unless --window is given, covers the whole span they read, as check judges
    it; the logs' failed rooms stand in for a failure rate (logs name no room that succeeded; JSON
    `failure_rate` is null, `rooms_failed` counts them). Also counts what was rejected
    (events, frames) and the rooms retired as lost. Exit 1 when nobody answers.

    Also what was refused on the way in: bootstrap entries kvtop could not use (named), ranks it could not
    open a socket for (its own open-files limit, named with the limit: JSON `ranks.unreachable`,
    `collector.unreachable`), frames its collector rejected, registrations the bootstrap service refused
    (each client's latest of each role, named with its address; passed on by a relay), and ranks alive but
    listed nowhere a peer looks since the service refused their refresh (`unlisted LABEL (WHO MISSES IT): why`:
    no peer finds an agent's; a new view finds one only that the service lists as taken, its entry another
    client's). With --follow, exit 1 if the collector stops (its error on stderr).
    """
    from kvtop.views.tables import status_json, status_text

    with _until_ctrl_c():
        for read in _frames(source, follow, interval):
            now = read.now()
            whole = window is None and source.kind == "sglang-log"
            span = read.span_window() if whole else read.window(60.0 if window is None else window)
            text, data = status_text(read.model, now, span), status_json(read.model, now, span)
            line, fields = read.status_extra()
            if line:
                text += f"\n{line}"
                data.update(fields)
            _show(text, data, as_json, follow)


@reads_source()
def ranks(
    source: SourceSpec,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
) -> None:
    """Every rank: role, instance, liveness (alive/stale/gone, unheard behind a relay's dead upstream; log), host,
    pid, rooms in flight, origins, echoes, and the frames each of its sockets rejected (control, data, consensus,
    bootstrap, events, snapshot).

    An endpoint given by --connect that never answered is listed as a gone rank under its endpoint. A rank
    kvtop could not open a socket for (its own open-files limit) says so, and why (JSON `unreachable`). A
    rank whose refresh the bootstrap service refused after it started ends its row with `unlisted: ...`
    (JSON `unlisted`): alive to this view, but no peer finds it, nor a new view unless the service lists it as
    taken (its entry another client's). Exit 1 when nobody answers.
    """
    from kvtop.views.tables import ranks_json, ranks_text

    with _until_ctrl_c():
        for read in _frames(source, follow, interval):
            _show(ranks_text(read.model, read.now()), ranks_json(read.model, read.now()), as_json, follow)


@reads_source()
def rooms(
    source: SourceSpec,
    recent: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=MAX_SPAN_S,
            help="Also list the rooms that ended in this many seconds before now (0: open rooms only).",
        ),
    ] = 60.0,
    limit: Annotated[
        int,
        typer.Option(
            min=0, help="List this many rooms, those that want a look first (0: every one); --json lists every one."
        ),
    ] = 50,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
) -> None:
    """Open and recent rooms: those still open on some rank and those that ended in the last --recent seconds,
    the ones that want a look first: STUCK (open, no progress for 10 s), failed, open, succeeded; open rooms
    slowest first, ended ones newest first. Columns: outcome (open, succeeded, failed), STUCK, age, idle time,
    bytes, link, state per rank. Past --limit rooms a last line counts those left out. --json lists every room,
    open ones first, each oldest first.

    A room nobody said anything of for 5 minutes is retired as lost. From --sglang-log: every room the
    logs name (a log names a room only where it failed), Failed on each rank that logged its failure;
    ages as of the latest time the logs mention. Exit 1 when nobody answers.
    """
    from kvtop.views.tables import rooms_json, rooms_text

    with _until_ctrl_c():
        for read in _frames(source, follow, interval):
            data = rooms_json(read.model, read.now(), read.rooms_named_once_ended, recent)
            _show(rooms_text(data, limit), data, as_json, follow)


@reads_source()
def events(
    source: SourceSpec,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events (and lost batches) until Ctrl-C.")
    ] = False,
    level: Annotated[
        str,
        typer.Option(help="Lowest level shown: debug, info, warning, error (all but one line per failure are debug)."),
    ] = "info",
    debug: Annotated[bool, typer.Option("--debug", help="Show everything (as --level debug).")] = False,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", "--json", help="One JSON object per line (JSON Lines; --json is the same).")
    ] = False,
) -> None:
    """The event tail as log lines, in time order across agents: what every agent remembers (its snapshot), then,
    with --follow, live: each event half a second after it arrived, in time order with what other agents
    published meanwhile (an echo's origin, in another rank's later batch, is in before the echo's level is
    decided).

    Levels follow the fold: each failure group shows one line, its origin (else its earliest echo), at
    its level; every other member (the same failure seen by other ranks, propagated and cross-instance
    echoes) is debug. JSON Lines carry `level` (as shown) and `raw_level` (as the rank logged it).
    Live, agents the bootstrap address lists later are picked up; event batches that never arrived are
    a `gap` line (warning) each; events whose values make no sense are skipped and counted on stderr. Every
    agent quiet for 3 s (or --wait) is said on stderr, once, and again when one answers. Exit 1 when nobody
    answers. From --sglang-log: the failures and batch lines' queue depths (as
    heartbeats, debug) of the files, merged by time, then, with --follow, what they gain. With --model:
    the dashboard's own event tail (its journal), then, with --follow, what it gains, asked every second
    (lost batches counted on stderr).
    """
    from kvtop.source import Events, Gap
    from kvtop.views.event_lines import LEVELS, gap_json, gap_line, level_of, shown, to_json, to_line
    from kvtop.views.settling import Item, Settling

    level = "debug" if debug else level
    if level not in LEVELS:
        raise typer.BadParameter(f"{level!r} is not one of {', '.join(LEVELS)}", param_hint="--level")
    render, gap = (to_json, gap_json) if jsonl else (to_line, gap_line)

    def emit(read: Source, items: list[Item]) -> None:
        """Print what is shown of `items` (in time order), their failures' levels as the fold of the model's
        failures says."""
        if not items:
            return
        with read.lock:
            read.model.refold()
            leads = read.model.fold.leads
            for label, event in items:
                if shown(event, level, leads):
                    typer.echo(terminal_safe(render(label, event, level_of(event, leads))))

    rejected = 0
    heard = False
    try:
        with reading(source, tail=True) as read:
            if unheard := say_what_was_heard(read, follow):  # no event to show, read once
                raise fail(unheard)
            heard = True
            held = Settling()
            """Until it settled (following), a lost batch, or the end: so each failure's level is the whole
            fold's, its origin in (HOLD_S)."""
            quiet = SilenceSaid(read, source.wait, "kvtop", "following on: their events print as they come again")
            """A followed tail whose agents all went quiet says so on stderr: an empty tail is no quiet cluster."""
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C while following: what is held goes out first
                for told in read.tail(follow):
                    for item in told:
                        if isinstance(item, Events):
                            held.add(item.items)
                        elif isinstance(item, Gap):
                            emit(read, held.all())
                            if level != "error":
                                typer.echo(terminal_safe(gap(item.label, item.batches, item.ts)))
                        else:
                            typer.echo(terminal_safe(item.text), err=True)
                    if follow:
                        emit(read, held.settled())
                        quiet.check()
            emit(read, held.all())
            with read.lock:
                rejected = read.model.rejected + read.model.rejected_frames
    except KeyboardInterrupt:
        if not heard:
            raise fail("interrupted before the source answered", INTERRUPTED) from None
    if rejected:
        typer.echo(f"kvtop: {rejected} events or batches rejected (values out of range or malformed)", err=True)


@reads_source()
def failures(
    source: SourceSpec,
    debug: Annotated[bool, typer.Option("--debug", help="List every echo under its origin.")] = False,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
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
    from kvtop.views.failures import failures_json, not_kept, render_groups
    from kvtop.views.incidents import in_span, plural, render
    from kvtop.views.times import spans_days, stamp

    with _until_ctrl_c():
        for read in _frames(source, follow, interval):
            model, now, since = read.model, read.now(), read.when.since
            groups = model.groups()
            if since is not None:
                groups = [group for group in groups if group.first_ts >= since]
            context = read.context_for(groups)
            ids = [incident.id if (incident := model.incidents.incident_of(g)) else 0 for g in groups]
            start = (
                since
                if since is not None
                else read.start
                if read.start is not None
                else groups[0].first_ts
                if groups
                else now
            )
            summary = render(in_span(model, start, now), now, model.incidents.quiet_gap_s) + "\n\n"
            cut = not_kept(model, since)
            text = summary + render_groups(groups, debug, context, (cut, model.failures.maxlen or 0))
            _show(text, failures_json(groups, context, ids, cut), as_json, follow)
            aborted = sum(group.aborted for group in groups)
            roomless = sum(incident.roomless for incident in in_span(model, start, now))
            dated = spans_days([start, now])
            typer.echo(
                f"{plural(len(groups) - aborted, 'failure')}, {plural(aborted, 'client abort')}"
                + (f", {plural(roomless, 'failure')} naming no room (in the incidents above)" if roomless else "")
                + f" from {plural(len(model.ranks), 'rank')}, "
                f"{stamp(start, dated)[:-4]} to {stamp(now, dated)[:-4]} (what the agents' snapshots and the model "
                "keep, or the logs hold)",
                err=True,
            )


@reads_source()
def incidents(
    source: SourceSpec,
    debug: Annotated[
        bool, typer.Option("--debug", help="List each incident's failure groups under it, the earliest first.")
    ] = False,
    as_json: Json = False,
    follow: Follow = False,
    interval: Interval = 1.0,
) -> None:
    """What broke, where, since when, how bad: one line per incident, the ongoing first (the earliest on top).

    An incident is one cause seen across rooms: the failure groups of one suspect (what most likely broke:
    a rank, an instance, the other side of an instance, a decode host whose sessions failed together, the
    link between a room's two sides (a failed RDMA handshake), the client; `unknown` when nothing names one) and
    one kind of failure (corrupt KV, stopped answering, refusing, failing), close in time; it has ended
    after 120 s without a new failure group. Columns: state (ongoing/ended), suspect, what it does, the
    class of most of its failure groups, rooms, since, for (its first failure to its last: an ongoing
    incident of one burst is `0s`), origins (who noticed) / echoes,
    and the evidence for the suspect. Client aborts are an incident of `the client`, never of the cluster.
    Ranks that crashed (a log said so) are listed under the table.
    JSON: {"incidents": [{id, state, kind, class, first_class, classes, headline, suspect: {kind, name, role},
    suspect_text, evidence, client, rooms (every room id, as integers), room_count, roomless, rooms_complete,
    origins, echoes, noticed_by, first_seen, last_seen, duration_s, rooms_per_min}], ongoing, now, since,
    quiet_gap_s}. Exit 1 when nobody answers.
    """
    from kvtop.views.incidents import by_incident, counted, in_span, render, to_json
    from kvtop.views.tables import crash_lines

    with _until_ctrl_c():
        for read in _frames(source, follow, interval):
            model, now, since = read.model, read.now(), read.when.since
            kept = in_span(model, since, now)
            gap = model.incidents.quiet_gap_s
            groups = by_incident(model, model.groups()) if debug else None
            text = "\n".join([render(kept, now, gap, groups), *crash_lines(model, since)])
            _show(text, to_json(kept, now, gap, since), as_json, follow)
            typer.echo(terminal_safe(counted(kept, now, gap, read.start if read.span else None)), err=True)


def register(app: typer.Typer) -> None:
    app.command("incidents")(incidents)
    app.command("status")(status)
    app.command("ranks")(ranks)
    app.command("rooms")(rooms)
    app.command("events")(events)
    app.command("failures")(failures)
    app.command("check")(check)
