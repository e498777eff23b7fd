"""What a role's side of the engine (prefill.py, decode.py) shares with the engine: identity, memory,
settings, counters, and how room changes become events.

Each side offers the engine the same calls, all on the engine thread: `sockets()` and `handle()` for
input, `pump()` to send what flow control allows, `tick()` for timeouts and liveness, `release()`,
`fail_by_instance()`, `fail_agreed()` and `close()`.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import zmq

from transport.config import TransferConfig
from transport.counters import Counters
from transport.curve import CurveKeys
from transport.errors import KVTransferError, ReasonClass
from transport.kv import reasons
from transport.kv.faults import FaultInjector, FaultKind
from transport.kv.pool import KVPool
from transport.kv.rooms import RoomRecord
from transport.kvpoll import KVPoll
from transport.plane.events import Event, Failure, Level, Progress, RoomState, TransferDone
from transport.wire import AgentInfo, cut_text

CLEARED_MEMORY = 10_000
"""How many released room ids are remembered, so late echoes for them are ignored."""
TIMEOUT_STAGGER_S = 0.5
"""Rank r of an instance times a room out r x this later than rank 0, so when every rank would
time out together, rank 0 does and the others learn it through consensus: one origin, not tp."""
PROGRESS_INTERVAL_S = 0.25
"""At most one progress event per room this often."""


def _discard(_: Event) -> None:
    pass


@dataclass(eq=False)
class SideContext:
    """Everything a side shares with its engine: identity, memory, settings, counters."""

    info: AgentInfo
    pool: KVPool
    config: TransferConfig
    faults: FaultInjector
    counters: Counters
    context: zmq.Context[zmq.Socket[bytes]]
    curve: CurveKeys | None = None
    """The cluster's CURVE keys (None: plain TCP)."""
    cleared: dict[int, None] = field(default_factory=dict)
    """Recently released rooms (insertion-ordered, bounded)."""
    emit: Callable[[Event], None] = _discard
    """Where room events go (the agent's publisher); never blocks."""
    stalled_until: float = -math.inf
    """When this rank's engine last came back from a stall (`time.monotonic()`): see `stalled`."""

    @property
    def stagger_s(self) -> float:
        return self.info.rank * TIMEOUT_STAGGER_S

    def stalled(self, until: float) -> None:
        """The engine stood still for longer than a peer timeout until `until` (the process was stopped, starved
        or swapped out): the failures this rank then records because it heard nobody name itself as their
        suspect (its peers did not go away; it did). See `_own_silence`."""
        self.counters.add("stalls")
        self.stalled_until = until

    def _own_silence(self, record: RoomRecord, reason_class: ReasonClass | None) -> bool:
        """Whether a failure of `reason_class` this rank records now in `record` is its own stall's doing: a
        silence class, in a room it took before the stall ended or in the two peer timeouts after (the backlog
        it found when it woke: its peers' votes and heartbeats are judged afresh after one), within
        `config.retain_finished_s` of the stall."""
        if reason_class not in reasons.SILENCE_CLASSES:
            return False
        backlog = record.created_at <= self.stalled_until + 2 * self.config.peer_timeout_s
        return backlog and time.monotonic() <= self.stalled_until + self.config.retain_finished_s

    def observe(self, record: RoomRecord, peer: str = "") -> None:
        """Publish the state changes of a room a scheduler owns (and its state now, if it moved already)."""
        record.observer = lambda changed, previous: self._room_changed(changed, previous, peer)
        if record.state is not KVPoll.Bootstrapping:
            self._room_changed(record, KVPoll.Bootstrapping, peer)

    def _room_changed(self, record: RoomRecord, previous: KVPoll, peer: str) -> None:
        ts = time.time()
        self.emit(RoomState(ts, record.room, int(record.state), int(previous), peer, record.bytes_total))
        if record.state is KVPoll.Success:
            seconds = record.finished_at - record.created_at
            self.emit(TransferDone(ts, record.room, record.bytes_done, seconds, peer))
        elif record.state is KVPoll.Failed and record.failure is not None:
            self.emit(self.failure_event(record, record.failure, record.reason_class, ts))

    def failure_event(
        self, record: RoomRecord, failure: KVTransferError, reason_class: ReasonClass | None, ts: float
    ) -> Failure:
        """The event of a failure on this rank: an origin at error/warning with its suspect, an echo at debug with
        what its origin named and the class it recorded (when it learnt them through its instance's vote, an ABORT
        or a status): a view that never gets the origin's own record (its rank died) still knows what broke, and
        how."""
        origin = failure.origin or self.info.label
        level = Level.DEBUG
        suspect = failure.suspect
        origin_class = str(failure.origin_class or "")
        if origin == self.info.label:
            level = Level.WARNING if self.info.role == "prefill" else Level.ERROR
            suspect = self.info.label if self._own_silence(record, reason_class) else failure.suspect
            origin_class = ""  # its own: `reason_class`
        return Failure(
            ts,
            record.room,
            self.info.label,
            cut_text(failure.failure_reason),
            str(reason_class or ReasonClass.OTHER),
            str(level),
            failure.is_from_another_rank,
            origin,
            suspect,
            origin_class,
        )

    def fail_agreement(self, record: RoomRecord, reason: reasons.Reason, origin: str) -> None:
        """The instance failed a room this rank had finished: from now on it is Failed here too.

        Published as this rank's state (Failed after its own Success or Failed, so every view counts
        the room failed) and as a failure event: an origin when `origin` is this rank, else an echo.
        """
        previous = record.state
        record.agreed_failure = KVTransferError(
            record.room, reason.text, is_from_another_rank=origin != self.info.label, origin=origin,
            suspect=reason.suspect, origin_class=reason.origin_class,
        )  # fmt: skip
        record.agreed_reason_class = reason.reason_class
        record.agreed = KVPoll.Failed
        if record.observer is None:
            return
        ts = time.time()
        self.emit(RoomState(ts, record.room, int(KVPoll.Failed), int(previous), record.peer, record.bytes_total))
        self.emit(self.failure_event(record, record.agreed_failure, reason.reason_class, ts))

    def progress(self, record: RoomRecord, now: float) -> None:
        """A rate-limited progress event for a room whose bytes moved."""
        if record.observer is not None and now - record.progress_emitted_at >= PROGRESS_INTERVAL_S:
            record.progress_emitted_at = now
            self.emit(Progress(time.time(), record.room, record.bytes_done, record.bytes_total))

    def remember_cleared(self, room: int) -> None:
        """The room ended here: remember its id (late echoes are ignored) and forget its fault decision."""
        self.faults.forget(room)
        self.cleared[room] = None
        if len(self.cleared) > CLEARED_MEMORY:
            del self.cleared[next(iter(self.cleared))]

    def inject_die(self, fault: FaultKind | None) -> None:
        """The `die` fault: this process ends at once, as a crashed rank would."""
        if fault is FaultKind.DIE:
            self.counters.add("fault_die")
            os.kill(os.getpid(), signal.SIGKILL)


def finished_long_ago(rooms: Mapping[int, RoomRecord], now: float, retain_s: float) -> list[RoomRecord]:
    """The finished rooms nobody released within `retain_s` of their end (the engine forgets them)."""
    return [record for record in rooms.values() if record.state.is_terminal and now - record.finished_at > retain_s]
