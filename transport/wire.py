"""The wire format of every transport socket, documented once.

Every control frame is one byte of wire version followed by a msgpack array
whose first element is the message tag (msgspec tagged Structs, never pickle).
Bulk KV bytes travel as raw frames after a `Chunk` header.

Sockets and their frames (ROUTER sockets see the peer's routing id first)::

    bootstrap  ROUTER (bound by the bootstrap service) <- DEALER (every agent, kvtop)
        request   [Register | Deregister | Resolve | ListAgents]
        reply     [Registered | Route | AgentList | Refusal]
        An agent sends Register again every `REFRESH_S`; an entry not refreshed for the
        service's TTL expires, and Deregister (clean exit) drops it at once. A relay registers
        the same way (role `relay`) and is listed apart, in `AgentList.relays`.

    relay      XPUB (bound by a relay) -> SUB (views, a downstream relay)
        [EventBatch]  every upstream agent's, passed through untouched (the envelope, seq included)
               ROUTER (bound by a relay) <- DEALER (views, a downstream relay)
        request   [ListAgents | SnapshotRequest with `agent` naming the agent]
        reply     [AgentList (the relay in `relays`, the agents it knows, its upstreams that stopped answering;
                   `lister` says a relay's from a bootstrap service's) | Snapshot (the agent's own)]

    data link  ROUTER (bound by each prefill rank) <- DEALER (each decode rank, one per prefill rank)
        decode -> prefill  [Hello | Heartbeat | TransferRequest | Ack | Abort]
        prefill -> decode  [Welcome | Heartbeat | Status | AbortAck]
                           [Chunk, payload_0, ..., payload_n-1]
            payload_i holds `Chunk.frame_pages[i]` consecutive pages of the
            room's page list (from `Chunk.page_start` on), `nbytes_per_page`
            bytes of each page; `Chunk.checksum` is xxh3-64 over all payloads, or
            `Chunk.page_digests` carries each whole page's digest from when it was
            written (end-to-end page checksums, see pool.py).

    control    ROUTER (bound by each agent) <- DEALER (router, tests, kvtop)
        request   [Submit | GetStats | Digest]
        reply     [Submitted | RoomResult | Stats | DigestReply | Refusal]

    consensus  PUB (bound by each rank; an XPUB serving whole-stream subscriptions only) -> SUB (the other ranks
               of its instance)
        [Vote]    every engine tick: the rank's rooms and what it knows of their failures
                  (a vote outside its schema, or from a rank not joined, is counted as
                  consensus_rejected_<reason> and ignored)

    events     PUB and snapshot ROUTER (bound by each agent): see events.py

Flow control: a decode rank grants each prefill link `Hello.window_bytes`;
every `Ack` returns the bytes of the chunks landed since the previous one
(decode acks once per quarter window, at a room's last chunk, and on each tick). Prefill never has more than
the window unacknowledged on a link, whatever ZeroMQ's message HWM allows.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Generic, TypeVar

import msgspec

from transport.errors import FrameRejected, ReasonClass

WIRE_VERSION: Final = 1
MAX_CONTROL_FRAME: Final = 4 << 20
"""The largest control frame accepted (a request listing ~1M pages fits)."""

_VERSION_PREFIX: Final = bytes([WIRE_VERSION])

# Bounds checked while decoding (msgspec rejects a value outside them as malformed):
PollValue = Annotated[int, msgspec.Meta(ge=0, le=4)]
"""A `KVPoll` value as a plain int (the hot paths compare ints)."""
RoomId = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
"""A bootstrap room: a random 63-bit id."""
MAX_COUNT: Final = 1 << 53
"""The largest count or byte count a frame may carry: exact as a float, and sums of millions of them stay within
what msgpack encodes (a transfer of 2**64-1 bytes made a link's total unencodable, and a recorder's keyframe
failed; an ack of as many ended a prefill rank's event publisher)."""
ByteCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
"""Bytes a peer says moved (an ack, a transfer): no room moves more."""
RankIndex = Annotated[int, msgspec.Meta(ge=0, lt=1 << 16)]
Stage = Annotated[int, msgspec.Meta(ge=0, lt=1 << 10)]
"""A pipeline stage: 0 to 1023, as `registration.agent_problem` allows an `AgentInfo.pp`."""
Incarnation = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
RankLabel = Annotated[str, msgspec.Meta(max_length=256)]
ShortText = Annotated[str, msgspec.Meta(max_length=64)]
"""A name from a small vocabulary: a level, a reason class, a role, a counter."""
TEXT_MAX: Final = 4096
"""The longest reason, path or error text a frame may carry."""
ReasonText = Annotated[str, msgspec.Meta(max_length=TEXT_MAX)]


def cut_text(text: str, limit: int = TEXT_MAX) -> str:
    """`text`, or its first `limit` characters ending in an ellipsis when it is longer (so it fits a frame)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


LOG_SIDECAR = "log_sidecar"
"""`AgentInfo.kind` of a log sidecar: it has no data, control or consensus endpoint, only events."""
SGLANG_PLUGIN = "sglang"
"""`AgentInfo.kind` of a real SGLang rank, published by the kvtop plugin inside it: only events, like a sidecar."""
AGENT_KINDS = ("", LOG_SIDECAR, SGLANG_PLUGIN)


class AgentInfo(msgspec.Struct, frozen=True, array_like=True):
    """Who an agent is and where to reach it."""

    role: str
    instance: str
    rank: int
    tp: int
    page_bytes: int
    data_endpoint: str
    control_endpoint: str
    pid: int
    host: str
    incarnation: int
    consensus_endpoint: str = ""
    event_endpoint: str = ""
    snapshot_endpoint: str = ""
    kind: str = ""
    """"" for an agent that moves KV; `LOG_SIDECAR` for a sidecar that publishes a server log's events;
    `SGLANG_PLUGIN` for an SGLang rank that publishes its own events."""
    pp: int | None = None
    """The rank's pipeline stage past the first (a server log's `PP` tag); None for the first, as for a server
    without stages."""
    dp: int | None = None
    """The DP replica the rank is of, where the server's DP ranks are replicas (plain `--dp-size N`: each its own
    TP group); None for a server without DP, or with DP attention (its TP ranks unique across DP)."""

    @property
    def is_sidecar(self) -> bool:
        return self.kind == LOG_SIDECAR

    @property
    def events_only(self) -> bool:
        """It publishes events but moves no KV of ours (a sidecar, an SGLang rank): no data or control endpoint."""
        return self.kind != ""

    @property
    def label(self) -> str:
        """The rank's short name, e.g. `prefill-0/TP1`, `prefill-0/PP1-TP1`, `prefill-0/DP1-TP1` (also the origin
        label)."""
        return rank_label(self.instance, self.rank, self.pp, self.dp)


_LABEL = re.compile(r"(.*)/(?:DP(\d+)-)?(?:PP(\d+)-)?TP(\d+)")


def rank_label(instance: str, tp: int, pp: int | None = None, dp: int | None = None) -> str:
    """A rank's label: `prefill-0/TP1`; a rank of a pipeline stage past the first `prefill-0/PP1-TP1` (the first
    stage's ranks are labelled as a server's without stages; one `/`: the instance is what comes before it); a rank
    of a DP replica (plain `--dp-size N`: each replica its own TP group) `prefill-0/DP1-TP0`, `prefill-0/DP1-PP1-TP0`
    (`dp` None: a server whose DP ranks are no replicas, or none)."""
    replica = f"DP{dp}-" if dp is not None else ""
    return f"{instance}/{replica}PP{pp}-TP{tp}" if pp else f"{instance}/{replica}TP{tp}"


def label_parts(label: str) -> tuple[str, int | None, int] | None:
    """(instance, pipeline stage past the first or None, TP rank) of a `rank_label` (its DP replica, if any, left
    out); None for a label of no rank."""
    match = _LABEL.fullmatch(label)
    return (match[1], int(match[3]) or None if match[3] else None, int(match[4])) if match else None


def label_replica(label: str) -> int | None:
    """The DP replica a `rank_label` names (`prefill-0/DP1-TP0`: 1); None for a rank of no replica."""
    match = _LABEL.fullmatch(label)
    return int(match[2]) if match and match[2] else None


# --- bootstrap -------------------------------------------------------------------------


class Register(msgspec.Struct, tag="register", array_like=True):
    req_id: int
    agent: AgentInfo


class Registered(msgspec.Struct, tag="registered", array_like=True):
    req_id: int


class Resolve(msgspec.Struct, tag="resolve", array_like=True):
    req_id: int
    instance: str


class Route(msgspec.Struct, tag="route", array_like=True):
    """Every registered rank of one instance (complete when `len(ranks) == tp`)."""

    req_id: int
    instance: str
    ranks: list[AgentInfo]


class Deregister(msgspec.Struct, tag="deregister", array_like=True):
    """An agent leaving cleanly: drop its entry (only if it is still this incarnation's)."""

    req_id: int
    instance: str
    rank: int
    incarnation: int
    pp: int | None = None
    """The agent's pipeline stage past the first (`AgentInfo.pp`)."""
    dp: int | None = None
    """The agent's DP replica (`AgentInfo.dp`; a trailing field: an older agent's deregistration is of no replica)."""


class ListAgents(msgspec.Struct, tag="list", array_like=True):
    req_id: int


class RefusedNote(msgspec.Struct, array_like=True, frozen=True):
    """One registration a bootstrap service refused (`AgentList.refusals`): a reader judges whether it can explain
    a missing rank by its role and its age (a refusal an hour old, or of a prefill rank, says nothing of a decode
    rank missing now)."""

    line: ReasonText
    """As in `AgentList.refused`: `name: why (from CLIENT...)`."""
    role: ShortText = ""
    """The refused rank's role ("" when the registration named none the service knows)."""
    age_s: Annotated[float, msgspec.Meta(ge=0.0, le=1e9)] = 0.0
    """Seconds since it was refused, as the service answered (an age, not a time: the reader's clock may differ)."""


LISTED_BY_BOOTSTRAP: Final = "bootstrap"
LISTED_BY_RELAY: Final = "relay"


class AgentList(msgspec.Struct, tag="agents", array_like=True):
    req_id: int
    agents: list[AgentInfo]
    counters: dict[str, int] = {}
    """The service's own counters (requests, expired and refused entries, rejected frames)."""
    refused: list[str] = []
    """The latest refused registrations, `name: why`, newest last."""
    expired: list[AgentInfo] = []
    """Agents whose entries expired (they stopped refreshing: died) in the last `EXPIRED_KEPT_S`, so that a
    reader arriving later still learns they are gone. Never connected to, never resolved."""
    relays: list[AgentInfo] = []
    """Relays registered here (role `relay`; see relay.py): a view subscribes to one of them instead of to
    every agent. Never resolved, never in `agents`."""
    upstream_errors: list[ReasonText] = []
    """A relay's upstreams that did not answer its latest discovery round, each error naming the upstream's
    address (those an upstream relay reports, as `via ADDR: ...`): a view says so rather than blame the ranks."""
    kept: list[RankLabel] = []
    """Agents a relay lists from the last answer of an upstream that no longer answers (`upstream_errors`): their
    silence is the upstream's, not known to be theirs."""
    lister: ShortText = ""
    """What answered: `LISTED_BY_BOOTSTRAP` or `LISTED_BY_RELAY` ("" from a peer that predates the field; a field
    past the end, as every one added is, is ignored by older readers, so the wire version stays)."""
    replaced: list[ReasonText] = []
    """The latest new incarnations that took a rank's entry (a restart; a rank registered again from another
    client once its entry expired), `name: incarnation A replaced by B (from CLIENT)`, newest last."""
    refusals: Annotated[list[RefusedNote], msgspec.Meta(max_length=64)] = []
    """`refused`'s lines of the bootstrap service, each with its role and age (`refused` stays for older readers)."""
    taken: Annotated[list[AgentInfo], msgspec.Meta(max_length=64)] = []
    """Ranks that go on registering while another client holds their entry (its `refused_takeover`), the latest
    registration of each, while it refreshes: running, listed nowhere else, so a view started after the takeover
    hears them too (it subscribes to their events; never resolved, no peer sends them KV)."""


class Refusal(msgspec.Struct, tag="refusal", array_like=True):
    """A request the receiver understood but cannot serve."""

    req_id: int
    message: str


BootstrapRequest = Register | Deregister | Resolve | ListAgents
BootstrapReply = Registered | Route | AgentList | Refusal

# --- data link -------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    agent: AgentInfo
    window_bytes: int


class Welcome(msgspec.Struct, tag="welcome", array_like=True):
    agent: AgentInfo


class Heartbeat(msgspec.Struct, tag="hb", array_like=True):
    sent_at: float


class TransferRequest(msgspec.Struct, tag="xfer", array_like=True):
    """Decode asks a prefill rank for a room's KV: where to put it and how much of each page."""

    room: int
    decode_rank: int
    dst_pages: bytes
    """Destination page indices, little-endian uint32."""
    src_offset: int
    dst_offset: int
    nbytes_per_page: int
    requests_expected: int


class Chunk(msgspec.Struct, tag="chunk", array_like=True):
    room: int
    index: int
    last: bool
    page_start: int
    frame_pages: list[int]
    nbytes: int
    checksum: int | None
    """xxh3-64 of the payloads, or None when the sender runs without checksums or sends `page_digests`."""
    page_digests: bytes = b""
    """The writer's xxh3-64 of each page of the chunk, 8 canonical bytes each in page order (whole source
    pages only); empty when the pages were not sealed or checksums are off."""


class Ack(msgspec.Struct, tag="ack", array_like=True):
    """Bytes landed since the last ack, per room: `[(room, nbytes), ...]`."""

    landed: list[tuple[RoomId, ByteCount]]


class Status(msgspec.Struct, tag="status", array_like=True):
    """A prefill rank's verdict on a room; failures carry their origin."""

    room: int
    state: PollValue
    rank: int
    reason: str = ""
    reason_class: str = ""
    origin: str = ""
    suspect: RankLabel = ""
    """What the failure's origin named as the likely cause (the decode's echo carries it)."""
    origin_class: ReasonClass | None = None
    """The class the failure's origin recorded, when this rank knows it (the decode's echo carries it)."""


class Abort(msgspec.Struct, tag="abort", array_like=True):
    """Decode gives up on a room; prefill fails it as an echo of `origin`, carrying what `origin` named."""

    room: int
    reason: str
    reason_class: str
    origin: str
    suspect: RankLabel = ""
    origin_class: ReasonClass | None = None
    """The class `origin` recorded, when this rank knows it."""


class AbortAck(msgspec.Struct, tag="abort_ack", array_like=True):
    room: int
    rank: int


LinkMessage = Hello | Welcome | Heartbeat | TransferRequest | Chunk | Ack | Status | Abort | AbortAck

# --- instance consensus -------------------------------------------------------------------


class VoteEntry(msgspec.Struct, array_like=True, frozen=True):
    """One room as a rank sees it; a failure carries its origin (SGLang's MIN, plus the origin).

    Every field is bounded by its type, so an entry that decodes can be acted on as it is.
    """

    room: RoomId
    state: PollValue
    origin: RankLabel = ""
    reason: ReasonText = ""
    reason_class: ReasonClass | None = None
    suspect: RankLabel = ""
    """What the origin rank named as the likely cause (its own failures only; see `reasons.Reason`)."""
    origin_class: ReasonClass | None = None
    """The class the origin rank recorded (its own `reason_class`; an echo's vote carries what it learnt)."""


class Vote(msgspec.Struct, tag="vote", array_like=True):
    rank: RankIndex
    incarnation: Incarnation
    rooms: list[VoteEntry]


# --- agent control -----------------------------------------------------------------------


class Submit(msgspec.Struct, tag="submit", array_like=True):
    """Start a room on this rank: prefill computes and sends, decode receives from `prefill_instance`."""

    req_id: int
    room: RoomId
    num_pages: int
    """Refused (not rejected) below 1, so the submitter hears why."""
    prefill_instance: str = ""


class Submitted(msgspec.Struct, tag="submitted", array_like=True):
    req_id: int
    room: int


class RoomResult(msgspec.Struct, tag="result", array_like=True):
    """Sent once per submitted room, when it reaches Success or Failed."""

    req_id: int
    room: int
    state: int
    nbytes: int
    seconds: float
    reason: str = ""
    reason_class: str = ""
    origin: str = ""
    is_from_another_rank: bool = False


class GetStats(msgspec.Struct, tag="get_stats", array_like=True):
    req_id: int


class Stats(msgspec.Struct, tag="stats", array_like=True):
    req_id: int
    counters: dict[str, int]


class Digest(msgspec.Struct, tag="digest", array_like=True):
    """Ask for the xxh3-64 of a finished room's pages (prefill: source; decode: landed)."""

    req_id: int
    room: int


class DigestReply(msgspec.Struct, tag="digest_reply", array_like=True):
    req_id: int
    room: int
    digest: int


ControlRequest = Submit | GetStats | Digest
ControlReply = Submitted | RoomResult | Stats | DigestReply | Refusal

_ENCODER = msgspec.msgpack.Encoder()
T = TypeVar("T")


def encode(message: msgspec.Struct) -> bytes:
    """One control frame: the version byte, then the msgpack body."""
    return _VERSION_PREFIX + _ENCODER.encode(message)


class FrameDecoder(Generic[T]):
    """Decodes control frames of one socket's message union, raising `FrameRejected`."""

    def __init__(self, union: object) -> None:
        self._decoder = msgspec.msgpack.Decoder(union)

    def decode(self, frame: bytes | memoryview) -> T:
        """The message in `frame`, or `FrameRejected` with the counter key."""
        size = len(frame)
        if size > MAX_CONTROL_FRAME:
            raise FrameRejected("oversize", f"control frame of {size} bytes exceeds {MAX_CONTROL_FRAME}")
        if size == 0:
            raise FrameRejected("malformed", "empty frame")
        version = frame[0]
        if version != WIRE_VERSION:
            raise FrameRejected("unknown_version", f"wire version {version}, this build speaks {WIRE_VERSION}")
        try:
            message: T = self._decoder.decode(memoryview(frame)[1:])
            return message
        except msgspec.DecodeError as exc:
            raise FrameRejected("malformed", str(exc)) from exc
