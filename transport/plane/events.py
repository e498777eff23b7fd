"""The event plane's records: what every agent publishes about its rooms, and their envelope.

Frames (the PUB socket of every agent; the snapshot ROUTER beside it)::

    events    PUB (bound by each agent; an XPUB serving whole-stream subscriptions only) -> SUB (kvtop, any)
        [EventBatch]        version byte + msgpack, like every control frame (see wire.py)
    snapshot  ROUTER (bound by each agent) <- DEALER (a subscriber joining late)
        request [SnapshotRequest]   reply [Snapshot]
    relay     XPUB and ROUTER (bound by a relay): the same frames, passed through untouched (see relay.py)

A log sidecar (`kvtop agent --sglang-log`) publishes a server log's ranks on the same sockets: its
`AgentInfo.kind` is `log_sidecar`, its heartbeats carry `log` (`LogFollowed`), and it sends `LogContext`
events beside its failures.

`EventBatch.seq` grows by one per batch of one incarnation; a subscriber that
sees seq jump counts a gap. A `Snapshot` holds the agent's state as of one seq:
apply it, then every batch with a larger seq (ZeroMQ guide's Clone pattern).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from transport.wire import MAX_COUNT, AgentInfo, RankLabel, ReasonText, RoomId, ShortText, Stage, rank_label

EVENT_SCHEMA = 1
"""Bumped when a record changes incompatibly; new fields get defaults instead."""


MAX_TS = 1e10
"""The latest timestamp an event may carry (the year 2286)."""
MAX_SECONDS = 1e9
"""The longest duration an event may carry."""
Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TS)]
"""Seconds since the epoch, up to `MAX_TS`: the decoder refuses NaN and infinity (they fail every bound)."""
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
MAX_PERCENT = 1e6
Percent = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_PERCENT)]
"""A percentage, up to `MAX_PERCENT` (a process's CPU may exceed 100 on several cores)."""
State = Annotated[int, msgspec.Meta(ge=0, le=4)]
"""A `KVPoll` value, as a plain int (the model's hot loop wants ints, not enum members)."""
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
COUNTERS_MAX = 1024
"""Counters one heartbeat may carry (an agent has about a hundred; more is a malformed frame)."""
CounterTable = Annotated[dict[ShortText, int], msgspec.Meta(max_length=COUNTERS_MAX)]
MetricValue = Annotated[float, msgspec.Meta(ge=-1e18, le=1e18)]
"""A scraped metric's value: a finite number (NaN and infinity fail the bounds)."""


class Level(StrEnum):
    """SGLang's levels after PR #27534: origins at error (decode) or warning (prefill), echoes at debug."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


HOOK_TARGETS_MAX = 64
HookTargets = Annotated[list[ReasonText], msgspec.Meta(max_length=HOOK_TARGETS_MAX)]


class PluginHooks(msgspec.Struct, array_like=True, frozen=True):
    """What the SGLang plugin of a rank hooked, in that rank's hello."""

    sglang_version: ShortText
    hooked: HookTargets
    """The dotted targets hooked (SGLang's classes and methods)."""
    skipped: HookTargets = []
    """Targets this SGLang version does not have (or that failed to import), each with why."""


class AgentHello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    """Who the agent is; sent first by every incarnation and again with each heartbeat's snapshot."""

    ts: Timestamp
    agent: AgentInfo
    version: ShortText
    event_endpoint: ReasonText
    snapshot_endpoint: ReasonText
    hooks: PluginHooks | None = None
    """Set by an SGLang rank's plugin: what it hooked and skipped."""


LOG_METRICS_MAX = 64
"""Scraped metrics one heartbeat may carry (the sidecar knows a dozen names; more is a malformed frame)."""


class LogFollowed(msgspec.Struct, array_like=True, frozen=True):
    """What a log sidecar (`kvtop agent --sglang-log`) says of the server log it follows, in each heartbeat."""

    path: ReasonText
    exists: bool
    """False while the file is not there (yet): the sidecar waits for it."""
    position: Count
    """Bytes read of the file now followed (it starts again at 0 after a rotation)."""
    size: Count
    lines: Count
    garbled: Count
    """Lines that hold a marker but not the shape of their kind, or that are not text: counted, skipped."""
    rotations: Count
    silent_s: Seconds
    """Seconds since the file last grew (since the sidecar started, when it never did)."""
    idle: bool
    """Silent for longer than the sidecar's idle threshold: the server is idle, or died."""
    damaged: ReasonText = ""
    metrics_url: ReasonText = ""
    """The server's Prometheus endpoint the sidecar scrapes ("" when none was given)."""
    metrics: Annotated[dict[RankLabel, MetricValue], msgspec.Meta(max_length=LOG_METRICS_MAX)] = {}
    """Scraped metrics that moved (non-zero or changed once); a metric absent here has no data."""
    metrics_error: ReasonText = ""
    """Why the last scrape failed ("" when it answered, or none was made)."""


CONTEXT_TEXT_MAX = 16_384


class LogContext(msgspec.Struct, tag="context", array_like=True, frozen=True):
    """A log line that explains failures near it (a session, a NIXL error, a traceback, a glog line)."""

    ts: Timestamp
    kind: Annotated[str, msgspec.Meta(max_length=32)]
    room: RoomId | None
    text: Annotated[str, msgspec.Meta(max_length=CONTEXT_TEXT_MAX)]
    """The line (a traceback: its lines), at most `CONTEXT_TEXT_MAX` characters (a sidecar cuts it)."""
    tp: int | None = None


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True, frozen=True):
    """About once a second: counters, rooms in flight (not ended on this rank), host load, events this agent
    dropped."""

    ts: Timestamp
    counters: CounterTable
    inflight_rooms: Count
    events_dropped: Count
    cpu_percent: Percent
    rss_bytes: Count
    host_memory_percent: Percent
    snapshot_endpoint: ReasonText = ""
    """Where to ask for a snapshot (a subscriber given only the event endpoint learns it here)."""
    rejected: Annotated[dict[ShortText, CounterTable], msgspec.Meta(max_length=64)] = {}
    """Frames this agent's sockets rejected, by socket (control, data, consensus, bootstrap, snapshot), then
    reason (malformed, unknown_version, oversize, truncated, unexpected, invalid)."""
    log: LogFollowed | None = None
    """Set by a log sidecar: the server log it follows (None for an agent that moves KV itself)."""
    registration: ReasonText = ""
    """Why the bootstrap service does not list this rank now, as the rank last heard it: its refresh refused (its
    entry taken by another client once it expired, an endpoint no longer allowed) or, for a sidecar's or plugin's,
    unanswered; "" while it is registered. A view says it: the rank is alive, but no peer finds it, nor a new view
    unless the service lists it as taken (`registration.refused_as_taken`)."""


class RoomState(msgspec.Struct, tag="room", array_like=True, frozen=True):
    """A room changed state on this rank (`peer`: the prefill instance, on decode ranks).

    Failed may follow Success: the rank finished its part, then its instance failed the room.
    """

    ts: Timestamp
    room: RoomId
    state: State
    previous: State
    peer: RankLabel = ""
    bytes_total: Count = 0


class Progress(msgspec.Struct, tag="progress", array_like=True, frozen=True):
    """Bytes moved so far in a room (at most a few per second per room)."""

    ts: Timestamp
    room: RoomId
    bytes_done: Count
    bytes_total: Count


class TransferDone(msgspec.Struct, tag="done", array_like=True, frozen=True):
    """A room succeeded on this rank: bytes moved and seconds since it started."""

    ts: Timestamp
    room: RoomId
    nbytes: Count
    seconds: Seconds
    peer: RankLabel = ""


class Failure(msgspec.Struct, tag="failure", array_like=True, frozen=True):
    """A room failed on this rank. `origin` names the rank that observed it first; an origin's `suspect` names
    what it knows most likely broke (a rank label, an instance, `client`; "" when it cannot tell); an echo carries
    what its origin named and, in `origin_class`, the `reason_class` its origin recorded, when it learnt them."""

    ts: Timestamp
    room: RoomId
    rank: RankLabel
    reason: ReasonText
    """At most `TEXT_MAX` characters: whoever makes a failure of longer text cuts it (`wire.cut_text`)."""
    reason_class: ShortText
    level: ShortText
    is_from_another_rank: bool
    origin: RankLabel
    suspect: RankLabel = ""
    origin_class: ShortText = ""
    """An echo's: the class its origin recorded ("" when unknown, and on an origin: its `reason_class`)."""


class AbortEvent(msgspec.Struct, tag="abort", array_like=True, frozen=True):
    """An ABORT this rank sent (decode) or received (prefill) for a room."""

    ts: Timestamp
    room: RoomId
    direction: ShortText
    peer: RankLabel
    origin: RankLabel


Event = AgentHello | Heartbeat | RoomState | Progress | TransferDone | Failure | AbortEvent | LogContext


class EventBatch(msgspec.Struct, tag="batch", array_like=True, frozen=True):
    """The envelope: one agent incarnation's events `seq`, in order."""

    schema: int
    role: ShortText
    instance: RankLabel
    rank: int
    incarnation: int
    seq: int
    sent_at: Timestamp
    events: list[Event]
    pp: Stage | None = None
    """The agent's pipeline stage past the first (`AgentInfo.pp`): two stages' TP3 are two streams."""
    dp: Stage | None = None
    """The agent's DP replica (`AgentInfo.dp`, bounded as a stage): two replicas' TP0 are two streams. Trailing
    fields: a reader that knows neither reads the rest of the batch as before (and labels a later stage's or a
    replica's batch as the plain rank's), an older agent's batch is of no stage or replica."""

    @property
    def label(self) -> str:
        """The agent's label, as its `AgentInfo.label` (`prefill-0/TP1`, `prefill-0/PP1-TP1`, `prefill-0/DP1-TP0`)."""
        return rank_label(self.instance, self.rank, self.pp, self.dp)


class SnapshotRequest(msgspec.Struct, tag="snap_req", array_like=True):
    req_id: int
    agent: Annotated[str, msgspec.Meta(max_length=256)] = ""
    """Whose snapshot, when the request goes to a relay (the agent's label); an agent ignores it."""


class Snapshot(msgspec.Struct, tag="snapshot", array_like=True):
    """An agent's state as of `seq`: live rooms, recent finished rooms and failures, last heartbeat."""

    req_id: int
    schema: int
    incarnation: int
    seq: int
    hello: AgentHello | None
    heartbeat: Heartbeat | None
    live_rooms: list[RoomState]
    finished_rooms: list[RoomState]
    failures: list[Failure]
    progress: list[Progress] = []
    """The latest progress of each live room (so a late reader can tell stuck from slow)."""
    transfers: list[TransferDone] = []
    """The most recent finished transfers (so a late reader sees rates and latencies at once)."""
    history_since: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)] = 0.0
    """The finished rooms, failures and transfers above are complete from this time on: the time of the
    oldest one kept once the bounded history dropped one (0: nothing dropped since the agent started)."""
    context: list[LogContext] = []
    """A log sidecar's latest context lines (so a late reader shows them beside the failures)."""
    sent_at: Timestamp = 0.0
    """When the agent sent it, by its clock (0: an agent older than this field); batches carry theirs too."""
    cut: Count = 0
    """Entries left out so the snapshot fits a frame (the oldest of its histories first; see frame_budget.py):
    `history_since` then names the oldest kept."""
