"""The model as Prometheus metrics, read at scrape time (a `prometheus_client` custom collector).

A scrape holds the model's lock only to copy what it reads, at C speed where it
is big (the failures the model took since the last scrape, a few numbers per
rank and link, the open rooms: their records, which the model replaces rather
than changes where it matters); folding, judging which rooms are stuck,
carrying and formatting happen after it lets go.
Names follow Prometheus's rules: one `kvtop_` prefix, base units (bytes,
seconds), `_total` on counters, ratios 0-1, `_info` for identity. Labels are
SGLang's where it has one (`engine_type` for the role, `tp_rank`, `pp_rank`, `dp_rank`); the
instance is `pd_instance`, since Prometheus itself sets `instance` on every
series it scrapes. No metric is labelled by room (unbounded: per-room detail
is the event stream's).

Incidents (one cause across rooms) are a gauge of those ongoing, by each one's class (that of most of its
failure groups, as its headline says) and its suspect's kind, and a counter of those started, by kind of
failure and suspect kind.

Label values are any peer's or log's bytes (an instance name, a host, a reason read from a log): each control
character in one is written as its escape (`\\x1b`), as the views write it, so `curl /metrics` in a terminal
runs no escape sequence.

Counters never go down while the process lives, although the model's windows
are bounded: failure origins and echoes are tallied as they arrive
(`FailureTally`), rooms as the model retires them (`retired_outcomes`), link
bytes and transfer durations as they arrive (`LinkView`), and a rank's own
rejection counters are carried across its restarts (`Carried`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kvtop import __version__
from kvtop.export.carry import Carried
from kvtop.export.tally import ABORT_ECHOES, ABORTS, ECHOES, ORIGINS, UNKNOWN, FailureTally
from kvtop.model.cluster import LINKS_NAMED_KEPT, STUCK_AFTER_S, ClusterModel
from kvtop.model.fold import Observed
from kvtop.model.intake import REFUSAL_RECENT_S
from kvtop.model.shapes import Liveness, RoomView
from kvtop.views.safe import one_line
from transport.config import Role
from transport.kvpoll import KVPoll
from transport.registration import TAKEN_SUFFIX

RANK = ("engine_type", "pd_instance", "tp_rank", "pp_rank", "dp_rank")
LINK = ("prefill_instance", "decode_instance")
FAILURE = ("engine_type", "pd_instance", "reason_class")
INCIDENT = ("reason_class", "suspect_kind")
INCIDENT_STARTED = ("kind", "suspect_kind")
ABORT = ("engine_type", "pd_instance")
OUTCOMES = ("succeeded", "failed", "aborted", "lost")
_ENDED = frozenset((int(KVPoll.Failed), int(KVPoll.Success)))


@dataclass
class _Rank:
    labels: tuple[str, str, str, str, str]
    host: str
    pid: int
    incarnation: int
    state: Liveness
    last_seen: float
    inflight: int
    crashed_at: float
    """When its scheduler crashed, as its log said (0: it did not)."""
    unlisted: bool
    """Its heartbeat says the bootstrap service refuses its registration (`RankView.registration`)."""


@dataclass
class _Link:
    labels: tuple[str, str]
    nbytes: int
    transfers: int
    failed_rooms: int
    buckets: list[tuple[str, int]]
    total_s: float


@dataclass
class _Reading:
    """What a scrape copied out of the model under its lock."""

    failures: list[Observed]
    ranks: list[_Rank]
    rejected: list[tuple[tuple[str, str, str, str, str, str, str], int, int]]
    """((engine_type, pd_instance, tp_rank, pp_rank, dp_rank, socket, reason), incarnation, count) per rank's socket
    counter."""
    links: list[_Link]
    outcomes: dict[str, int]
    sees_successes: bool
    """Some rank reports its transfers (an agent, SGLang's plugin): logs name no room that succeeded."""
    rooms: list[RoomView]
    """Every room the model holds (a list copy of its records): judged open or stuck after the lock."""
    gone: set[str]
    gaps: int
    events_rejected: int
    frames_rejected: dict[str, int]
    deliveries_failed: int
    source_error: str
    incidents: list[tuple[str, str, bool]]
    """(class, as its headline names it; suspect kind; ongoing) of every incident the model keeps."""
    incidents_started: dict[tuple[str, str], int]
    """Incidents ever started, by (kind of failure, suspect kind)."""
    refusals: list[str]
    """The role of each registration the bootstrap service refused in the last `REFUSAL_RECENT_S`."""


LINK_FAILED_KEPT = 4 * LINKS_NAMED_KEPT
"""Links whose failed rooms are exported after the model dropped them (a room moved to the link its own log names):
past this many, those series go (a reset to Prometheus, only on logs that move thousands of rooms)."""


class ModelMetrics(Collector):
    """Register with a `CollectorRegistry`; each scrape reads `model` under `lock` at `now()`."""

    def __init__(
        self,
        model: ClusterModel,
        lock: contextlib.AbstractContextManager[object],
        now: Callable[[], float] = time.time,
        source: str = "live",
        error: Callable[[], str] = lambda: "",
    ) -> None:
        """`source`: what feeds the model (`bootstrap`, `connect`, `sglang-log`, `embedded`), for
        `kvtop_exporter_info`; `error`: the source's own error now ("" while it is healthy)."""
        self.model = model
        self.lock = lock
        self.now = now
        self.source = source
        self.error = error
        self.tally = FailureTally()
        self._rejections: Carried[tuple[str, str, str, str, str, str, str]] = Carried()
        self._started: dict[tuple[str, str], int] = {}
        """The most incidents each (kind, suspect kind) ever counted as started."""
        self._link_failed: dict[tuple[str, str], int] = {}
        """The most failed rooms each link ever counted: a log's room a peer's line linked by address moves to the
        link its own log names (`ClusterModel._relink`), and a counter must not go down."""
        self._sees_successes = False
        """A rank that reports its transfers was heard once: `succeeded` has a series from then on."""
        self._one_scrape = threading.Lock()
        """The HTTP server answers each scrape on its own thread: the tally reads the model once per scrape."""
        self.last_lock_s = 0.0
        self.last_scrape_s = 0.0

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read the model (the families are known at scrape time)."""
        return []

    def collect(self) -> Iterator[Metric]:
        with self._one_scrape:
            families = self._scrape()
        yield from families

    def _scrape(self) -> list[Metric]:
        started = time.perf_counter()
        with self.lock:
            locked = time.perf_counter()
            now = self.now()
            reading = self._read(now)
            self.last_lock_s = time.perf_counter() - locked
        self.tally.add(reading.failures)
        families = [_printable(family) for family in self._families(reading, now)]
        self.last_scrape_s = time.perf_counter() - started
        return [
            *families,
            GaugeMetricFamily(
                "kvtop_scrape_duration_seconds",
                "Seconds this scrape took to read the model and build every family (the exporter's own cost).",
                value=self.last_scrape_s,
            ),
            GaugeMetricFamily(
                "kvtop_scrape_lock_seconds",
                "Seconds this scrape held the model's lock (the collector waits that long to apply events).",
                value=self.last_lock_s,
            ),
        ]

    def _read(self, now: float) -> _Reading:
        """Copy what the families need; runs under the model's lock, so it only copies."""
        model = self.model
        new = self.tally.unread(model.failures_total, len(model.failures))
        failures = list(itertools.islice(reversed(model.failures), new))[::-1]
        ranks: list[_Rank] = []
        gone = model.gone(now)  # as `model.open_rooms()` judges the rooms
        states = model.liveness(now)
        rejected: list[tuple[tuple[str, str, str, str, str, str, str], int, int]] = []
        for view in model.ranks.values():
            instance = (view.instance or UNKNOWN) + (TAKEN_SUFFIX if view.label.endswith(TAKEN_SUFFIX) else "")
            replica = "" if view.replica is None else str(view.replica)  # "": no label (a rank of no DP replica)
            labels = (view.role or UNKNOWN, instance, str(view.rank), str(view.stage), replica)  # a taker's: its own
            crash = model.crashes.get(view.label)
            ranks.append(_Rank(labels, view.host, view.pid, view.incarnation, states[view.label], view.last_seen,
                               view.inflight, crash.ts if crash is not None else 0.0,
                               bool(view.registration)))  # fmt: skip
            for socket, reasons in view.rejected.items():
                rejected.extend(((*labels, socket, reason), view.incarnation, n) for reason, n in reasons.items())
        links = [
            _Link(pair, link.nbytes, link.transfers, link.failed_rooms, *link.durations.read())
            for pair, link in model.links.items()
        ]
        counters = model.intake.counters
        gap = model.incidents.quiet_gap_s
        return _Reading(
            failures=failures,
            ranks=ranks,
            rejected=rejected,
            links=links,
            outcomes={**model.retired_outcomes, "lost": model.lost},
            sees_successes=any(not view.inferred for view in model.ranks.values()),
            rooms=list(model.rooms.values()),  # in memory order: 100k in 2 ms (by id, from the open set: 25 ms)
            gone=gone,
            gaps=model.gaps,
            events_rejected=model.rejected,
            frames_rejected={k.removeprefix("rejected_"): v for k, v in counters.items() if k.startswith("rejected_")},
            deliveries_failed=counters.get("deliveries_failed", 0),
            source_error=model.intake.error,
            incidents=[
                (i.title_class, i.suspect.kind, i.ongoing(now, gap)) for i in model.incidents.incidents.values()
            ],
            incidents_started=dict(model.incidents.started),
            refusals=[refused.role for refused in model.intake.refusals_since(now - REFUSAL_RECENT_S, now)],
        )

    def _families(self, reading: _Reading, now: float) -> Iterator[Metric]:
        info = InfoMetricFamily("kvtop_exporter", "The exporter: kvtop's version and what feeds its model.")
        info.add_metric([], {"version": __version__, "source": self.source})
        yield info
        error = reading.source_error or self.error()
        yield GaugeMetricFamily(
            "kvtop_source_up",
            "1 while the source keeps the model current; 0 once it stopped (the collector died; see kvtop's stderr).",
            value=0.0 if error else 1.0,
        )
        yield from self._failure_families()
        yield from self._incident_families(reading)
        yield from self._room_families(reading, now)
        yield from self._link_families(reading.links)
        yield from self._rank_families(reading)
        yield from self._intake_families(reading)

    def _failure_families(self) -> Iterator[Metric]:
        totals = self.tally.totals()
        helps = {
            ORIGINS: "Failure origins: one per failure group (each failure once, however many ranks saw it), "
            "by the origin's role, instance and reason class. Client aborts are counted apart.",
            ECHOES: "Failure echoes: one per failure folded under a group's origin (the same failure seen by "
            "another rank), by the echoing rank's role and instance and the origin's reason class.",
            ABORTS: "Client aborts (Aborted by AbortReq.): one per aborted room, by the first rank that recorded "
            "it. Not a cluster fault; never in the failure counters.",
            ABORT_ECHOES: "The same client abort recorded by the other ranks of its room.",
        }
        names = {ORIGINS: "kvtop_failure_origins", ECHOES: "kvtop_failure_echoes", ABORTS: "kvtop_client_aborts",
                 ABORT_ECHOES: "kvtop_client_abort_echoes"}  # fmt: skip
        for kind in (ORIGINS, ECHOES, ABORTS, ABORT_ECHOES):
            labels = FAILURE if kind in (ORIGINS, ECHOES) else ABORT
            family = CounterMetricFamily(names[kind], helps[kind], labels=labels)
            for (counted, *values), count in sorted(totals.items()):
                if counted == kind:
                    family.add_metric(values[: len(labels)], count)
            yield family
        yield CounterMetricFamily(
            "kvtop_failures_unfolded",
            "Failures the model forgot before a scrape folded them (more failures between two scrapes than "
            "the model keeps): not in the origin and echo counters.",
            value=self.tally.missed,
        )

    def _incident_families(self, reading: _Reading) -> Iterator[Metric]:
        """Incidents ongoing now (a gauge) and started (a counter: the most each key ever counted, so an incident
        that a refold took back, an echo's guess before its origin came, never makes it go down)."""
        ongoing = GaugeMetricFamily(
            "kvtop_incidents_ongoing",
            "Incidents ongoing (a failure group in the last quiet gap), by the class of most of each one's failure "
            "groups and its suspect's kind (rank, instance, host, side, link, client, unknown). Client aborts are "
            "suspect_kind client.",
            labels=INCIDENT,
        )
        for (reason_class, suspect_kind), count in sorted(
            Counter((c, k) for c, k, now_on in reading.incidents if now_on).items()
        ):
            ongoing.add_metric([reason_class, suspect_kind], count)
        yield ongoing
        for key, count in reading.incidents_started.items():
            self._started[key] = max(self._started.get(key, 0), count)
        started = CounterMetricFamily(
            "kvtop_incidents_started",
            "Incidents started (one cause across rooms: one suspect, one kind of failure, close in time), by the "
            "kind of failure (corrupt, unresponsive, refusing, failing, aborted) and the suspect's kind.",
            labels=INCIDENT_STARTED,
        )
        for (kind, suspect_kind), count in sorted(self._started.items()):
            started.add_metric([kind, suspect_kind], count)
        yield started

    def _room_families(self, reading: _Reading, now: float) -> Iterator[Metric]:
        finished = CounterMetricFamily(
            "kvtop_rooms_finished",
            "Rooms retired, by outcome: succeeded on every rank, failed by a cluster fault, aborted by a client, "
            "or lost (no rank said anything of it for 300 s). No succeeded series while only logs tell of the rooms "
            "(they name none that succeeded).",
            labels=["outcome"],
        )
        self._sees_successes = self._sees_successes or reading.sees_successes
        for outcome in OUTCOMES:
            if outcome != "succeeded" or self._sees_successes:
                finished.add_metric([outcome], reading.outcomes[outcome])
        yield finished
        cutoff, gone, ended = now - STUCK_AFTER_S, reading.gone, _ENDED.issuperset
        if gone:  # as `model.open_rooms()` judges them
            rooms = [room for room in reading.rooms if not room.finished(gone)]
        else:  # the same, inline: 100k rooms per scrape
            rooms = [room for room in reading.rooms if not ended(room.codes.values())]
        yield GaugeMetricFamily("kvtop_rooms_open", "Rooms some live rank has not ended.", value=len(rooms))
        yield GaugeMetricFamily(
            "kvtop_rooms_stuck",
            f"Open rooms with no progress for {STUCK_AFTER_S:g} s, whatever state their ranks claim.",
            value=sum(room.last_progress < cutoff for room in rooms),
        )

    def _link_families(self, links: list[_Link]) -> Iterator[Metric]:
        nbytes = CounterMetricFamily(
            "kvtop_link_transferred_bytes", "KV bytes decode ranks received, per prefill-decode link.", labels=LINK
        )
        transfers = CounterMetricFamily(
            "kvtop_link_transfers", "Transfers done, per link (a room over TP t counts t).", labels=LINK
        )
        failed = CounterMetricFamily("kvtop_link_failed_rooms", "Rooms that failed, per link.", labels=LINK)
        durations = HistogramMetricFamily(
            "kvtop_transfer_duration_seconds",
            "Seconds a successful room took on a decode rank, from its start to all of its KV arriving, per link.",
            labels=LINK,
        )
        for link in links:
            nbytes.add_metric(link.labels, link.nbytes)
            transfers.add_metric(link.labels, link.transfers)
            durations.add_metric(link.labels, link.buckets, link.total_s)
            self._link_failed[link.labels] = max(self._link_failed.get(link.labels, 0), link.failed_rooms)
        if len(self._link_failed) > LINK_FAILED_KEPT:  # hostile logs moving room after room: only the model's stay
            now_linked = {link.labels for link in links}
            self._link_failed = {labels: n for labels, n in self._link_failed.items() if labels in now_linked}
        for labels, rooms in self._link_failed.items():
            failed.add_metric(labels, rooms)
        yield from (nbytes, transfers, failed, durations)

    def _rank_families(self, reading: _Reading) -> Iterator[Metric]:
        info = InfoMetricFamily("kvtop_rank", "A rank's identity: host, pid, incarnation (new at every start).",
                                labels=RANK)  # fmt: skip
        state = GaugeMetricFamily(
            "kvtop_rank_state",
            "1 for the rank's state, 0 for the others: alive (heard within 3 s), stale, gone (silent 10 s, or "
            "listed and never heard), log (known from a server log: no liveness), unheard (silent behind a relay's "
            "upstream that stopped answering it).",
            labels=[*RANK, "state"],
        )
        seen = GaugeMetricFamily(
            "kvtop_rank_last_seen_timestamp_seconds", "When the rank was last heard from (Unix time).", labels=RANK
        )
        inflight = GaugeMetricFamily("kvtop_rank_inflight_rooms", "Rooms in flight on the rank.", labels=RANK)
        crashed = GaugeMetricFamily(
            "kvtop_rank_crash_timestamp_seconds",
            "When the rank's scheduler crashed, as its server log said (Unix time; no series for a rank that did not).",
            labels=RANK,
        )
        counts = Counter(rank.state for rank in reading.ranks)
        ranks = GaugeMetricFamily(
            "kvtop_ranks",
            "Ranks the model knows, by state (every state, 0 included: 0 in all while no agent answered, which an "
            "alert on the per-rank series, absent then, would not see).",
            labels=["state"],
        )
        for liveness in Liveness:
            ranks.add_metric([str(liveness)], counts[liveness])
        yield ranks
        yield GaugeMetricFamily(
            "kvtop_ranks_unlisted",
            "Ranks whose heartbeat says the bootstrap service refuses their registration (their entry taken once it "
            "expired, their endpoint no longer allowed): running, but no peer finds an agent's, nor a new view one "
            "refused for its endpoint (the service lists one whose entry another client holds as taken: views hear "
            "it).",
            value=sum(rank.unlisted for rank in reading.ranks),
        )
        unlisted = GaugeMetricFamily(
            "kvtop_rank_unlisted",
            "1 while the rank's heartbeat says the bootstrap service refuses its registration, else 0 "
            "(kvtop status names why).",
            labels=RANK,
        )
        for rank in reading.ranks:
            identity = {"host": rank.host, "pid": str(rank.pid), "incarnation": str(rank.incarnation)}
            info.add_metric(rank.labels, identity)
            for liveness in Liveness:
                state.add_metric([*rank.labels, str(liveness)], float(rank.state is liveness))
            if rank.last_seen:
                seen.add_metric(rank.labels, rank.last_seen)
            inflight.add_metric(rank.labels, rank.inflight)
            if rank.crashed_at:
                crashed.add_metric(rank.labels, rank.crashed_at)
            unlisted.add_metric(rank.labels, float(rank.unlisted))
        yield from (info, state, seen, inflight, crashed, unlisted)
        for key, incarnation, count in reading.rejected:
            self._rejections.update(key, incarnation, count)
        rejected = CounterMetricFamily(
            "kvtop_rank_frames_rejected",
            "Frames a rank's own sockets rejected (from its heartbeats), by socket and reason; summed across "
            "the rank's restarts.",
            labels=[*RANK, "socket", "reason"],
        )
        for key, count in sorted(self._rejections.totals().items()):
            rejected.add_metric(key, count)
        yield rejected

    def _intake_families(self, reading: _Reading) -> Iterator[Metric]:
        refusals = GaugeMetricFamily(
            "kvtop_bootstrap_refusals",
            f"Registrations the bootstrap service refused in the last {REFUSAL_RECENT_S:g} s (the latest of each "
            "client, per role), by the refused rank's role: prefill and decode always (0 included), unknown when the "
            "service did not say. kvtop status names them.",
            labels=["engine_type"],
        )
        roles = Counter(role or UNKNOWN for role in reading.refusals)
        for role in sorted(roles.keys() | {str(role) for role in Role}):
            refusals.add_metric([role], roles[role])
        yield refusals
        yield CounterMetricFamily(
            "kvtop_event_gaps", "Event batches that never arrived (sequence gaps per agent incarnation).",
            value=reading.gaps,
        )  # fmt: skip
        yield CounterMetricFamily(
            "kvtop_events_rejected",
            "Events whose values made no sense (a state that is no KVPoll value, a time that is no time): skipped, "
            "the rest of their batch or snapshot kept.",
            value=reading.events_rejected,
        )
        frames = CounterMetricFamily(
            "kvtop_frames_rejected", "Frames kvtop's collector refused to decode, by reason.", labels=["reason"]
        )
        for reason, count in sorted(reading.frames_rejected.items()):
            frames.add_metric([reason], count)
        yield frames
        yield CounterMetricFamily(
            "kvtop_deliveries_failed",
            "Deliveries the model could not apply (counted and logged with a traceback, never fatal).",
            value=reading.deliveries_failed,
        )


def _printable(family: Metric) -> Metric:
    """`family` with every label value's control characters (newlines too) written as their escapes."""
    for index, sample in enumerate(family.samples):
        if not all(value.isprintable() for value in sample.labels.values()):
            labels = {name: one_line(value) for name, value in sample.labels.items()}
            family.samples[index] = sample._replace(labels=labels)
    return family
