"""`kvtop check`: thresholds in, a Nagios verdict out (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).

A rank whose scheduler crashed (its server log says so: read, or followed by a sidecar) comes first,
CRITICAL, in the span read or the window. Then incidents: a cluster incident (client aborts apart) that is
ongoing (live), or that the span read holds (logs, a recording, `--since`), is CRITICAL when it reaches its
room and rate thresholds and WARNING below them; the first problem names its suspect. Then the ranks, the
failure and abort rates, stuck rooms, lost event batches.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from kvtop.model.cluster import ClusterModel
from kvtop.model.incidents import Incident
from kvtop.model.shapes import Liveness
from kvtop.views.incidents import duration, in_span, incident_json, incident_size, plural
from kvtop.views.safe import one_line
from kvtop.views.tables import refused_ago, unseen
from kvtop.views.times import seconds, spans_days, stamp
from transport.bootstrap import REFRESH_S
from transport.plane.events import LogContext

if TYPE_CHECKING:
    from kvtop.sources.sglang.context import Context

INCIDENTS_NAMED = 3
"""Incidents a verdict's text names (the biggest); the rest are counted."""
UNREACHABLE_NAMED = 5
"""Ranks kvtop could not open a socket for that a verdict's text names; the rest are counted."""
CRASHES_NAMED = 3
"""Crashed ranks a verdict's text names (the earliest); the rest are counted."""
REFUSALS_REFRESHED = 3
"""Refresh periods a refusal is recent for at least, whatever the window (a rank refused registers again each)."""
ERROR_ENDS = (90, 110)
"""Characters of a long transport error a verdict's text shows: its start (who logged it) and its end (what went
wrong, after the details: `... peer_nic: 10.0.0.7:15729@mlx5_0 ...): transport retry counter exceeded`)."""


class Verdict(IntEnum):
    """Nagios plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class Thresholds:
    max_failure_rate: float = 0.05
    """CRITICAL above this fraction of failed rooms in the window; WARNING above half of it."""
    max_stuck: int = 0
    stuck_after_s: float = 10.0
    min_ranks: int = 0
    """CRITICAL when fewer ranks are alive (0: every rank listed or discovered must be alive; log ranks never
    count). A rank is listed by `--connect` (until it answers, by its endpoint) or by the bootstrap service."""
    max_gaps: int = 0
    """WARNING when more event batches than this were lost."""
    window_s: float = 60.0
    max_abort_rate: float | None = None
    """CRITICAL above this fraction of rooms a client aborted; WARNING above half of it (None: no limit).
    Client aborts never count in the failure rate."""
    incident_rooms: int = 1
    """CRITICAL while a cluster incident of at least this many rooms is ongoing (WARNING below)."""
    incident_rate: float = 0.0
    """... that also fails at least this many rooms a minute (0: at any rate)."""
    incident_classes: tuple[tuple[str, int | None], ...] = ()
    """Room thresholds of their own for incidents of some classes (None: never CRITICAL, only WARNING)."""

    def rooms_needed(self, incident: Incident) -> int | None:
        """The rooms an incident needs to be CRITICAL (None: it never is)."""
        return dict(self.incident_classes).get(incident.title_class, self.incident_rooms)


@dataclass
class CheckResult:
    verdict: Verdict
    summary: str
    ranks_alive: int
    ranks_total: int
    ranks_stale: list[str]
    ranks_gone: list[str]
    rooms: int
    failure_rate: float | None
    """None where the source cannot tell (logs name no room that succeeded)."""
    stuck: int
    gaps: int
    top_origins: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ranks_log: int = 0
    """Ranks known from server logs: no liveness, left out of the rank rules."""
    aborted: int = 0
    """Client aborts (failure groups of class `aborted`) in the window: counted apart, never failures."""
    abort_rate: float | None = 0.0
    """Fraction of the rooms that finished in the window that a client aborted (None on logs: they name no room
    that succeeded, as for `failure_rate`)."""
    ranks_unanswered: list[str] = field(default_factory=list)
    """The gone ranks that never answered within the wait (the others were heard, then went silent)."""
    ranks_unreachable: list[str] = field(default_factory=list)
    """Ranks kvtop could not open a socket for (its own limits: too many open files); why is in `problems`."""
    lost: int = 0
    """Open rooms retired as lost (no news for the model's bound)."""
    rejected_events: int = 0
    rejected_frames: int = 0
    incidents: list[dict[str, Any]] = field(default_factory=list)
    """The cluster incidents judged (ongoing ones, or every one of the span read), biggest first."""
    judged: str = "now"
    """What was judged: `now` (a live source: ongoing incidents, the last window) or `span` (logs, a recording,
    `--since`: everything in the span read)."""
    rooms_failed: int = 0
    """Rooms that failed in the window (those known from logs included)."""
    clocks_skewed: dict[str, float] = field(default_factory=dict)
    """Ranks whose clock is off the collector's by `SKEWED_S` or more (seconds ahead; their times corrected)."""
    log_clocks: dict[str, float] = field(default_factory=dict)
    """Servers whose log's clock is off the first log's of their group (seconds ahead; their times corrected)."""
    ranks_crashed: dict[str, str] = field(default_factory=dict)
    """Ranks that crashed in what was judged -> what their log said (the exception, where raised)."""
    transport_errors: int = 0
    """Errors the transfer's own layers logged in what was judged (glog, UCX, `Session ... failed.`)."""
    ranks_unheard: list[str] = field(default_factory=list)
    """Silent ranks a relay lists from the last answer of an upstream that stopped answering it (not in
    `ranks_gone` or `ranks_stale`: their silence is the upstream's); the upstream is in `problems`."""
    facts: str = ""
    """What the summary says after its problems (not in the JSON: the summary holds it)."""
    ranks_unlisted: list[str] = field(default_factory=list)
    """Ranks alive to the check whose own heartbeat says the bootstrap service refuses their registration: no peer
    or new view finds them; why is in `problems`."""

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        del data["facts"]
        data["verdict"] = self.verdict.name
        data["exit_code"] = int(self.verdict)
        return data

    def nagios(self, limits: Thresholds) -> str:
        """`KVTOP STATUS - text | perfdata` (one line, as monitoring systems parse it); UNKNOWN has no perfdata
        (nothing was measured). The summary's text is the cluster's (names, reasons): control characters are
        written as escapes and `|` as `/`, so a peer cannot add a line or perfdata."""
        summary = one_line(self.summary).replace("|", "/")  # any peer's text: one line, and no perfdata of its own
        if self.verdict is Verdict.UNKNOWN:
            return f"KVTOP UNKNOWN - {summary}"
        rate_warn = limits.max_failure_rate / 2
        need = limits.min_ranks or self.ranks_total
        rate = "U" if self.failure_rate is None else f"{self.failure_rate:.4f}"  # U: Nagios' "undetermined"
        perf = (
            f"ranks_alive={self.ranks_alive};;{need}: rooms={self.rooms} "
            f"failure_rate={rate};{rate_warn:g};{limits.max_failure_rate:g} "
            f"stuck={self.stuck};;{limits.max_stuck} gaps={self.gaps};{limits.max_gaps} "
            f"incidents={len(self.incidents)} rooms_failed={self.rooms_failed} "
            f"aborted={self.aborted} abort_rate={'U' if self.abort_rate is None else f'{self.abort_rate:.4f}'}"
        )
        if limits.max_abort_rate is not None:
            perf += f";{limits.max_abort_rate / 2:g};{limits.max_abort_rate:g}"
        return f"KVTOP {self.verdict.name} - {summary} | {perf}"


def evaluate(
    model: ClusterModel,
    limits: Thresholds,
    now: float | None = None,
    waited_s: float = 0.0,
    span: bool = False,
    since: float | None = None,
    transport_errors: Sequence[Context] = (),
    whole_cluster: bool = False,
    unread: str = "",
    clocks: tuple[str, dict[str, float]] = ("", {}),
) -> CheckResult:
    """Judge the model against the thresholds; the worst problem sets the verdict, incidents first.

    `whole_cluster`: the ranks are a cluster's (a bootstrap service or a relay listed them), so a role none of
    whose ranks is alive while the other's are is CRITICAL: prefill ranks alone move no KV, and a rank the
    bootstrap service forgot (it keeps a dead one listed for 10 minutes; a restarted service knows none) would
    otherwise leave a check green on half a cluster. `unread`: what of the source could not be read (a log given
    that held nothing), a WARNING; so is `clocks`' finding (logs whose clocks differ, with each offset).
    A relay's upstream that stopped answering it (`Intake.upstream_down`) is the CRITICAL finding; the ranks it
    lists from that upstream's last answer that went silent are named with it, unheard, not gone or stale.

    A rank that never answered in the `waited_s` the check listened is gone; one that answered is judged by
    the model's own bounds (stale after `STALE_S` of silence, gone after `GONE_S`). With `span` (logs, a
    recording, `--since`), every incident from `since` (the whole span read when None) to `now` is judged as
    if it were ongoing: a span that holds a broken cluster is never OK."""
    now = time.time() if now is None else now
    model.update_incidents()
    everyone = model.liveness(now)
    liveness = {label: state for label, state in everyone.items() if state is not Liveness.LOG}
    alive = sorted(label for label, state in liveness.items() if state in (Liveness.ALIVE, Liveness.IDLE))
    down = sorted(label for label, state in liveness.items() if state is Liveness.DOWN)
    unheard = sorted(label for label, state in liveness.items() if state is Liveness.UNHEARD)
    stale = sorted(label for label, state in liveness.items() if state is Liveness.STALE)
    gone = sorted(label for label, state in liveness.items() if state is Liveness.GONE)
    unanswered = [label for label in gone if not model.ranks[label].last_seen]
    unreachable = sorted(label for label in model.intake.unreachable if label in everyone)
    outcomes = model.outcomes(now, limits.window_s)
    rate, rooms, abort_rate = outcomes.failure_rate, outcomes.finished, outcomes.abort_rate
    stuck = len(model.stuck(now, limits.stuck_after_s))
    recent = model.groups(now, limits.window_s)
    origins = [group.title for group in recent]
    aborted = sum(group.aborted for group in recent)
    critical: list[str] = []
    warning: list[str] = []
    need = limits.min_ranks or len(liveness)
    judged_from = (since or 0.0) if span else now - limits.window_s
    upstream_down = model.intake.upstream_down()
    if upstream_down:  # the ranks behind it are unheard, not known gone: one finding, not one per rank
        critical.append(upstream_down + (f"; ranks behind it unheard: {', '.join(unheard)}" if unheard else ""))
    crashed = _judged_crashes(model, now, judged_from)
    if crashed:
        dated = spans_days([crash.ts for crash in crashed.values()] + [now])
        named = [f"{label} crashed at {stamp(crash.ts, dated)[:-4]} ({crash.text})" for label, crash in crashed.items()]
        critical.extend(named[:CRASHES_NAMED])
        if len(named) > CRASHES_NAMED:
            critical.append(f"and {plural(len(named) - CRASHES_NAMED, 'more rank')} crashed")
    judged = _judged_incidents(model, now, span, since)
    judged.sort(key=lambda incident: not _severe(incident, limits))  # the ones that make it CRITICAL are named
    severe = [_severe(incident, limits) for incident in judged]
    for incident, is_severe in zip(judged[:INCIDENTS_NAMED], severe, strict=False):
        (critical if is_severe else warning).append(_incident_problem(incident, now, model.incidents.quiet_gap_s))
    if len(judged) > INCIDENTS_NAMED:
        more = f"and {plural(len(judged) - INCIDENTS_NAMED, 'more incident')}"
        (critical if any(severe[INCIDENTS_NAMED:]) else warning).append(more)
    unnamed = ""  # logs or a recording that name no rank: nothing to judge, unless what they hold says more
    if not everyone:
        if span:
            unnamed = "no rank named in what was read"
        else:
            critical.append("no ranks listed or discovered" + _refused(model, now, limits))
    if unreachable:
        why = model.intake.unreachable[unreachable[0]]
        more = f" and {len(unreachable) - UNREACHABLE_NAMED} more" if len(unreachable) > UNREACHABLE_NAMED else ""
        listed = ", ".join(unreachable[:UNREACHABLE_NAMED]) + more
        critical.append(f"kvtop could not open a socket for {plural(len(unreachable), 'rank')} ({why}): {listed}")
    if silent := [label for label in gone if label not in unreachable]:  # those are named above, with why
        named = [f"{label} (no answer in {waited_s:g}s)" if label in unanswered else label for label in silent]
        critical.append(f"ranks gone: {', '.join(named)}")
    if down:
        critical.append(f"servers down (log silent, metrics unanswered): {', '.join(down)}")
    if unlisted := [label for label in [*alive, *stale] if model.ranks[label].registration]:
        # an agent's peers resolve it through the service: it serves no new room; a sidecar's or a plugin's rank is
        # at most out of new views' sight (SGLang's own bootstrap pairs the servers; `unseen`)
        peers = [label for label in unlisted if model.ranks[label].source == "agent"]
        first = model.ranks[(peers or unlisted)[0]]
        problem = f"ranks unlisted ({unseen(first, 'them', 'their')}): {', '.join(unlisted)} ({first.registration})"
        (critical if peers else warning).append(problem)
    if liveness and len(alive) < need:  # unheard ranks are not alive (silence is never health), nor theirs to blame
        shortfall = f"{len(alive)} ranks alive, need {need}" + _behind(model, unheard)
        critical.append(shortfall + _refused(model, now, limits))
    if whole_cluster and alive:  # after the ranks that went: they say why, where the service still lists them
        roles = {model.ranks[label].role for label in alive}
        critical.extend(
            f"no {role} rank alive"
            + _behind(model, [label for label in unheard if model.ranks[label].role == role])
            + _refused(model, now, limits, role)
            for role in ("prefill", "decode")
            if role not in roles
        )
    if rate > limits.max_failure_rate:
        critical.append(f"failure rate {rate_above(rate, limits.max_failure_rate)}")
    elif rate > limits.max_failure_rate / 2:
        warning.append(f"failure rate {rate_above_half(rate, limits.max_failure_rate)}")
    if limits.max_abort_rate is not None:
        if abort_rate > limits.max_abort_rate:
            critical.append(f"abort rate {rate_above(abort_rate, limits.max_abort_rate)}")
        elif abort_rate > limits.max_abort_rate / 2:
            warning.append(f"abort rate {rate_above_half(abort_rate, limits.max_abort_rate)}")
    if stuck > limits.max_stuck:
        critical.append(f"{stuck} rooms stuck > {limits.stuck_after_s:g}s")
    if stale:
        warning.append(f"ranks stale: {', '.join(stale)}")
    if model.gaps > limits.max_gaps:
        warning.append(f"{model.gaps} event batches lost")
    skewed = model.skewed_clocks()
    if skewed:
        offsets = ", ".join(f"{label} {offset:+.1f}s" for label, offset in skewed.items())
        warning.append(f"clocks off (times corrected): {offsets}")
    if clocks[0]:
        warning.append(clocks[0])
    if unread:
        warning.append(unread)
    errors = [line for line in transport_errors if judged_from <= line.ts <= now]
    if errors:
        last = errors[-1]
        warning.append(
            f"{plural(len(errors), 'transport error')} in the logs, the last at {stamp(last.ts)[:-4]}: "
            + _ends(last.text.strip().partition("\n")[0])
        )
    verdict = (
        Verdict.CRITICAL if critical else Verdict.WARNING if warning else Verdict.UNKNOWN if unnamed else Verdict.OK
    )
    problems = [*critical, *(marked(warning) if critical else warning), *([unnamed] if unnamed else [])]
    coverage = model.coverage(now, limits.window_s)
    window = f"in {seconds(limits.window_s)}"
    if coverage.limit:
        window = f"in the last {seconds(coverage.span_s)} ({coverage.limit})"
    rooms_failed = model.rooms_failed(now, limits.window_s)
    measured = bool(liveness) and rooms > 0  # a rate of no room is none (perfdata U, JSON null), never 0
    if liveness and all(model.ranks[label].inferred for label in liveness):  # sidecars: logs, live
        facts = (
            f"{len(alive)}/{len(liveness)} ranks alive, {plural(rooms_failed, 'room')} failed {window}, "
            f"no failure rate (logs name no room that succeeded), {stuck} stuck, {model.gaps} gaps"
        )
    elif liveness:
        facts = (
            f"{len(alive)}/{len(liveness)} ranks alive, {plural(rooms, 'room')} {window}, "
            + (f"failure rate {rate:.1%}" if measured else "no failure rate (no room finished)")
            + f", {stuck} stuck, {model.gaps} gaps"
        )
    elif not everyone:  # a recording (or logs) that named none: nothing is said of logs it did not read
        facts = f"no rank, {plural(rooms_failed, 'room')} failed {window}"
    else:  # server logs: no liveness, and no room that succeeded
        facts = (
            f"{plural(len(everyone), 'rank')} from logs (no liveness in logs), "
            f"{plural(rooms_failed, 'room')} failed {window}, "
            "no failure rate (logs name no room that succeeded)"
        )
    facts += f", {plural(len(judged), 'incident')}" + ("" if span else " ongoing")
    if aborted:
        facts += f", {plural(aborted, 'client abort')}" + (f" ({abort_rate:.1%} of rooms)" if rooms else "")
    rejected = model.rejected + model.rejected_frames
    facts += f", {model.lost} rooms lost" if model.lost else ""
    facts += f", {rejected} rejected" if rejected else ""
    if recent:
        counted = sorted(Counter(origins).items(), key=lambda item: (-item[1], item[0]))  # the most rooms first
        facts += f"; origins in {seconds(limits.window_s)}: {', '.join(title for title, _ in counted[:3])}"
    summary = "; ".join([*problems, facts])
    gap = model.incidents.quiet_gap_s
    return CheckResult(
        verdict, summary, len(alive), len(liveness), stale, gone, rooms, rate if measured else None, stuck,
        model.gaps, sorted(set(origins)), problems, len(everyone) - len(liveness), aborted,
        abort_rate if measured else None,
        unanswered, unreachable, model.lost, model.rejected, model.rejected_frames,
        [incident_json(incident, now, gap) for incident in judged], "span" if span else "now", rooms_failed,
        {label: round(offset, 3) for label, offset in skewed.items()},
        {name: round(offset, 3) for name, offset in clocks[1].items()},
        {label: crash.text for label, crash in crashed.items()}, len(errors), unheard, facts, unlisted,
    )  # fmt: skip


def _behind(model: ClusterModel, unheard: list[str]) -> str:
    """` (2 unheard behind the relay at ADDR, whose upstream stopped answering)`: what a shortfall of live ranks
    owes to the relay's dead upstream, said of the relay, not of the ranks ("" when no rank is unheard)."""
    if not unheard:
        return ""
    return (
        f" ({len(unheard)} unheard behind the relay at {model.intake.upstream_relay}, whose upstream stopped answering)"
    )


def _refused(model: ClusterModel, now: float, limits: Thresholds, role: str = "") -> str:
    """`; the bootstrap service refused LABEL: why (from ADDR), 2s ago`: the latest registration the service refused
    that may be why a rank is missing (a rank refused is never listed): one refused within the window (a few refresh
    periods at least: a refused rank that goes on registering is refused every one) and, for a `role` none of
    whose ranks is alive, of that role; "" when none can explain it (an old refusal, another role's)."""
    within = max(limits.window_s, REFUSALS_REFRESHED * REFRESH_S)
    refused = model.intake.refusal_explaining(now, within, role)
    return f"; the bootstrap service refused {refused_ago(refused.line, now - refused.at)}" if refused else ""


def marked(warnings: list[str]) -> list[str]:
    """Warnings said beside CRITICAL problems, each marked as one (`warning: ranks stale: decode-0/TP1`)."""
    return [f"warning: {text}" for text in warnings]


def rate_above(rate: float, limit: float) -> str:
    """`7.3% > 5.0%`, with the digits that tell them apart (`5.02% > 5.00%`, never `5.0% > 5.0%`)."""
    digits = _digits(rate, limit)
    return f"{rate:.{digits}%} > {limit:.{digits}%}"


def rate_above_half(rate: float, limit: float) -> str:
    """`2.53% > 2.50% (half of the 5.00% limit)`: a rate over half its limit, which is a WARNING."""
    digits = _digits(rate, limit / 2)
    return f"{rate:.{digits}%} > {limit / 2:.{digits}%} (half of the {limit:.{digits}%} limit)"


def _digits(rate: float, limit: float) -> int:
    """The fewest digits after the point (1 to 4) that write `rate` and `limit` as percentages apart."""
    digits = 1
    while f"{rate:.{digits}%}" == f"{limit:.{digits}%}" and digits < 4:
        digits += 1
    return digits


def _ends(text: str) -> str:
    """`text`, or its start and its end around ` … ` when it is longer than `ERROR_ENDS` allows."""
    head, tail = ERROR_ENDS
    return text if len(text) <= head + tail + 3 else f"{text[:head]} … {text[-tail:]}"


def _judged_crashes(model: ClusterModel, now: float, start: float) -> dict[str, LogContext]:
    """The ranks that crashed from `start` to `now`, earliest first."""
    judged = [(label, crash) for label, crash in model.crashes.items() if start <= crash.ts <= now]
    return dict(sorted(judged, key=lambda item: item[1].ts))


def _judged_incidents(model: ClusterModel, now: float, span: bool, since: float | None) -> list[Incident]:
    """The cluster incidents a check judges, biggest first: those ongoing at `now`, or (`span`) every one that
    overlaps the span read."""
    gap = model.incidents.quiet_gap_s
    kept = [incident for incident in in_span(model, since, now) if not incident.client]
    judged = kept if span else [incident for incident in kept if incident.ongoing(now, gap)]
    return sorted(judged, key=lambda incident: (-incident.room_count, -incident.last_seen))


def _severe(incident: Incident, limits: Thresholds) -> bool:
    """Whether an incident reaches its room and rate thresholds (CRITICAL; WARNING below them)."""
    needed = limits.rooms_needed(incident)
    rooms = incident.room_count + incident.roomless  # a failure that named no room stands for one
    return needed is not None and rooms >= needed and incident.rooms_per_min >= limits.incident_rate


def _incident_problem(incident: Incident, now: float, quiet_gap_s: float) -> str:
    """`incident: prefill-0/TP1 sends corrupt KV (checksum) since 10:02:11, 31 rooms` (and when it ended)."""
    dated = spans_days([incident.first_seen, now])
    since = stamp(incident.first_seen, dated)[:-4]
    text = f"incident: {incident.headline()} since {since}, {incident_size(incident.room_count, incident.roomless)}"
    if not incident.ongoing(now, quiet_gap_s):
        text += f", ended after {duration(incident.duration_s)}"
    return text


def unreachable(bootstrap: str, error: str) -> CheckResult:
    """The verdict when the cluster cannot be asked at all: CRITICAL."""
    return unanswered(f"cluster unreachable at {bootstrap}: {error}")


def unanswered(summary: str) -> CheckResult:
    """The verdict when the source does not answer (a cluster, or a dashboard's model with `--model`):
    CRITICAL, with nothing judged: no rate (a rate of nothing is no 0), the summary its one problem."""
    return CheckResult(Verdict.CRITICAL, summary, 0, 0, [], [], 0, None, 0, 0, problems=[summary], abort_rate=None)


def unknown(summary: str) -> CheckResult:
    """The verdict when nothing could be judged (bad arguments, a source that cannot be read, an internal
    error): UNKNOWN, saying why where a monitoring system reads it."""
    return CheckResult(Verdict.UNKNOWN, summary, 0, 0, [], [], 0, None, 0, 0, problems=[summary], abort_rate=None)


def source_failing(result: CheckResult, problem: str) -> CheckResult:
    """`result`, CRITICAL first of all for `problem` (a dashboard's source that does not answer now, as a
    cluster that does not answer a check's own collector); a WARNING's problems are now said as warnings."""
    problems = [problem, *(marked(result.problems) if result.verdict is Verdict.WARNING else result.problems)]
    return replace(result, verdict=Verdict.CRITICAL, summary="; ".join([*problems, result.facts]),
                   problems=problems)  # fmt: skip
