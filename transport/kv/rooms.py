"""Per-room records kept by a rank's engine, one per bootstrap room."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from transport.errors import KVTransferError, ReasonClass
from transport.kv.mapping import Pairing
from transport.kv.pool import PageIndices
from transport.kv.reasons import Reason
from transport.kvpoll import KVPoll, advance
from transport.wire import Abort, TransferRequest


@dataclass(eq=False)
class RoomRecord:
    """State, timings and failure of one room on one rank.

    Written only by the engine thread; `state` is assigned last so a reader on
    another thread that sees Failed also sees `failure`.
    """

    room: int
    created_at: float
    state: KVPoll = KVPoll.Bootstrapping
    entered_at: float = 0.0
    progress_at: float = 0.0
    finished_at: float = 0.0
    failure: KVTransferError | None = None
    reason_class: ReasonClass | None = None
    bytes_total: int = 0
    bytes_done: int = 0
    failed_in: KVPoll | None = None
    """The state the room was in when it failed (which SGLang log line it gets)."""
    agreed: KVPoll = KVPoll.Bootstrapping
    """The instance's MIN over its ranks (see consensus.py); what a scheduler acts on."""
    agreed_failure: KVTransferError | None = None
    """Set when the instance failed the room after this rank had already succeeded."""
    agreed_reason_class: ReasonClass | None = None
    """The class of `agreed_failure`."""
    observer: Callable[[RoomRecord, KVPoll], None] | None = None
    """Told of every state change (the event plane); set for rooms a scheduler owns."""
    progress_emitted_at: float = 0.0

    def __post_init__(self) -> None:
        self.entered_at = self.progress_at = self.created_at

    @property
    def peer(self) -> str:
        """The peer its room events name: the prefill instance on a decode rank, '' on a prefill rank."""
        return ""

    def move(self, proposed: KVPoll, now: float) -> bool:
        """Offer a state; returns True when the room changed state."""
        if proposed is self.state:  # every chunk offers Transferring again
            return False
        new = advance(self.state, proposed)
        if new is self.state:
            return False
        previous = self.state
        self.entered_at = self.progress_at = now
        if new.is_terminal:
            self.finished_at = now
        self.state = new
        if self.observer is not None:
            self.observer(self, previous)
        return True

    def fail(self, reason: Reason, now: float, origin: str, is_from_another_rank: bool = False) -> bool:
        """Fail the room unless it already ended; returns True when this call failed it."""
        if self.state.is_terminal:
            return False
        self.failure = KVTransferError(
            self.room, reason.text, is_from_another_rank=is_from_another_rank, origin=origin, suspect=reason.suspect,
            origin_class=reason.origin_class,
        )  # fmt: skip
        self.reason_class = reason.reason_class
        self.failed_in = self.state
        return self.move(KVPoll.Failed, now)


@dataclass(eq=False)
class LinkPlan:
    """What a prefill room sends over one link: its request and chunk progress."""

    request: TransferRequest
    dst_pages: PageIndices
    chunks: list[tuple[int, int, list[int]]] = field(default_factory=list)
    """(first position, page count, run lengths) of each chunk, in positions of the room's page list."""
    sent: int = 0
    acked_bytes: int = 0
    total_bytes: int = 0
    whole_rows: bool = False
    """Whole source pages go (each payload is the pool's own rows, zero-copy)."""
    slices: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    """With `whole_rows`: each chunk's payloads as (offset, nbytes) of the pool's rows, one per run, worked out
    when the room starts sending (not per chunk)."""
    digests: bytes = b""
    """The sealed source pages' digests in room order, 8 bytes each (end-to-end checksums); empty when the
    chunks carry a checksum of their own, or none."""
    status_sent: bool = False


@dataclass(eq=False)
class SenderRoom(RoomRecord):
    """A prefill rank's room: the source pages and one plan per requesting decode rank."""

    has_sender: bool = False
    src_pages: PageIndices | None = None
    requests_expected: int = 1
    plans: dict[bytes, LinkPlan] = field(default_factory=dict)

    @property
    def all_requests_in(self) -> bool:
        return len(self.plans) >= self.requests_expected


@dataclass(eq=False)
class ReceiverRoom(RoomRecord):
    """A decode rank's room: where its pages land and which prefill ranks send them."""

    prefill_instance: str = ""
    dst_pages: PageIndices | None = None
    dst_breaks: list[int] = field(default_factory=list)
    """Positions where `dst_pages` stops being consecutive (see `pool.run_breaks`)."""
    pairings: list[Pairing] = field(default_factory=list)
    requests_sent: bool = False
    statuses_ok: set[int] = field(default_factory=set)
    abort_acks: set[int] = field(default_factory=set)
    abort: Abort | None = None
    """The ABORT its prefill ranks are told once their link is up (the room failed before its handshake)."""
    lanes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per prefill rank whose chunks land as whole rows in one run of pages: (the pool byte offset of the room's
    first page, page bytes, pages), worked out at its first chunk (`DecodeSide._lane`); () where they do not."""

    @property
    def peer(self) -> str:
        return self.prefill_instance

    @property
    def complete(self) -> bool:
        """All bytes landed and every expected prefill rank reported Success."""
        if not 0 < self.bytes_total <= self.bytes_done:
            return False
        return len(self.statuses_ok) >= (self.pairings[0].responses_expected if self.pairings else 1)

    def pairing_from(self, prefill_rank: int) -> Pairing | None:
        """The pairing of the prefill rank `prefill_rank` in this room, if it sends here."""
        for pairing in self.pairings:
            if pairing.prefill_rank == prefill_rank:
                return pairing
        return None
