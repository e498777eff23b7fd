"""What one dashboard frame shows, read from the model under its lock (no Textual here).

A worker thread builds a `Frame` on the refresh timer; the app only draws it.
Everything that walks the model (100k rooms, 50k failures) happens here, off
the UI thread, and the fold is recomputed only when failures changed.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice
from operator import attrgetter
from typing import Any

import numpy as np

from kvtop.model.cluster import STUCK_AFTER_S, ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.model.incidents import Incident
from kvtop.model.intake import REFUSAL_RECENT_S
from kvtop.model.shapes import RATE_WINDOW_S, Liveness, RankView, RoomView
from kvtop.model.timeline import BYTES, ECHOES, ORIGINS, Timeline
from kvtop.tui.room_filter import FAILED, STUCK, RoomTexts
from kvtop.views.event_lines import at_or_above, to_line
from kvtop.views.incidents import incident_size, suspected_ranks
from transport.plane.events import Event

WINDOW_S = 60.0
"""Seconds the rates, failure rate and top origins cover."""
SLOW_EVERY_S = 2.0
"""Open and stuck rooms are counted over every open room: every 2 s, not every frame (stuck means 10 s idle)."""
GROUPS_SHOWN = 2000
"""The failures view lists the newest groups; older ones stay in `kvtop failures --json`."""
INCIDENT_LINES = 8
"""The overview's ongoing incidents (its panel is that many lines high, so a new one needs no layout pass)."""
EVENTS_SHOWN = 20_000
TREND_CELLS = 12
"""The cells of a rank's trends in the rank grid: the timeline's window in that many shares."""


class RoomSort(StrEnum):
    """Orders of the rooms view (the `s` key cycles them)."""

    AGE = "age"
    IDLE = "idle"
    BYTES = "bytes"
    ROOM = "room"


@dataclass(frozen=True)
class Health:
    """The cluster health line."""

    ranks_alive: int
    ranks_total: int
    ranks_from_logs: int
    rooms_open: int
    rooms_per_s: float
    gbps: float
    latency_p99_s: float
    failure_rate: float
    failures: int
    stuck: int
    gaps: int
    rejected: int = 0
    """Events the model skipped as nonsense (a state that is no KVPoll value) and frames the decoder refused."""
    lost: int = 0
    """Open rooms retired as lost (no news for the model's bound)."""
    rooms_failed: int = 0
    """Rooms that failed in the window, those known from logs included (logs give no failure rate)."""
    span_s: float = WINDOW_S
    """Seconds the rates and the failure rate cover: less than the window while the agents' snapshots,
    which hold their last few hundred rooms, are all the model has of its start."""
    aborted: int = 0
    """Client aborts in the window (failure groups of class `aborted`): apart from `failures`."""
    incidents_ongoing: int = 0
    """Cluster incidents (client aborts apart) ongoing at the frame's time."""
    ranks_crashed: int = 0
    """Ranks whose scheduler crashed and that have logged nothing since (`ClusterModel.crash_of`)."""
    ranks_unheard: int = 0
    """Silent ranks a relay keeps from an upstream that stopped answering it (`Liveness.UNHEARD`)."""
    ranks_idle: int = 0
    """Log sidecars' ranks whose log is silent (`Liveness.IDLE`: the server idle, or dead)."""
    ranks_down: int = 0
    """Log sidecars' ranks whose log and metrics are both silent (`Liveness.DOWN`)."""
    ranks_unlisted: int = 0
    """Ranks whose heartbeat says the bootstrap service refuses their registration (`RankView.registration`):
    running, but no peer finds an agent's (nor a new view, unless the service lists it as taken)."""
    refusals: int = 0
    """Registrations the bootstrap service refused in the last `REFUSAL_RECENT_S` (each client's latest, per
    role), as its listing says (`Intake.bootstrap_refusals`)."""
    refusal: str = ""
    """The latest of them, `name: why (from CLIENT...)` ("" when none)."""
    timed: bool = True
    """Some rank times its transfers (an agent's, an SGLang plugin rank's): False when every rank is known from
    server logs, files or sidecars (no rooms/s, throughput or latency: logs time no transfer)."""

    @property
    def of_logs(self) -> bool:
        """Every rank is read from server log files: their time is the logs', and no transfer is timed (no rates)."""
        return bool(self.ranks_total) and self.ranks_from_logs == self.ranks_total


@dataclass(frozen=True)
class IncidentRow:
    """One incident as the dashboard shows it (its rooms stay in the model: a frame carries no room list)."""

    id: int
    headline: str
    """`prefill-0/TP1 sends corrupt KV (checksum)`."""
    suspect: str
    kind: str
    reason_class: str
    rooms: int
    origins: int
    echoes: int
    first_seen: float
    last_seen: float
    ongoing: bool
    client: bool
    evidence: tuple[str, ...]
    """Why the suspect, the most said first."""
    noticed_by: tuple[str, ...]
    """Who noticed, the most first."""
    roomless: int = 0
    """Failures that named no room (a bootstrap server not reached): each stands for a room in the counts."""

    @classmethod
    def of(cls, incident: Incident, now: float, quiet_gap_s: float) -> IncidentRow:
        return cls(
            incident.id, incident.headline(), incident.suspect_text, incident.kind, incident.title_class,
            incident.room_count, incident.origins, incident.echoes, incident.first_seen, incident.last_seen,
            incident.ongoing(now, quiet_gap_s), incident.client, tuple(incident.evidence_lines()),
            _most_first(incident.noticed_by), incident.roomless,
        )  # fmt: skip

    @property
    def size(self) -> str:
        """`31 rooms`, `2 rooms and 3 failures naming none` (`views.incidents.incident_size`)."""
        return incident_size(self.rooms, self.roomless)

    def text(self) -> str:
        """What a filter matches an incident against: its headline, suspect, evidence and who noticed."""
        return f"{self.headline} {self.suspect} {' '.join(self.evidence)} {' '.join(self.noticed_by)}".lower()


def _most_first(counts: dict[str, int]) -> tuple[str, ...]:
    return tuple(name for name, _ in sorted(counts.items(), key=lambda item: -item[1]))


@dataclass(frozen=True)
class History:
    """The last minutes in fixed buckets (the overview's graphs), oldest first, the last holding the frame's now."""

    bucket_s: float
    origins: tuple[int, ...]
    echoes: tuple[int, ...]
    gbps: tuple[float, ...]
    """Decode-side GB/s over each bucket."""

    @classmethod
    def of(cls, timeline: Timeline, now: float) -> History:
        series = timeline.series(now)
        counts = series[:, (ORIGINS, ECHOES)].astype(np.int64).T.tolist()
        return cls(
            timeline.bucket_s,
            tuple(counts[0]),
            tuple(counts[1]),
            tuple((series[:, BYTES] / timeline.bucket_s / 1e9).tolist()),
        )

    @property
    def span_s(self) -> float:
        return self.bucket_s * len(self.origins)


@dataclass(frozen=True)
class Trend:
    """A rank's timeline in `TREND_CELLS` shares: GB/s (the share's mean), origins and echoes (its sums)."""

    gbps: tuple[float, ...] = ()
    origins: tuple[int, ...] = ()
    echoes: tuple[int, ...] = ()

    @classmethod
    def of(cls, timeline: Timeline, now: float) -> Trend:
        shares = timeline.series(now).reshape(TREND_CELLS, -1, 3).sum(axis=1)
        seconds = timeline.bucket_s * len(timeline.ids) / TREND_CELLS
        counts = shares[:, (ORIGINS, ECHOES)].astype(np.int64).T.tolist()
        return cls(tuple((shares[:, BYTES] / seconds / 1e9).tolist()), tuple(counts[0]), tuple(counts[1]))


@dataclass(frozen=True)
class RankRow:
    label: str
    role: str
    instance: str
    rank: int
    liveness: Liveness
    gbps: float
    inflight: int
    origins: int
    echoes: int
    cpu_percent: float
    rejected: int = 0
    """Frames the rank's sockets rejected (every socket and reason, from its heartbeat)."""
    trend: Trend = field(default_factory=Trend)
    """Its throughput and failures over the timeline's window."""
    source: str = "agent"
    """What tells kvtop of it: `agent`, `sglang` (an SGLang rank through kvtop's plugin) or `log`."""
    named_by_peers: bool = False
    """Known only from its peers' log lines (`RankView.named_by`): its in-flight rooms and failures unknown."""
    crashed: bool = False
    """Its log said its scheduler crashed, and has said nothing since (`ClusterModel.crash_of`)."""
    suspected: bool = False
    """An ongoing incident suspects it (as a rank, or its instance): what broke, where its ORIGINS say who noticed."""
    unlisted: str = ""
    """Why the bootstrap service does not list it, as its heartbeat says (`RankView.registration`; "" while listed)."""


@dataclass(frozen=True)
class Options:
    """What the user chose: filter text, faults only, room order."""

    filter: str = ""
    faults_only: bool = False
    sort: RoomSort = RoomSort.AGE
    level: str = "info"
    """Lowest event level the events view shows (echoes and room traffic are debug)."""


@dataclass(frozen=True)
class Replayed:
    """What the banner says of a frame built from the recording."""

    time: float
    playing: bool
    start: float
    end: float
    live: bool
    """A live session rewound (the live model keeps collecting), not a recording alone."""
    note: str = ""
    """The last move's news ("no later failure origin", "the recording starts at ...")."""
    inexact: bool = False
    """Something between the keyframe and `time` was lost: the model may differ from the collector's."""
    unrecorded: tuple[float, float] | None = None
    """The recorder did not run around `time` (from, to): the frame is the model as of `from`, its last instant
    recorded before, not ranks gone for the recorder's absence."""


@dataclass(frozen=True)
class Frame:
    """Everything the views draw, consistent as of `now`."""

    now: float
    health: Health
    history: History
    """Failures and throughput over the last minutes (the overview's graphs)."""
    ranks: list[RankRow]
    links: dict[tuple[str, str], tuple[float, int]]
    """(prefill instance, decode instance) -> (GB/s over the window, failed rooms)."""
    rooms: Sequence[RoomView]
    """Live and recently retired rooms, filtered and ordered as `options` say (read when drawn; from the model
    process: a `Page` around the list's scroll position)."""
    groups: list[FailureGroup]
    events: Sequence[tuple[str, Event, str]]
    incidents: list[IncidentRow] = field(default_factory=list)
    """The incidents the model keeps (those the filter matches), in `IncidentTracker.in_order`: ongoing first."""
    group_incidents: list[int] = field(default_factory=list)
    """The incident id of each of `groups` (0: in none the model keeps)."""
    """(agent label, event, the level it shows at: levels follow the fold), oldest first (a `Page`, as rooms)."""
    gone: frozenset[str] = frozenset()
    journaling: bool = True
    """Whether the model keeps recent events at all (`ClusterModel(journal_events=...)`)."""
    error: str = ""
    """The source's last error (bootstrap address not answering, say), or what the relay it subscribes through says
    of its upstreams that stopped answering it (`Intake.upstream_down`)."""
    options: Options = field(default_factory=Options)
    replay: Replayed | None = None
    """Set when the frame shows a recording (the dashboard rewound), not the live model."""
    read_at: float = 0.0
    """When the build read the model (`time.monotonic()`, the model's lock held): how old the data is."""

    def outcome(self, room: RoomView) -> bool | None:
        """True/False once every live rank ended the room (succeeded or not), None while it is open."""
        return outcome(room, self.gone)

    def stuck(self, room: RoomView) -> bool:
        return is_stuck(room, self.gone, self.now)


class FrameBuilder:
    """Builds frames from one model; keeps the last fold and the event tail so each frame does only new work.

    `clock` is the source's: wall time for a live cluster, the latest time the logs mention for logs. Every
    window, rate, age and liveness of a frame is as of it."""

    def __init__(
        self, model: ClusterModel, clock: Callable[[], float] = time.time, count_in_build: bool = True
    ) -> None:
        """`count_in_build=False`: the open and stuck rooms are counted when the owner calls `count_rooms()`
        (the model process does, after a frame went out), not by the build that falls due (a walk over every
        open room, ~60 ms at 100k, in that frame's data age); the first build counts them."""
        self.model = model
        self.clock = clock
        self.count_in_build = count_in_build
        self._counts = (0, 0)
        self._counted = (float("-inf"), float("nan"))
        """When the open and stuck rooms were last counted (`time.monotonic()`), and the source's now then."""
        self._tail_key: tuple[str, str] = ("", "")
        self._tail: deque[tuple[str, Event, str]] = deque(maxlen=EVENTS_SHOWN)
        self._tail_seen = 0
        self._texts = RoomTexts()
        """The rooms filter's text of each room, kept while a filter is typed."""
        self._matched: tuple[str, object, int, set[int]] = ("", None, 0, set())
        """The rooms filter's rooms failed with a matching reason: (filter, the failures scanned, how many of
        them by then, the rooms)."""

    def build(self, options: Options, now: float | None = None, error: str = "") -> Frame:
        """Call with the model's lock held; `now` overrides the clock."""
        read_at = time.monotonic()
        now = self.clock() if now is None else now
        model = self.model
        gone = frozenset(model.gone(now))
        states = model.liveness(now)
        groups = model.refold()
        recent_groups = model.fold.since(now - WINDOW_S)
        aborted = sum(group.aborted for group in recent_groups)
        gap = model.incidents.quiet_gap_s
        incidents = [IncidentRow.of(incident, now, gap) for incident in model.incidents.in_order(now)]
        suspected = suspected_ranks(model, now)
        if self._counted[0] == float("-inf") or (self.count_in_build and self.counts_due(now)):
            self.count_rooms(now)
        rooms_open, stuck = self._counts
        rates = model.rates(now, WINDOW_S)
        liveness = list(states.values())
        timed = not model.ranks or not all(view.inferred for view in model.ranks.values())  # logs alone time none
        refusals = model.intake.refusals_since(now - REFUSAL_RECENT_S, now)
        health = Health(
            ranks_alive=liveness.count(Liveness.ALIVE),
            ranks_total=len(liveness),
            ranks_from_logs=liveness.count(Liveness.LOG),
            rooms_open=rooms_open,
            rooms_per_s=rates.rooms_per_s,
            gbps=rates.gbps,
            latency_p99_s=rates.latency_p99,
            failure_rate=rates.failure_rate,
            failures=len(recent_groups) - aborted,
            stuck=stuck,
            gaps=model.gaps,
            rejected=model.rejected + model.rejected_frames,
            lost=model.lost,
            rooms_failed=model.rooms_failed(now, WINDOW_S) if not timed or Liveness.LOG in liveness else 0,
            span_s=rates.span_s,
            aborted=aborted,
            incidents_ongoing=sum(row.ongoing and not row.client for row in incidents),
            ranks_crashed=sum(model.crash_of(label, now) is not None for label in model.crashes),
            ranks_unheard=liveness.count(Liveness.UNHEARD),
            ranks_idle=liveness.count(Liveness.IDLE),
            ranks_down=liveness.count(Liveness.DOWN),
            ranks_unlisted=sum(bool(view.registration) for view in model.ranks.values()),
            refusals=len(refusals),
            refusal=max(refusals, key=attrgetter("at")).line if refusals else "",
            timed=timed,
        )
        shown, matched = _select(groups[-GROUPS_SHOWN:], incidents, model, options.filter)
        return Frame(
            now=now,
            health=health,
            history=self._history(now),
            ranks=[
                _rank_row(model, view, states[view.label], now, view.label in suspected)
                for view in sorted(model.ranks.values(), key=_rank_order)
            ],
            links=self._links(now),
            rooms=self._rooms(options, gone, now),
            groups=shown,
            events=self._events(options),
            incidents=matched,
            group_incidents=[incident.id if (incident := model.incidents.incident_of(g)) else 0 for g in shown],
            gone=gone,
            journaling=model.journaling,
            error=error or model.intake.upstream_down(),
            options=options,
            read_at=read_at,
        )

    def counts_due(self, now: float) -> bool:
        """The open and stuck rooms were counted `SLOW_EVERY_S` ago, or the source's clock went back."""
        counted_at, counted_now = self._counted
        return time.monotonic() - counted_at >= SLOW_EVERY_S or now < counted_now  # a log's clock may stand still

    def count_rooms(self, now: float) -> None:
        """Count the open and stuck rooms (call with the model's lock held)."""
        live = self.model.open_rooms(now)
        cutoff = now - STUCK_AFTER_S
        self._counts = (len(live), sum(1 for view in live if view.last_progress < cutoff))
        self._counted = (time.monotonic(), now)

    def _rooms(self, options: Options, gone: frozenset[str], now: float) -> list[RoomView]:
        """Live and recently retired rooms, filtered and in the order the options say."""
        rooms = [f.view for f in self.model.finished.values() if f.view is not None]
        rooms += self.model.rooms.values()
        if options.filter:  # before faults only: the texts kept are then those of every room
            needle = options.filter.lower()
            failed = self._failed_matching(needle)
            rooms = self._texts.matching(rooms, needle, lambda room, words: _flag(room, gone, now, words), failed)
        else:
            self._texts.clear()
        if options.faults_only:
            rooms = [r for r in rooms if outcome(r, gone) is False or is_stuck(r, gone, now) or r.failed_somewhere()]
        key, newest_first = _SORT_KEYS[options.sort]
        rooms.reverse()  # arrival order is nearly age order: the sort below has little left to do
        return sorted(rooms, key=key, reverse=newest_first)

    def _failed_matching(self, needle: str) -> set[int]:
        """Rooms with a failure whose reason or class holds `needle`; a frame scans only the failures new since
        the last one (all of those kept when the filter changed or the model's failures were replaced)."""
        failures, total = self.model.failures, self.model.failures_total
        filtered, scanned, seen, rooms = self._matched
        new = total - seen
        if needle != filtered or failures is not scanned or not 0 <= new <= len(failures):
            rooms, new = set(), len(failures)
        for failure in islice(reversed(failures), new):
            if needle in f"{failure.reason} {failure.reason_class}".lower():
                rooms.add(failure.room)
        self._matched = (needle, failures, total, rooms)
        return rooms

    def _history(self, now: float) -> History:
        self.model.transfers.flush()  # its waiting transfers' bytes into the timeline
        return History.of(self.model.timeline, now)

    def _links(self, now: float) -> dict[tuple[str, str], tuple[float, int]]:
        """Per prefill x decode pair: GB/s over `RATE_WINDOW_S`, and failed rooms (all of them)."""
        return {pair: (link.gbps(now, RATE_WINDOW_S), link.failed_rooms) for pair, link in self.model.links.items()}

    def _events(self, options: Options) -> list[tuple[str, Event, str]]:
        """The newest events at or above the level that match the filter, in time order, each with its level.

        Only deliveries journaled since the last frame are filtered, unless the level or filter changed; a
        failure's level follows the fold as it stood when the failure was first filtered (the fold is synced
        first, so it already holds the failure).
        """
        journal = self.model.journal
        needle = options.filter.lower()
        key = (options.level, needle)
        fresh = len(journal) if key != self._tail_key else min(len(journal), self.model.journal_total - self._tail_seen)
        if key != self._tail_key:
            self._tail_key = key
            self._tail.clear()
        self._tail_seen = self.model.journal_total
        found: list[tuple[str, Event, str]] = []
        leads = self.model.fold.leads
        for index in range(len(journal) - 1, len(journal) - 1 - fresh, -1):
            label, events = journal[index]
            kept = at_or_above(events, options.level, leads)
            if needle:
                kept = [(e, level) for e, level in kept if needle in to_line(label, e, level).lower()]
            found.extend((label, e, level) for e, level in kept)
            if len(found) >= EVENTS_SHOWN:
                break
        self._merge(sorted(reversed(found[:EVENTS_SHOWN]), key=_event_ts))
        return list(self._tail)

    def _merge(self, events: list[tuple[str, Event, str]]) -> None:
        """`events` (in time order) into the tail in time order: deliveries arrive in no time order across agents
        (a snapshot brings an agent's past after the others' live batches), so the tail's events later than the
        first new one are taken off and merged back (the newest `EVENTS_SHOWN` kept)."""
        tail = self._tail
        later: list[tuple[str, Event, str]] = []
        while tail and events and tail[-1][1].ts > events[0][1].ts:
            later.append(tail.pop())
        later.reverse()
        tail.extend(heapq.merge(later, events, key=_event_ts))


def _event_ts(item: tuple[str, Event, str]) -> float:
    return item[1].ts


def _rank_order(view: RankView) -> tuple[bool, str, int, int, int]:
    return (view.role != "prefill", *view.order[1:])


def _rank_row(model: ClusterModel, view: RankView, state: Liveness, now: float, suspected: bool = False) -> RankRow:
    gbps = view.gbps(now, RATE_WINDOW_S)  # (reads its ring: its waiting transfers' bytes reach its timeline)
    return RankRow(
        view.label, view.role, view.instance, view.rank, state, gbps, view.inflight, view.origins,
        view.echoes, view.cpu_percent, sum(sum(reasons.values()) for reasons in view.rejected.values()),
        Trend.of(view.timeline, now), view.source, bool(view.named_by), model.crash_of(view.label, now) is not None,
        suspected, view.registration,
    )  # fmt: skip


def outcome(room: RoomView, gone: frozenset[str]) -> bool | None:
    """How a room ended (True: succeeded on every live rank), None while some live rank has it open."""
    if room.outcome is not None:
        return room.outcome
    return room.succeeded(gone) if room.finished(gone) else None


def is_stuck(room: RoomView, gone: frozenset[str], now: float) -> bool:
    """Open, with no progress for `STUCK_AFTER_S`, whatever state it claims."""
    return now - room.last_progress > STUCK_AFTER_S and outcome(room, gone) is None


_SORT_KEYS: dict[RoomSort, tuple[Callable[[RoomView], Any], bool]] = {
    RoomSort.AGE: (attrgetter("first_seen"), True),
    RoomSort.IDLE: (lambda room: (room.outcome is not None or room.finished(), room.last_progress), False),
    RoomSort.BYTES: (attrgetter("bytes_total"), True),
    RoomSort.ROOM: (attrgetter("room"), False),
}
"""Per order: the key (C-level getters where they do: 100k rooms are sorted per frame) and whether it runs
high to low. Idle time puts open rooms first: a finished room's idle time says nothing."""


def _flag(room: RoomView, gone: frozenset[str], now: float, words: tuple[str, ...]) -> str:
    """The room's word among `words` that a filter finds a stuck or failed room by ("" when none): judged at
    each frame, as it moves with the clock (the idle time, cheap, is read before the ranks' states)."""
    idle = STUCK in words and now - room.last_progress > STUCK_AFTER_S
    if not idle and FAILED not in words:
        return ""
    ended = outcome(room, gone)
    if ended is None:
        return STUCK if idle else ""
    return FAILED if ended is False and FAILED in words else ""


def _select(
    groups: list[FailureGroup], incidents: list[IncidentRow], model: ClusterModel, needle: str
) -> tuple[list[FailureGroup], list[IncidentRow]]:
    """The groups and incidents a filter matches: a group by its room, origin, reason and every echo (rank and
    reason), or by its incident; an incident by its suspect, headline, evidence and who noticed, or by a group."""
    if not needle:
        return groups, incidents
    needle = needle.lower()
    matched = {row.id for row in incidents if needle in row.text()}
    shown = [
        group
        for group in groups
        if needle in group_text(group)
        or ((incident := model.incidents.incident_of(group)) is not None and incident.id in matched)
    ]
    held = {incident.id for group in shown if (incident := model.incidents.incident_of(group)) is not None}
    return shown, [row for row in incidents if row.id in matched or row.id in held]


def group_text(group: FailureGroup) -> str:
    """What a filter matches a failure group against: room, origin, class, reason, and every echo's rank and
    reason (so a filter on the rank that broke finds the groups it echoes in)."""
    echoes = " ".join(f"{echo.rank} {echo.reason}" for echo in group.echoes)
    return f"{group.room} {group.title} {group.origin.reason if group.origin else ''} {echoes}".lower()
