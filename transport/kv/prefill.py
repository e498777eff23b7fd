"""The prefill side of the engine: serve transfer requests, send KV chunks under credit.

One ROUTER socket serves every decode rank that talks to this prefill rank.
Chunks of one link go in room order, at most `window_bytes` unacknowledged;
a room succeeds when every chunk on every link is acknowledged. Whole pages go
straight from the pool, as registered memory (`transport.kv.registered`).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import xxhash
import zmq

from transport.curve import serving
from transport.errors import FrameRejected, KVTransferError
from transport.kv import reasons
from transport.kv.faults import FaultKind
from transport.kv.pool import PageIndices, run_breaks, split_runs
from transport.kv.registered import RegisteredMemory
from transport.kv.rooms import LinkPlan, SenderRoom
from transport.kv.side import SideContext
from transport.kvpoll import KVPoll
from transport.plane.events import AbortEvent
from transport.sockets import LIST_FRAME, bind_ephemeral, drain_message, open_socket
from transport.wire import (
    Abort,
    AbortAck,
    Ack,
    AgentInfo,
    Chunk,
    FrameDecoder,
    Heartbeat,
    Hello,
    LinkMessage,
    Status,
    TransferRequest,
    Welcome,
    encode,
)

_BATCH = 256
"""Messages read from the socket per wake-up, so sending is never starved."""
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_SEND = zmq.backend.Socket.send
"""pyzmq's own send, without its Python wrapper (draft sockets' routing ids and groups: ~0.35 us a frame)."""


@dataclass(eq=False)
class DecodePeer:
    """A decode rank connected to this prefill rank."""

    identity: bytes
    info: AgentInfo
    window_bytes: int
    last_seen: float
    inflight: int = 0
    lost: bool = False
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    """(room, chunks to send) waiting, in order; a room's next chunk is its plan's `sent`."""
    not_before: float = 0.0
    """A delayed chunk at the head of the queue waits until then."""
    label: str = field(init=False)
    """`info.label`, made once (a fault is picked with it at every pump)."""

    def __post_init__(self) -> None:
        self.label = self.info.label


PoolSlice = tuple[int, int]
"""(offset, nbytes) of a run of the pool's own rows: sent as registered memory, no copy, no garbage collector."""
Payload = PoolSlice | memoryview
"""A payload frame: the pool's rows, or bytes made for this chunk (a column slice, a corrupted copy)."""


def _send_frames(
    sock: zmq.Socket[bytes], identity: bytes, header: bytes, payloads: Sequence[Payload], pool: RegisteredMemory
) -> None:
    """`send_multipart([identity, header, *payloads])`, NOBLOCK, payloads zero-copy.

    Frame by frame with the flags worked out once: send_multipart type-checks every frame
    and ORs the flag enums per frame, ~1 us a chunk. Like it, raises before the first frame
    is queued when the peer's pipe is full (ROUTER_MANDATORY). The pool's rows go as
    registered memory (`transport.kv.registered`), anything else through pyzmq.
    """
    _SEND(sock, identity, _MORE)
    _SEND(sock, header, _MORE)
    last = len(payloads) - 1
    for i, payload in enumerate(payloads):
        flags = _LAST if i == last else _MORE
        if isinstance(payload, tuple):
            pool.send(sock, payload[0], payload[1], flags)
        else:
            sock.send(payload, flags, copy=False)


class PrefillSide:
    """Engine-thread state of a prefill rank."""

    def __init__(self, ctx: SideContext, host: str) -> None:
        self._ctx = ctx
        self._socket = open_socket(ctx.context, zmq.ROUTER, LIST_FRAME, serving(ctx.curve))
        self._socket.router_mandatory = True
        self._socket.sndhwm = 100_000
        self.endpoint = bind_ephemeral(self._socket, host)
        self._pool = RegisteredMemory(ctx.pool.rows(0, ctx.pool.num_pages))
        self._peers: dict[bytes, DecodePeer] = {}
        self.rooms: dict[int, SenderRoom] = {}
        self._decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
        self.socket_generation = 0

    # --- scheduler commands ---------------------------------------------------------

    def attach_sender(self, room: SenderRoom) -> SenderRoom:
        """Adopt the scheduler's record, or return the one that requests already created."""
        existing = self.rooms.get(room.room)
        if existing is not None and not existing.has_sender:
            existing.has_sender = True
            existing.created_at = existing.entered_at = room.created_at
            room = existing
        else:
            self._ctx.cleared.pop(room.room, None)
            room.has_sender = True
            self.rooms[room.room] = room
        self._ctx.observe(room)
        return room

    def refuse(self, room: int, now: float, holding_up: str = "", silent_s: float = 0.0) -> KVTransferError | None:
        """The scheduler refused `room` here (no pages for it): the room fails on this rank now, its origin.

        The decode ranks' requests for it are answered Failed (at once, or when they come), and this
        instance's other ranks learn it by consensus: nobody holds the room's pages until a timeout. Left
        alone, a prefill rank that refused under a full pool held its decode ranks' pages for their waiting
        timeout, the pools stayed full with such half rooms, and most new rooms were refused in turn.

        `holding_up`: a rank of this instance that stopped voting `silent_s` ago, so every room here waits on it:
        the pool filled with them, and it is the refusal's suspect (else this rank is). Returns the room's failure
        (None when the room was live here after all, or already decided)."""
        record = self.rooms.get(room)
        if record is None:
            record = self.rooms[room] = SenderRoom(room, now)
        elif record.has_sender or record.state.is_terminal:  # live here after all, or already decided
            return None
        self._ctx.observe(record)
        self._fail(record, reasons.pool_full(room, self._ctx.info, holding_up, silent_s), now)
        return record.failure

    def send(self, room: SenderRoom, pages: np.ndarray, now: float) -> None:
        room.src_pages = pages
        self._start_if_ready(room, now)

    def release(self, room: int) -> None:
        if self.rooms.pop(room, None) is not None:
            self._ctx.remember_cleared(room)

    # --- loop hooks -----------------------------------------------------------------

    def sockets(self) -> list[zmq.Socket[bytes]]:
        return [self._socket]

    def handle(self, sock: zmq.Socket[bytes], now: float) -> None:
        """Read what the decode ranks sent, up to `_BATCH` messages.

        A wake-up usually finds one message (an ack): after it, `ZMQ_EVENTS` is asked once (~1.7 us; ~30 us
        with the caches cold after a window of chunks went out) instead of trying for a second and taking the
        `Again` exception (~3.6 us; 40-80 us cold: pyzmq imports and looks up the error's text for each).
        Where more wait, they are read until `Again`, which costs less than a question a message."""
        recv = sock.recv
        decode = self._decoder.decode
        for read in range(_BATCH):
            if read == 1 and not cast(int, sock.getsockopt(zmq.EVENTS)) & _POLLIN:
                return
            try:
                identity = recv(_LAST)
            except zmq.Again:
                return
            frame = recv(_LAST, copy=False)  # a ROUTER's message is its peer's routing id and at least one frame
            if frame.more:  # said by the frame itself: no RCVMORE question
                drain_message(sock)
                self._ctx.counters.reject("unexpected")
                continue
            try:
                message = decode(frame.buffer)
            except FrameRejected as rejected:
                self._ctx.counters.reject(rejected.reason)
                continue
            self._on_message(identity, message, now)

    def pump(self, now: float) -> float | None:
        wake: float | None = None
        for peer in list(self._peers.values()):
            if peer.lost:
                continue
            wait = self._pump_peer(peer, now)
            if wait is not None:
                wake = wait if wake is None else min(wake, wait)
        return wake

    def tick(self, now: float) -> None:
        timeouts = self._ctx.config.timeouts
        for record in list(self.rooms.values()):
            if record.state.is_terminal:
                continue
            if not record.has_sender:
                if now - record.created_at > max(timeouts.bootstrap_s, timeouts.waiting_s):
                    del self.rooms[record.room]
                    self._ctx.faults.forget(record.room)
                    self._ctx.counters.add("requests_expired")
                continue
            stagger = self._ctx.stagger_s
            if record.state is KVPoll.Bootstrapping and now - record.created_at > timeouts.bootstrap_s + stagger:
                self._fail(record, reasons.timed_out(record.room, now - record.created_at, KVPoll.Bootstrapping), now)
            elif (
                record.state is KVPoll.Transferring
                and (idle := now - record.progress_at) > 2 * timeouts.transfer_s + stagger
                and idle > self._backstop_s(record) + stagger
            ):
                reason = reasons.timed_out(
                    record.room, now - record.progress_at, KVPoll.Transferring, self._unacked(record)
                )
                self._fail(record, reason, now)
        for peer in self._peers.values():
            if not peer.lost and now - peer.last_seen > self._ctx.config.peer_timeout_s:
                self._lose_peer(peer, reasons.decode_peer_dead(peer.info.label), now)

    def _backstop_s(self, record: SenderRoom) -> float:
        """How long a room may go without progress here: the decode side owns this timeout and fires first, in
        Transferring (its transfer timeout), or in WaitingForInput while no chunk of the room reached it (its
        waiting timeout: a first chunk lost). Before, the backstop beat a decode waiting for its first chunk and
        named it, alive and answering heartbeats, for a chunk this side never delivered."""
        timeouts = self._ctx.config.timeouts
        if any(plan.acked_bytes for plan in record.plans.values()):
            return 2 * timeouts.transfer_s
        return max(2 * timeouts.transfer_s, timeouts.waiting_s + timeouts.transfer_s)

    def _unacked(self, record: SenderRoom) -> str:
        """The decode rank whose acknowledgements a room still waits for (its instance when several of one do,
        "" when the room waits on several instances or none)."""
        labels = {
            peer.info.label
            for identity, plan in record.plans.items()
            if plan.acked_bytes < plan.total_bytes and (peer := self._peers.get(identity)) is not None
        }
        return reasons.common_suspect(labels)

    def close(self) -> None:
        self._socket.close(linger=0)

    # --- messages -------------------------------------------------------------------

    def _on_message(self, identity: bytes, message: LinkMessage, now: float) -> None:
        if isinstance(message, Hello):
            self._peers[identity] = DecodePeer(identity, message.agent, message.window_bytes, now)
            self._reply(identity, Welcome(self._ctx.info))
            return
        peer = self._peers.get(identity)
        if peer is None:
            self._ctx.counters.reject("unexpected")
            return
        peer.last_seen = now
        peer.lost = False
        if isinstance(message, Heartbeat):
            self._reply(identity, Heartbeat(time.time()))
        elif isinstance(message, TransferRequest):
            self._on_request(peer, message, now)
        elif isinstance(message, Ack):
            self._on_ack(peer, message, now)
        elif isinstance(message, Abort):
            self._on_abort(peer, message, now)
        else:
            self._ctx.counters.reject("unexpected")

    def _on_request(self, peer: DecodePeer, request: TransferRequest, now: float) -> None:
        if len(request.dst_pages) % 4:  # not whole little-endian uint32s
            self._ctx.counters.reject("malformed")
            return
        record = self.rooms.get(request.room)
        if record is None:
            record = self.rooms[request.room] = SenderRoom(request.room, now)
        if record.state.is_terminal:
            self._send_status(peer, record)
            return
        dst_pages = np.frombuffer(request.dst_pages, dtype="<u4")
        problem = self._layout_problem(request, len(dst_pages))
        if problem:
            self._fail(record, reasons.layout_mismatch(record.room, problem), now)
            self._send_status(peer, record)
            return
        if self._ctx.faults.pick(record.room, peer.info.label) is FaultKind.REFUSE:
            self._ctx.counters.add("fault_refuse")
            self._fail(record, reasons.refused(record.room, self._ctx.info.rank, self._ctx.info.label), now)
            self._send_status(peer, record)
            return
        record.requests_expected = request.requests_expected
        record.plans[peer.identity] = LinkPlan(request, dst_pages)
        if record.all_requests_in:
            record.move(KVPoll.WaitingForInput, now)
        self._start_if_ready(record, now)

    def _layout_problem(self, request: TransferRequest, pages: int) -> str:
        page_bytes = self._ctx.pool.page_bytes
        if (
            request.src_offset < 0
            or request.src_offset + request.nbytes_per_page > page_bytes
            or request.nbytes_per_page <= 0
        ):
            return f"{request.nbytes_per_page} B at offset {request.src_offset} do not fit a {page_bytes} B page"
        if pages == 0:
            return "the request names no destination page"
        return ""

    def _on_ack(self, peer: DecodePeer, ack: Ack, now: float) -> None:
        for room, nbytes in ack.landed:
            peer.inflight = max(0, peer.inflight - nbytes)
            record = self.rooms.get(room)
            plan = record.plans.get(peer.identity) if record else None
            if record is not None and plan is not None and not record.state.is_terminal:
                nbytes = min(nbytes, plan.total_bytes - plan.acked_bytes)  # a peer acks no more than was sent
                plan.acked_bytes += nbytes
                record.bytes_done += nbytes
                record.progress_at = now
                self._ctx.progress(record, now)
                if plan.acked_bytes >= plan.total_bytes:  # else the room cannot have succeeded
                    self._succeed_if_acked(record, now)

    def _succeed_if_acked(self, record: SenderRoom, now: float) -> None:
        done = all(p.acked_bytes >= p.total_bytes and p.status_sent for p in record.plans.values())
        if done and record.move(KVPoll.Success, now):
            self._ctx.counters.add("rooms_succeeded")

    def _on_abort(self, peer: DecodePeer, abort: Abort, now: float) -> None:
        self._ctx.counters.add("aborts_received")
        self._ctx.emit(AbortEvent(time.time(), abort.room, "received", peer.info.label, abort.origin))
        self._reply(peer.identity, AbortAck(abort.room, self._ctx.info.rank))
        if abort.room in self._ctx.cleared:
            self._ctx.counters.add("late_failures")
            return
        record = self.rooms.get(abort.room)
        if record is None:
            record = self.rooms[abort.room] = SenderRoom(abort.room, now)
        if record.state is KVPoll.Success:
            agreed = KVPoll.Success if self._ctx.info.tp == 1 else record.agreed  # a rank alone agrees at once
            if agreed is KVPoll.Success:  # its instance agreed before: too late to change, counted (was ignored)
                self._ctx.counters.add("late_failures")
            elif not agreed.is_terminal:
                # sent in full here, not yet by every rank of the instance: the instance fails it, an echo of the
                # abort's origin (SGLang's Failed overrides Success, with no record of its own: its generic text),
                # before the other ranks time out on their own
                self.fail_agreed(record, reasons.from_another_rank(abort.suspect, abort.origin_class), abort.origin)
            return
        reason = reasons.aborted_by_peer(peer.info.label, abort.suspect, abort.origin_class)
        self._fail(record, reason, now, origin=abort.origin, told_by=peer.identity)

    # --- sending --------------------------------------------------------------------

    def _start_if_ready(self, record: SenderRoom, now: float) -> None:
        if record.src_pages is None or not record.all_requests_in or record.state is not KVPoll.WaitingForInput:
            return
        chunk_bytes = self._ctx.config.chunk_bytes
        for identity, plan in record.plans.items():
            if len(plan.dst_pages) != len(record.src_pages):
                detail = f"{len(record.src_pages)} source pages, {len(plan.dst_pages)} destination pages"
                self._fail(record, reasons.layout_mismatch(record.room, detail), now)
                return
            per_chunk = max(1, chunk_bytes // plan.request.nbytes_per_page)
            count = len(record.src_pages)
            breaks = run_breaks(record.src_pages, plan.dst_pages)
            plan.chunks = [
                (start, size, split_runs(breaks, start, size) if breaks else [size])
                for start in range(0, count, per_chunk)
                if (size := min(per_chunk, count - start))
            ]
            plan.total_bytes = count * plan.request.nbytes_per_page
            plan.whole_rows = plan.request.src_offset == 0 and plan.request.nbytes_per_page == self._ctx.pool.page_bytes
            if plan.whole_rows:
                plan.slices = self._pool_slices(record.src_pages, plan.chunks)
            if self._ctx.config.checksums and plan.whole_rows:
                plan.digests = self._ctx.pool.sealed_digests(record.src_pages) or b""
            record.bytes_total += plan.total_bytes
            peer = self._peers[identity]
            fault = self._ctx.faults.pick(record.room, peer.info.label)
            shown = plan.chunks if fault is not FaultKind.STALL else plan.chunks[: max(1, len(plan.chunks) // 2)]
            if fault is FaultKind.STALL:
                self._ctx.counters.add("fault_stall")
            peer.queue.append((record.room, len(shown)))
        record.move(KVPoll.Transferring, now)

    def _pump_peer(self, peer: DecodePeer, now: float) -> float | None:
        """Send the peer's queued rooms in order while its window allows; when to pump again (a delay), or None."""
        while peer.queue:
            room, stop = peer.queue[0]
            record = self.rooms.get(room)
            plan = record.plans.get(peer.identity) if record is not None else None
            if record is None or plan is None or record.state.is_terminal:
                peer.queue.popleft()  # a room that ended or was released sends nothing more
            elif self._pump_room(peer, record, plan, stop, now):
                peer.queue.popleft()
            else:
                return peer.not_before if peer.not_before > now else None
        return None

    def _pump_room(self, peer: DecodePeer, record: SenderRoom, plan: LinkPlan, stop: int, now: float) -> bool:
        """Send the room's chunks from `plan.sent` up to `stop`; False when the window, a delay or the link stops it.

        The room's fault is picked once here, not per chunk: a pick is the same for the whole room. What was
        sent is counted once, on the way out.
        """
        fault = self._ctx.faults.pick(record.room, peer.label)
        chunks = plan.chunks
        middle = len(chunks) // 2 if fault is not None else -1
        delayed = fault is FaultKind.DELAY
        width = plan.request.nbytes_per_page
        window = peer.window_bytes
        first = plan.sent
        sent_bytes = 0
        try:
            while plan.sent < stop:
                index = plan.sent
                if peer.not_before > now:
                    return False
                nbytes = chunks[index][1] * width
                if peer.inflight and peer.inflight + nbytes > window:
                    return False
                if delayed and peer.not_before == 0.0:
                    peer.not_before = now + self._ctx.faults.delay_s
                    self._ctx.counters.add("fault_delay")
                    continue
                peer.not_before = 0.0
                if index == middle:
                    self._ctx.inject_die(fault)
                    if fault is FaultKind.DROP:
                        self._ctx.counters.add("fault_drop")
                        first += 1  # dropped, not sent
                    elif self._send_chunk(peer, record, plan, index, fault is FaultKind.CORRUPT):
                        sent_bytes += nbytes
                    else:
                        return False
                elif self._send_chunk(peer, record, plan, index, False):
                    sent_bytes += nbytes
                else:
                    return False
                plan.sent = index + 1
                if plan.sent == len(chunks):
                    self._send_status(peer, record, plan)
                    self._succeed_if_acked(record, now)
            return True
        finally:
            if plan.sent > first:
                self._ctx.counters.add_with_bytes("chunks_sent", "bytes_sent", sent_bytes, plan.sent - first)

    def _send_chunk(self, peer: DecodePeer, record: SenderRoom, plan: LinkPlan, index: int, corrupt: bool) -> bool:
        """Put one chunk on the wire; False when the link is full (retry later)."""
        start, count, runs = plan.chunks[index]
        payloads: Sequence[Payload]
        payloads = plan.slices[index] if plan.whole_rows else self._columns(record, plan, start, runs)
        digests = plan.digests[start * 8 : (start + count) * 8]
        checksum = self._checksum(payloads) if not digests and self._ctx.config.checksums else None
        if corrupt:
            self._ctx.counters.add("fault_corrupt")
            damaged = np.array(self._bytes_of(payloads[0]), dtype=np.uint8)
            damaged[len(damaged) // 2] ^= 0xFF
            payloads = [damaged.data, *payloads[1:]]
        nbytes = count * plan.request.nbytes_per_page
        header = Chunk(record.room, index, index == len(plan.chunks) - 1, start, runs, nbytes, checksum, digests)
        try:
            _send_frames(self._socket, peer.identity, encode(header), payloads, self._pool)
        except zmq.Again:
            return False
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:
                raise
            self._ctx.counters.add("send_failures")
            self._fail(record, reasons.send_failed(record.room, peer.info.label), time.monotonic())
            self._lose_peer(peer, reasons.decode_peer_dead(peer.info.label), time.monotonic())
            return False
        peer.inflight += nbytes
        return True

    def _pool_slices(
        self, src_pages: PageIndices, chunks: list[tuple[int, int, list[int]]]
    ) -> list[tuple[PoolSlice, ...]]:
        """Each chunk's payloads when whole rows go: one run of the pool's own rows per run of source pages."""
        page_bytes = self._ctx.pool.page_bytes
        positions = [at for start, _, runs in chunks for at in itertools.accumulate(runs[:-1], initial=start)]
        firsts = iter(src_pages[positions].tolist())
        return [tuple((next(firsts) * page_bytes, run * page_bytes) for run in runs) for _, _, runs in chunks]

    def _columns(self, record: SenderRoom, plan: LinkPlan, start: int, runs: list[int]) -> list[Payload]:
        """One payload per run of consecutive source pages when a column slice of each page goes: copied."""
        assert record.src_pages is not None
        request = plan.request
        columns = slice(request.src_offset, request.src_offset + request.nbytes_per_page)
        payloads: list[Payload] = []
        position = start
        for run in runs:
            first = int(record.src_pages[position])
            payloads.append(np.ascontiguousarray(self._ctx.pool.data[first : first + run, columns]).reshape(-1).data)
            position += run
        return payloads

    def _bytes_of(self, payload: Payload) -> memoryview:
        """A payload's bytes, without copy."""
        return self._pool.view(*payload) if isinstance(payload, tuple) else payload

    def _checksum(self, payloads: Sequence[Payload]) -> int:
        """xxh3-64 over the payloads, in order (what the decode rank verifies)."""
        hasher = xxhash.xxh3_64()
        for payload in payloads:
            hasher.update(self._bytes_of(payload))
        return hasher.intdigest()

    def _send_status(self, peer: DecodePeer, record: SenderRoom, plan: LinkPlan | None = None) -> None:
        """The room's verdict here: its own failure, or the failure its instance agreed on after it succeeded."""
        failure, reason_class = record.failure, record.reason_class
        if record.state is not KVPoll.Failed and record.agreed is KVPoll.Failed:
            failure, reason_class = record.agreed_failure, record.agreed_reason_class
        if plan is not None:
            plan.status_sent = True
        if failure is None:
            status = Status(record.room, int(KVPoll.Success), self._ctx.info.rank)
        else:
            status = Status(
                record.room,
                int(KVPoll.Failed),
                self._ctx.info.rank,
                failure.failure_reason,
                str(reason_class),
                failure.origin or self._ctx.info.label,
                failure.suspect,
                failure.origin_class,
            )
        self._reply(peer.identity, status)

    def _reply(self, identity: bytes, message: Status | Welcome | Heartbeat | AbortAck) -> None:
        try:
            self._socket.send_multipart([identity, encode(message)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            self._ctx.counters.add("send_failures")

    # --- failures -------------------------------------------------------------------

    def fail_by_instance(self, record: SenderRoom, reason: reasons.Reason, origin: str, now: float) -> None:
        """The instance agreed the room failed elsewhere (consensus); fail it here as an echo."""
        self._fail(record, reason, now, origin=origin, from_another_rank=origin != self._ctx.info.label)

    def fail_agreed(self, record: SenderRoom, reason: reasons.Reason, origin: str) -> None:
        """The instance failed a room this rank had finished: Failed here too. Its decode peers learn it from the
        rank that failed it: this one, when it is the origin (a rank of the instance went silent or never took the
        room), tells them now (Status Failed). Before, nobody did: a decode rank of theirs still waiting for the
        silent rank heard only at its own peer timeout, and failed as an origin of its own."""
        self._ctx.fail_agreement(record, reason, origin)
        if origin != self._ctx.info.label:
            return
        for identity in record.plans:
            peer = self._peers.get(identity)
            if peer is not None and not peer.lost:
                self._send_status(peer, record)

    def _fail(
        self,
        record: SenderRoom,
        reason: reasons.Reason,
        now: float,
        origin: str = "",
        from_another_rank: bool = False,
        told_by: bytes = b"",
    ) -> None:
        """Fail a room and tell its decode ranks (Status Failed with the origin), except the one that told us."""
        origin = origin or self._ctx.info.label
        if record.fail(reason, now, origin, is_from_another_rank=from_another_rank):
            self._ctx.counters.add("rooms_failed")
            for identity in record.plans:
                peer = self._peers.get(identity)
                if peer is not None and not peer.lost and identity != told_by:
                    self._send_status(peer, record)

    def _lose_peer(self, peer: DecodePeer, reason: reasons.Reason, now: float) -> None:
        """Fail, once, every unfinished room that waits on `peer`."""
        if peer.lost:
            return
        peer.lost = True
        peer.queue.clear()
        peer.inflight = 0
        self._ctx.counters.add("peers_lost")
        for record in self.rooms.values():
            if peer.identity in record.plans:
                self._fail(record, reason, now)
