"""`kvtop check`: thresholds in, a Nagios verdict out (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from enum import IntEnum

from kvtop.model.cluster import ClusterModel, Liveness


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


@dataclass
class CheckResult:
    verdict: Verdict
    summary: str
    ranks_alive: int
    ranks_total: int
    ranks_stale: list[str]
    ranks_gone: list[str]
    rooms: int
    failure_rate: float
    stuck: int
    gaps: int
    top_origins: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ranks_log: int = 0
    """Ranks known from server logs: no liveness, left out of the rank rules."""
    aborted: int = 0
    """Client aborts (failure groups of class `aborted`) in the window: counted apart, never failures."""
    abort_rate: float = 0.0
    """Fraction of the rooms that finished in the window that a client aborted."""
    ranks_unanswered: list[str] = field(default_factory=list)
    """The gone ranks that never answered within the wait (the others were heard, then went silent)."""
    lost: int = 0
    """Open rooms retired as lost (no news for the model's bound)."""
    rejected_events: int = 0
    rejected_frames: int = 0

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["verdict"] = self.verdict.name
        data["exit_code"] = int(self.verdict)
        return data

    def nagios(self, limits: Thresholds) -> str:
        """`KVTOP STATUS - text | perfdata` (one line, as monitoring systems parse it)."""
        rate_warn = limits.max_failure_rate / 2
        need = limits.min_ranks or self.ranks_total
        perf = (
            f"ranks_alive={self.ranks_alive};;{need}: rooms={self.rooms} "
            f"failure_rate={self.failure_rate:.4f};{rate_warn:g};{limits.max_failure_rate:g} "
            f"stuck={self.stuck};;{limits.max_stuck} gaps={self.gaps};{limits.max_gaps} "
            f"aborted={self.aborted} abort_rate={self.abort_rate:.4f}"
        )
        if limits.max_abort_rate is not None:
            perf += f";{limits.max_abort_rate / 2:g};{limits.max_abort_rate:g}"
        return f"KVTOP {self.verdict.name} - {self.summary} | {perf}"


def evaluate(model: ClusterModel, limits: Thresholds, now: float | None = None, waited_s: float = 0.0) -> CheckResult:
    """Judge the model against the thresholds; the worst problem sets the verdict.

    A rank that never answered in the `waited_s` the check listened is gone; one that answered is judged by
    the model's own bounds (stale after `STALE_S` of silence, gone after `GONE_S`)."""
    now = time.time() if now is None else now
    everyone = model.liveness(now)
    liveness = {label: state for label, state in everyone.items() if state is not Liveness.LOG}
    alive = sorted(label for label, state in liveness.items() if state in (Liveness.ALIVE, Liveness.IDLE))
    down = sorted(label for label, state in liveness.items() if state is Liveness.DOWN)
    stale = sorted(label for label, state in liveness.items() if state is Liveness.STALE)
    gone = sorted(label for label, state in liveness.items() if state is Liveness.GONE)
    unanswered = [label for label in gone if not model.ranks[label].last_seen]
    outcomes = model.outcomes(now, limits.window_s)
    rate, rooms, abort_rate = outcomes.failure_rate, outcomes.finished, outcomes.abort_rate
    stuck = len(model.stuck(now, limits.stuck_after_s))
    recent = model.groups(now, limits.window_s)
    origins = [group.title for group in recent]
    aborted = sum(group.aborted for group in recent)
    critical: list[str] = []
    warning: list[str] = []
    need = limits.min_ranks or len(liveness)
    if not everyone:
        critical.append("no ranks listed or discovered")
    if gone:
        named = [f"{label} (no answer in {waited_s:g}s)" if label in unanswered else label for label in gone]
        critical.append(f"ranks gone: {', '.join(named)}")
    if down:
        critical.append(f"servers down (log silent, metrics unanswered): {', '.join(down)}")
    if len(alive) < need:
        critical.append(f"{len(alive)} ranks alive, need {need}")
    if rate > limits.max_failure_rate:
        critical.append(f"failure rate {rate:.1%} > {limits.max_failure_rate:.1%}")
    elif rate > limits.max_failure_rate / 2:
        warning.append(f"failure rate {rate:.1%} > {limits.max_failure_rate / 2:.1%}")
    if limits.max_abort_rate is not None:
        if abort_rate > limits.max_abort_rate:
            critical.append(f"abort rate {abort_rate:.1%} > {limits.max_abort_rate:.1%}")
        elif abort_rate > limits.max_abort_rate / 2:
            warning.append(f"abort rate {abort_rate:.1%} > {limits.max_abort_rate / 2:.1%}")
    if stuck > limits.max_stuck:
        critical.append(f"{stuck} rooms stuck > {limits.stuck_after_s:g}s")
    if stale:
        warning.append(f"ranks stale: {', '.join(stale)}")
    if model.gaps > limits.max_gaps:
        warning.append(f"{model.gaps} event batches lost")
    verdict = Verdict.CRITICAL if critical else Verdict.WARNING if warning else Verdict.OK
    coverage = model.coverage(now, limits.window_s)
    span = (
        f"in {limits.window_s:g}s" if not coverage.limit else f"in the last {coverage.span_s:.0f}s ({coverage.limit})"
    )
    facts = (
        f"{len(alive)}/{len(liveness)} ranks alive, {rooms} rooms {span}, "
        f"failure rate {rate:.1%}, {stuck} stuck, {model.gaps} gaps"
    )
    if aborted:
        facts += f", {aborted} client aborts" + (f" ({abort_rate:.1%} of rooms)" if rooms else "")
    rejected = model.rejected + model.rejected_frames
    facts += f", {model.lost} rooms lost" if model.lost else ""
    facts += f", {rejected} rejected" if rejected else ""
    if recent:
        facts += f"; origins: {', '.join(sorted(set(origins))[:3])}"
    summary = "; ".join([*critical, *warning, facts])
    return CheckResult(
        verdict, summary, len(alive), len(liveness), stale, gone, rooms, rate, stuck, model.gaps,
        sorted(set(origins)), critical + warning, len(everyone) - len(liveness), aborted, abort_rate, unanswered,
        model.lost, model.rejected, model.rejected_frames,
    )  # fmt: skip


def unreachable(bootstrap: str, error: str) -> CheckResult:
    """The verdict when the cluster cannot be asked at all: CRITICAL."""
    return unanswered(f"cluster unreachable at {bootstrap}: {error}")


def unanswered(summary: str) -> CheckResult:
    """The verdict when the source does not answer (a cluster, or a dashboard's model with `--model`):
    CRITICAL, with nothing judged."""
    return CheckResult(Verdict.CRITICAL, summary, 0, 0, [], [], 0, 0.0, 0, 0)


def source_failing(result: CheckResult, problem: str) -> CheckResult:
    """`result`, CRITICAL first of all for `problem` (a dashboard's source that does not answer now, as a
    cluster that does not answer a check's own collector)."""
    return replace(result, verdict=Verdict.CRITICAL, summary=f"{problem}; {result.summary}",
                   problems=[problem, *result.problems])  # fmt: skip
