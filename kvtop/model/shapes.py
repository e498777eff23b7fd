"""What the cluster model holds, one record per rank, room and link, and the figures it answers with.

`ClusterModel` (kvtop.model.cluster) keeps and updates them; the views read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from kvtop.model.clock import ClockEstimate
from kvtop.model.histogram import DurationHistogram
from kvtop.model.timeline import Timeline
from kvtop.model.transfer_ring import TransferRing
from transport.kvpoll import TERMINAL, KVPoll
from transport.plane.events import LogFollowed
from transport.registration import TAKEN_SUFFIX
from transport.wire import LOG_SIDECAR, SGLANG_PLUGIN, label_parts, label_replica

STALE_S = 3.0
"""A rank silent this long (no batch; agents send a heartbeat every second) is stale."""
GONE_S = 10.0
RATE_WINDOW_S = 10.0
"""Seconds a rank's and a link's rate cover (what moves now, not the last minute's average: a rank gone has none)."""
RANK_TRANSFERS_KEPT = 4096
LINK_TRANSFERS_KEPT = 4096

FAILED, SUCCEEDED = int(KVPoll.Failed), int(KVPoll.Success)
_SUCCESS = frozenset((SUCCEEDED,))
POLLS = {int(state): state for state in KVPoll}
"""KVPoll members by value: a dict hit instead of the enum's call."""


class Liveness(StrEnum):
    ALIVE = "alive"
    STALE = "stale"
    GONE = "gone"
    LOG = "log"
    """A rank known from its server log: no heartbeat, so neither alive nor gone."""
    IDLE = "idle"
    """A log sidecar's rank: the sidecar beats, but the server's log has not grown for a while (the
    server is idle, or died: the log alone cannot tell) or is not there."""
    DOWN = "down"
    """A log sidecar's rank: the log is silent and the server's metrics endpoint does not answer."""
    UNHEARD = "unheard"
    """A rank a relay lists from the last answer of an upstream that stopped answering it, silent since (it would be
    stale or gone): the upstream's silence, not known to be the rank's (`ClusterModel.liveness` says it)."""


@dataclass
class RankView:
    """One rank as the model knows it."""

    label: str
    role: str
    instance: str
    rank: int
    host: str = ""
    pid: int = 0
    incarnation: int = 0
    last_seen: float = 0.0
    """Wall time of the last batch or snapshot from this rank."""
    inflight: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, dict[str, int]] = field(default_factory=dict)
    """Frames the rank's sockets rejected, by socket then reason (from its heartbeat)."""
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    origins: int = 0
    echoes: int = 0
    transfers: TransferRing = field(default_factory=lambda: TransferRing(RANK_TRANSFERS_KEPT))
    """This rank's finished transfers: (ts, bytes)."""
    from_log: bool = False
    """Known from a server log (kvtop.sources), not a live agent: liveness is `LOG`, origins are inferred."""
    history_since: float = 0.0
    """Its last snapshot's history (finished rooms, failures, transfers) was complete from this time on."""
    kind: str = ""
    """What publishes it (its registration or hello says so): "" a kvtop agent, `LOG_SIDECAR` a sidecar that
    publishes what a server log says, `SGLANG_PLUGIN` an SGLang scheduler through kvtop's plugin."""
    log: LogFollowed | None = None
    """A log sidecar's rank: the server log it follows (from its heartbeat)."""
    silences: list[tuple[float, float]] = field(default_factory=list)
    """Its latest `SILENCES_KEPT` silences of more than `STALE_S` (arrival times: since, until), an earlier
    incarnation's included: a stopped, starved, partitioned or restarted rank (the incidents' liveness)."""
    heard_before: float = 0.0
    """When an earlier incarnation of this rank was last heard (a restart's silence starts there)."""
    clock: ClockEstimate = field(default_factory=ClockEstimate)
    """Its clock against the collector's, from its envelopes: past `SKEWED_S` its times are corrected."""
    timeline: Timeline = field(default_factory=Timeline)
    """Its failures (origins, echoes) and bytes moved per bucket over the last minutes (the rank grid's trends)."""
    named_by: list[str] = field(default_factory=list)
    """Known only from these ranks' log lines, which name it as their peer (no log of its own was read): a prefill
    instance by its bootstrap address, its ranks, pid and counts unknown. Empty for every other rank."""
    last_sent: float = 0.0
    """The `sent_at` of its latest envelope (its own clock): a gap in arrivals that its sending shows no gap in
    was the collector's (frozen, starved), not its silence. Not kept by keyframes (after a restore, arrivals
    alone tell)."""
    registration: str = ""
    """Why the bootstrap service does not list it now, as its last heartbeat said ("" while it is registered)."""

    stage: int = field(init=False, default=0)
    """Its pipeline stage, as its label names it (0: the first, or a server without stages)."""
    replica: int | None = field(init=False, default=None)
    """Its DP replica, as its label names it (`prefill-0/DP1-TP0`; None: of none)."""

    def __post_init__(self) -> None:
        self.transfers.feed(self.timeline)
        label = self.label.removesuffix(TAKEN_SUFFIX)  # a rank heard as taken: of its own stage and replica
        parts = label_parts(label)
        self.stage = (parts[1] or 0) if parts else 0
        self.replica = label_replica(label)

    @property
    def sidecar(self) -> bool:
        """A log sidecar's rank."""
        return self.kind == LOG_SIDECAR

    @property
    def order(self) -> tuple[str, str, int, int, int]:
        """Where the views list it: by role, instance, DP replica (a rank of none first), pipeline stage, TP rank."""
        return (self.role, self.instance, -1 if self.replica is None else self.replica, self.stage, self.rank)

    @property
    def source(self) -> str:
        """What tells kvtop of it: `agent` (kvtop's own), `sglang` (an SGLang rank through kvtop's plugin) or `log`
        (a server log, read or followed by a sidecar)."""
        if self.kind == SGLANG_PLUGIN:
            return "sglang"
        return "log" if self.inferred else "agent"

    @property
    def inferred(self) -> bool:
        """Its failures come from a server log (a file read, or a sidecar): origins inferred, rooms named
        only where they failed."""
        return self.from_log or self.sidecar or self.log is not None

    def gbps(self, now: float, window_s: float) -> float:
        """Bytes this rank moved in finished transfers over the window, in GB/s: what moves now, so none for a rank
        not heard from for `STALE_S` (its silence tells nothing of what it moves)."""
        moved = self.transfers.per_second(now, window_s) / 1e9  # (read even so: it feeds the rank's timeline)
        return moved if now - self.last_seen <= STALE_S else 0.0

    def liveness(self, now: float) -> Liveness:
        if self.from_log:
            return Liveness.LOG
        age = now - self.last_seen
        if age > STALE_S:
            return Liveness.STALE if age <= GONE_S else Liveness.GONE
        log = self.log
        if log is not None and (log.idle or not log.exists):
            return Liveness.DOWN if log.metrics_error else Liveness.IDLE
        return Liveness.ALIVE


class RoomView(msgspec.Struct, gc=False):
    """One room across the ranks that reported it.

    A Struct the garbage collector never tracks (it holds no cycles): with 100k open rooms,
    every full collection would otherwise walk each of them again.
    """

    room: int
    first_seen: float
    last_progress: float
    codes: dict[str, int] = {}
    """KVPoll value per rank label. Plain ints, so CPython stops tracking the dict: enum members would
    make the garbage collector walk 100k of these dicts (100+ ms pauses in the dashboard). Replaced on
    every change, never changed in place: the dashboard draws rooms outside the model's lock."""
    bytes_total: int = 0
    bytes_done: int = 0
    touched_at: float = 0.0
    """When the model last heard of the room (arrival time, not event time: snapshots arrive late)."""
    link: tuple[str, str] = ("", "")
    """(prefill instance, decode instance), known once a decode rank reported the room."""
    outcome: bool | None = None
    """Set when the room is retired: True if it succeeded on every rank."""
    from_log: bool = False
    """Known from server logs, which name a room only where it failed: its outcome is no sample of a rate."""

    @property
    def states(self) -> dict[str, KVPoll]:
        """The state per rank label."""
        return {label: POLLS[code] for label, code in self.codes.items()}

    def finished(self, gone: frozenset[str] | set[str] = frozenset()) -> bool:
        """Every reporting rank that is not gone has ended the room (views ask this of 100k rooms per frame)."""
        live = [code for label, code in self.codes.items() if label not in gone] if gone else self.codes.values()
        return bool(live) and TERMINAL.issuperset(live)

    def succeeded(self, gone: frozenset[str] | set[str] = frozenset()) -> bool:
        """Every reporting rank that is not gone ended the room with Success."""
        live = [code for label, code in self.codes.items() if label not in gone] if gone else self.codes.values()
        return _SUCCESS.issuperset(live)

    def failed_somewhere(self) -> bool:
        """Some rank ended the room with Failed."""
        return FAILED in self.codes.values()


@dataclass
class LinkView:
    """One prefill instance -> decode instance pair."""

    transfers: int = 0
    """Transfers done by the decode ranks of the pair (a room over TP t counts t)."""
    nbytes: int = 0
    failed_rooms: int = 0
    recent: TransferRing = field(default_factory=lambda: TransferRing(LINK_TRANSFERS_KEPT))
    """The pair's latest transfers: (ts, bytes), for its rate over a window."""
    durations: DurationHistogram = field(default_factory=DurationHistogram)
    """Every transfer's duration, in buckets that only grow (the exporter's histogram)."""

    def gbps(self, now: float, window_s: float) -> float:
        return self.recent.per_second(now, window_s) / 1e9


@dataclass(frozen=True)
class Coverage:
    """The part of a window the model's finished rooms cover completely."""

    since: float
    span_s: float
    """Seconds from `since` to now: the window asked, or less."""
    limit: str = ""
    """What cut the window short: "snapshot history" (an agent's snapshot held less), "rooms kept"
    (the model's own bound), or "" (nothing: the whole window)."""


@dataclass(frozen=True)
class Outcomes:
    """How the rooms that finished in a window ended: `failed` by a cluster fault, `aborted` by a client
    (every failure of the room a client's abort or its echo), the rest succeeded."""

    finished: int = 0
    failed: int = 0
    aborted: int = 0
    first_ts: float = 0.0
    """When the first of them finished (the window's end when none did)."""

    @property
    def failure_rate(self) -> float:
        """Failed fraction of the rooms a client did not abort (client aborts are not cluster faults)."""
        judged = self.finished - self.aborted
        return self.failed / judged if judged else 0.0

    @property
    def abort_rate(self) -> float:
        """Fraction of the finished rooms a client aborted."""
        return self.aborted / self.finished if self.finished else 0.0


@dataclass(frozen=True)
class Rates:
    """What moved in a window: rooms/s, GB/s, latency percentiles (seconds) of finished transfers, and
    the failed fraction of the rooms that finished."""

    rooms_per_s: float
    gbps: float
    latency_p50: float
    latency_p90: float
    latency_p99: float
    failure_rate: float = 0.0
    finished: int = 0
    span_s: float = 0.0
    """Seconds the figures cover: the window, or less where the history held less (`Coverage`)."""
    per_s_over: float = 0.0
    """Seconds GB/s divides by (and latency covers): `span_s`, or less when the first transfer heard came later (a
    recording, a collector that just started)."""
    rooms_over: float = 0.0
    """Seconds `finished` covers and rooms/s divides by: `span_s`, or less when the first room heard to finish came
    later (a snapshot's rooms may reach further back than its transfers)."""


class Finished(msgspec.Struct, gc=False):
    """A retired room; a rank that reports it late can still turn it into a failure (untracked by the GC,
    like `RoomView`: 10k of them would otherwise be walked by every full collection)."""

    ts: float
    room: int
    ok: bool
    view: RoomView | None = None
    """The room as it was when retired (None for a room only a late rank reported)."""
    from_log: bool = False
    """A room known from logs only: left out of the failure rate (logs never name a room that succeeded)."""
