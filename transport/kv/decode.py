"""The decode side of the engine: resolve prefill ranks, request KV, land chunks in the pool.

One DEALER socket per prefill rank this decode rank talks to. Chunk payloads
land in the destination pages directly whenever the pages are consecutive whole
rows (sealed pages copied and hashed a block at a time, others received in
place with `recv_into`); otherwise through one scratch buffer. A chunk of sealed
pages into a room whose pages are one run takes a short path (`_land_run`).
Every landed chunk is verified (each page against the digest its writer sealed
it with, or the whole chunk against the sender's checksum) and acknowledged,
which returns its bytes of credit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import xxhash
import zmq
from xxhash import xxh3_64_digest

from transport.curve import dialing
from transport.errors import ConfigError, FrameRejected, KVTransferError
from transport.kv import reasons
from transport.kv.mapping import Pairing, pairings_for_decode_rank
from transport.kv.pool import LAND_BLOCK_BYTES, PageIndices, is_one_run, land_digested, run_breaks
from transport.kv.rooms import ReceiverRoom
from transport.kv.routes import RouteBook
from transport.kv.side import SideContext
from transport.kvpoll import KVPoll
from transport.plane.events import AbortEvent
from transport.sockets import data_frame_bound, drain_message, open_socket, send_now
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

_BATCH = 64
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = zmq.RCVMORE
"""The enum member, not its int: pyzmq converts an int option to its enum by a lookup on every question."""
_RESOLVE_RETRY_S = 0.25


@dataclass(eq=False)
class PrefillLink:
    """This decode rank's connection to one prefill rank."""

    info: AgentInfo
    socket: zmq.Socket[bytes]
    last_seen: float
    last_ping: float = 0.0
    welcomed: bool = False
    rooms: set[int] = field(default_factory=set)
    landed: dict[int, int] = field(default_factory=dict)
    """Bytes landed per room since the last ack."""
    unacked: int = 0


def _described_pages(chunk: Chunk, pairing: Pairing | None) -> int:
    """How many pages a chunk header describes; 0 when it cannot describe pages of this link."""
    if chunk.page_start < 0 or not chunk.frame_pages or min(chunk.frame_pages) <= 0:
        return 0
    pages = sum(chunk.frame_pages)
    if pairing is not None and chunk.nbytes != pages * pairing.nbytes:
        return 0
    return pages


class DecodeSide:
    """Engine-thread state of a decode rank."""

    def __init__(self, ctx: SideContext, routes: RouteBook) -> None:
        self._ctx = ctx
        self._routes = routes
        self._links: dict[tuple[str, int], PrefillLink] = {}
        self._by_socket: dict[zmq.Socket[bytes], PrefillLink] = {}
        self.rooms: dict[int, ReceiverRoom] = {}
        self.socket_generation = 0
        """Bumped whenever `sockets()` changes, so the loop re-registers only then."""
        self._link_decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
        self._ack_bytes = ctx.config.window_bytes // 4
        """Unacknowledged bytes on a link that send an ack (see `_credit`)."""
        self._pool_bytes = ctx.pool.rows(0, ctx.pool.num_pages)

    # --- scheduler commands ---------------------------------------------------------

    def add_receiver(self, record: ReceiverRoom, now: float) -> None:
        self._ctx.cleared.pop(record.room, None)
        self.rooms[record.room] = record
        self._ctx.observe(record, peer=record.prefill_instance)
        self._advance(record, now)

    def refuse(
        self, room: int, prefill_instance: str, now: float, holding_up: str = "", silent_s: float = 0.0
    ) -> KVTransferError | None:
        """The scheduler refused `room` here (no pages for it): the room fails on this rank now, its origin. This
        instance's other ranks learn it by consensus and tell the room's prefill ranks (this rank never paired with
        them), so no rank holds the room's pages until a timeout. `holding_up`: a rank of this instance that
        stopped voting `silent_s` ago, whose rooms filled the pool (the refusal's suspect; else this rank is). Returns
        the room's failure (None when the room was live here after all, or already decided)."""
        record = self.rooms.get(room)
        if record is None:
            record = self.rooms[room] = ReceiverRoom(room, now, prefill_instance=prefill_instance)
        elif record.dst_pages is not None or record.state.is_terminal:  # live here after all, or already decided
            return None
        self._ctx.observe(record, peer=prefill_instance)
        self._fail(record, reasons.pool_full(room, self._ctx.info, holding_up, silent_s), now)
        return record.failure

    def init(self, record: ReceiverRoom, pages: PageIndices, now: float) -> None:
        record.dst_pages = pages
        record.dst_breaks = run_breaks(pages)
        record.lanes.clear()
        self._advance(record, now)

    def abort(self, record: ReceiverRoom, now: float) -> None:
        self._fail(record, reasons.aborted(), now)

    def release(self, room: int) -> None:
        record = self.rooms.pop(room, None)
        if record is not None:
            self._ctx.remember_cleared(room)
            for link in self._links.values():
                link.rooms.discard(room)

    # --- loop hooks -----------------------------------------------------------------

    def sockets(self) -> list[zmq.Socket[bytes]]:
        return list(self._by_socket)

    def handle(self, sock: zmq.Socket[bytes], now: float) -> None:
        self._read_link(self._by_socket[sock], now)

    def _read_link(self, link: PrefillLink, now: float) -> None:
        """Read a batch of the link's messages. What landed is settled (counters, progress, completion) once
        per run of chunks: before any other message is handled, and at the end of the batch."""
        sock = link.socket
        recv = sock.recv
        decode = self._link_decoder.decode
        landed: dict[int, ReceiverRoom] = {}
        landed_chunks = landed_bytes = 0
        for _ in range(_BATCH):
            try:
                header = recv(_NOBLOCK, copy=False)  # a frame tells whether more follow: no RCVMORE question
            except zmq.Again:
                break  # tried, not asked: one exception a batch costs less than a ZMQ_EVENTS question a message
            try:
                message = decode(header.buffer)
            except FrameRejected as rejected:
                self._ctx.counters.reject(rejected.reason)
                drain_message(sock)
                continue
            link.last_seen = now
            if type(message) is Chunk:
                record = self._land(link, message, header.more, now)
                if record is not None:
                    landed[record.room] = record
                    landed_chunks += 1
                    landed_bytes += message.nbytes
                continue
            if header.more:
                drain_message(sock)
                self._ctx.counters.reject("unexpected")
            if landed:
                self._settle(landed, landed_chunks, landed_bytes, now)
                landed, landed_chunks, landed_bytes = {}, 0, 0
            self._on_message(link, message, now)
            if link.socket not in self._by_socket:
                break
        if landed:
            self._settle(landed, landed_chunks, landed_bytes, now)

    def _settle(self, landed: dict[int, ReceiverRoom], chunks: int, nbytes: int, now: float) -> None:
        """Count the chunks that landed, publish their rooms' progress and finish the rooms they completed."""
        self._ctx.counters.add_with_bytes("chunks_landed", "bytes_landed", nbytes, chunks)
        for record in landed.values():
            if not record.state.is_terminal:  # a room may have failed later in the run
                self._ctx.progress(record, now)
                self._finish_if_complete(record, now)

    def pump(self, now: float) -> float | None:
        return None

    def tick(self, now: float) -> None:
        config = self._ctx.config
        for link in list(self._links.values()):
            self._flush_acks(link)
            if now - link.last_seen > config.peer_timeout_s:
                self._lose_link(link, now)
            elif now - link.last_ping >= config.heartbeat_s:
                link.last_ping = now
                self._send(link, Heartbeat(time.time()))
        timeouts = config.timeouts
        stagger = self._ctx.stagger_s
        for record in list(self.rooms.values()):
            state = record.state
            if state is KVPoll.Bootstrapping:
                self._advance(record, now)
                if now - record.created_at > timeouts.bootstrap_s + stagger:
                    reason = reasons.timed_out(record.room, now - record.created_at, state, self._awaited(record))
                    self._fail(record, reason, now)
            elif state is KVPoll.WaitingForInput and now - record.entered_at > timeouts.waiting_s + stagger:
                reason = reasons.timed_out(record.room, now - record.entered_at, state, self._awaited(record))
                self._fail(record, reason, now)
            elif state is KVPoll.Transferring and now - record.progress_at > timeouts.transfer_s + stagger:
                reason = reasons.timed_out(record.room, now - record.progress_at, state, self._awaited(record))
                self._fail(record, reason, now)

    def _awaited(self, record: ReceiverRoom) -> str:
        """What a room that times out waits for: the prefill rank that has not reported it (the instance when
        several have not, or when the room never paired); when every one reported it sent all, the bytes are what
        is missing: its senders (a chunk lost on the way named the whole instance before)."""
        if not record.pairings:
            return record.prefill_instance
        senders = {p.prefill_rank for p in record.pairings}
        pending = senders - record.statuses_ok or senders
        labels = {f"{record.prefill_instance}/TP{rank}" for rank in pending}
        return reasons.common_suspect(labels) or record.prefill_instance

    def close(self) -> None:
        for link in self._links.values():
            link.socket.close(linger=0)

    # --- handshake ------------------------------------------------------------------

    def _advance(self, record: ReceiverRoom, now: float) -> None:
        """Move a room through the handshake as far as what is known allows."""
        if record.state is KVPoll.Bootstrapping:
            if not record.pairings and not self._pair(record, now):
                return
            links = [self._link_for(p.prefill_rank, record) for p in record.pairings]
            if not all(link is not None and link.welcomed for link in links):
                return
            record.move(KVPoll.WaitingForInput, now)
        if record.state is KVPoll.WaitingForInput and record.dst_pages is not None and not record.requests_sent:
            self._request(record)

    def _pair(self, record: ReceiverRoom, now: float) -> bool:
        ranks = self._routes.lookup(record.prefill_instance, now)
        if ranks is None:
            return False
        info = self._ctx.info
        try:
            record.pairings = pairings_for_decode_rank(
                info.rank, info.tp, info.page_bytes, ranks[0].tp, ranks[0].page_bytes
            )
        except ConfigError as error:
            self._fail(record, reasons.layout_mismatch(record.room, str(error)), now)
            return False
        for pairing in record.pairings:
            self._connect(ranks[pairing.prefill_rank], now).rooms.add(record.room)
        return True

    def _connect(self, info: AgentInfo, now: float) -> PrefillLink:
        key = (info.instance, info.rank)
        link = self._links.get(key)
        if link is not None and link.info.incarnation == info.incarnation:
            return link
        if link is not None:
            self._drop_link(link)
        bound = data_frame_bound(self._ctx.config.chunk_bytes, self._ctx.pool.page_bytes)
        sock = open_socket(self._ctx.context, zmq.DEALER, bound, dialing(self._ctx.curve))
        sock.routing_id = f"{self._ctx.info.label}#{self._ctx.info.incarnation:x}".encode()
        sock.rcvhwm = 100_000
        sock.connect(info.data_endpoint)
        link = PrefillLink(info, sock, last_seen=now, last_ping=now)
        self._links[key] = link
        self._by_socket[sock] = link
        self.socket_generation += 1
        self._send(link, Hello(self._ctx.info, self._ctx.config.window_bytes))
        return link

    def _link_for(self, prefill_rank: int, record: ReceiverRoom) -> PrefillLink | None:
        return self._links.get((record.prefill_instance, prefill_rank))

    def _request(self, record: ReceiverRoom) -> None:
        assert record.dst_pages is not None
        record.requests_sent = True
        record.bytes_total = sum(len(record.dst_pages) * p.nbytes for p in record.pairings)
        for pairing in record.pairings:
            link = self._link_for(pairing.prefill_rank, record)
            assert link is not None
            request = TransferRequest(
                record.room,
                self._ctx.info.rank,
                record.dst_pages.astype("<u4").tobytes(),
                pairing.src_offset,
                pairing.dst_offset,
                pairing.nbytes,
                pairing.requests_expected,
            )
            self._send(link, request)

    # --- messages -------------------------------------------------------------------

    def _on_message(self, link: PrefillLink, message: LinkMessage, now: float) -> None:
        if isinstance(message, Welcome):
            link.welcomed = True
            for room in list(link.rooms):
                record = self.rooms.get(room)
                if record is not None and record.abort is not None:  # it failed while the link came up
                    self._send_abort(link, record.abort)
                elif record is not None:
                    self._advance(record, now)
        elif isinstance(message, Status):
            self._on_status(link, message, now)
        elif isinstance(message, AbortAck):
            record = self.rooms.get(message.room)
            if record is not None:
                record.abort_acks.add(message.rank)
            self._ctx.counters.add("abort_acks")
        elif not isinstance(message, Heartbeat):
            self._ctx.counters.reject("unexpected")

    def _on_status(self, link: PrefillLink, status: Status, now: float) -> None:
        record = self.rooms.get(status.room)
        if record is None:
            if status.state == KVPoll.Failed:
                self._ctx.counters.add("late_failures")
            return
        if status.state == KVPoll.Success:
            record.statuses_ok.add(status.rank)
            self._finish_if_complete(record, now)
        elif status.state == KVPoll.Failed and record.state is KVPoll.Success:
            self._fail_finished(link, record, status)
        elif status.state == KVPoll.Failed:
            self._fail(
                record,
                reasons.prefill_failed(status.suspect, status.origin_class),
                now,
                origin=status.origin or link.info.label,
                tell_prefill=False,
            )

    def _fail_finished(self, link: PrefillLink, record: ReceiverRoom, status: Status) -> None:
        """The prefill instance failed a room this rank had received (it agreed after its rank sent all): Failed
        here too, an echo of its origin, unless this instance agreed first (on Success: counted, a late failure).
        This rank's votes carry it, so a rank of this instance still waiting on another prefill rank of the room
        (a dead one) hears it at once. A rank alone (TP 1) agreed the moment the room succeeded here, though the
        engine records it at its next tick: before, a Failed status read before that tick failed the agreement, and
        the tick set it back to Success."""
        agreed = KVPoll.Success if self._ctx.info.tp == 1 else record.agreed
        if agreed is KVPoll.Success:
            self._ctx.counters.add("late_failures")
        if agreed.is_terminal:
            return
        reason = reasons.prefill_failed(status.suspect, status.origin_class)
        self._ctx.fail_agreement(record, reason, status.origin or link.info.label)

    def _land(self, link: PrefillLink, chunk: Chunk, more: bool, now: float) -> ReceiverRoom | None:
        """Receive a chunk's payload frames into the room's pages and verify them (`more`: frames follow the
        header); the room when it landed whole and verified (its counters, progress and completion are the
        caller's, once per batch).

        A chunk of sealed pages that is one frame of whole rows into a room whose pages are one run (what a
        rank sends by default) lands on the short path, `_land_run`: the same checks and outcomes, in fewer
        steps (each runs cache-cold after the last chunk's megabyte of copying and hashing)."""
        record = self.rooms.get(chunk.room)
        if record is not None:
            lane = record.lanes.get(link.info.rank)
            if lane is None:
                lane = self._lane(record, link.info.rank)
            if lane and len(chunk.frame_pages) == 1 and not record.state.is_terminal:
                return self._land_run(link, record, chunk, lane, more, now)
        return self._land_any(link, record, chunk, more, now)

    def _lane(self, record: ReceiverRoom, rank: int) -> tuple[int, ...]:
        """`record.lanes[rank]`, worked out (and kept once the room's pages and pairing are known)."""
        pairing = record.pairing_from(rank)
        pages = record.dst_pages
        if pairing is None or pages is None:
            return ()
        page_bytes = self._ctx.pool.page_bytes
        one_run = pairing.dst_offset == 0 and pairing.nbytes == page_bytes and not record.dst_breaks and len(pages)
        lane = (pages.item(0) * page_bytes, page_bytes, len(pages)) if one_run else ()
        record.lanes[rank] = lane
        return lane

    def _land_run(
        self, link: PrefillLink, record: ReceiverRoom, chunk: Chunk, lane: tuple[int, ...], more: bool, now: float
    ) -> ReceiverRoom | None:
        """`_land` for a chunk of one frame into a lane (`ReceiverRoom.lanes`); a header that is not one of
        sealed pages inside the lane, or that ends before its payload, goes the whole way (`_land_any`)."""
        offset, width, room_pages = lane
        start = chunk.page_start
        pages = chunk.frame_pages[0]
        nbytes = pages * width
        digests = chunk.page_digests
        sock = link.socket
        if (
            start < 0
            or pages <= 0
            or start + pages > room_pages
            or chunk.nbytes != nbytes
            or len(digests) != 8 * pages
            or not more
        ):
            return self._land_any(link, record, chunk, more, now)
        frame = sock.recv(copy=False)
        if len(frame) != nbytes:
            self._failed_landing(link, record, chunk, self._wrong_size(sock, len(frame), nbytes), now)
            return None
        first = offset + start * width
        target = self._pool_bytes[first : first + nbytes]
        if pages == 1:  # one page, copied then hashed while in the cache: no blocks to walk (1.3 us less at 64 KiB)
            target[:] = frame.buffer
            actual = xxh3_64_digest(target)
        else:
            actual = land_digested(frame.buffer, target, width)
        if frame.more:
            drain_message(sock)
            self._ctx.counters.reject("unexpected")
        return self._landed(link, record, chunk, None, actual, now)

    def _wrong_size(self, sock: zmq.Socket[bytes], received: int, expected: int) -> str:
        """A payload frame of the wrong size: the rest of its message dropped, counted; what went wrong."""
        drain_message(sock)
        self._ctx.counters.reject("oversize" if received > expected else "truncated")
        return f"frame of {received} B for {expected} B"

    def _failed_landing(self, link: PrefillLink, record: ReceiverRoom, chunk: Chunk, problem: str, now: float) -> None:
        """A chunk whose frames do not fit the room's pages: the room fails (its credit still returns)."""
        self._fail(record, reasons.layout_mismatch(record.room, problem), now)
        self._credit(link, chunk)

    def _land_any(
        self, link: PrefillLink, record: ReceiverRoom | None, chunk: Chunk, more: bool, now: float
    ) -> ReceiverRoom | None:
        """`_land` for any chunk: frames of column slices, pages in several runs, per-chunk checksums or none, and
        every header that does not describe this link's pages."""
        pairing = record.pairing_from(link.info.rank) if record is not None else None
        sock = link.socket
        pages = _described_pages(chunk, pairing)
        if pages == 0:
            drain_message(sock)
            self._ctx.counters.reject("malformed")  # a header that cannot describe this link's pages
            return None
        if record is None or pairing is None or record.dst_pages is None or record.state.is_terminal:
            dropped = drain_message(sock)
            self._ctx.counters.add("late_chunks")
            self._credit(link, chunk)
            if dropped != len(chunk.frame_pages):
                self._ctx.counters.reject("truncated")
            return None
        digests = chunk.page_digests
        if chunk.page_start + pages > len(record.dst_pages) or (digests and len(digests) != 8 * pages):
            drain_message(sock)
            self._ctx.counters.reject("malformed")  # pages past the room's end, or digests for other pages
            self._credit(link, chunk)
            return None
        hasher = xxhash.xxh3_64() if chunk.checksum is not None and not digests else None
        problem, actual, more = self._receive_payloads(sock, record, pairing, chunk, hasher, more)
        if problem:
            self._failed_landing(link, record, chunk, problem, now)
            return None
        if more:
            drain_message(sock)
            self._ctx.counters.reject("unexpected")
        return self._landed(link, record, chunk, hasher, actual, now)

    def _landed(
        self,
        link: PrefillLink,
        record: ReceiverRoom,
        chunk: Chunk,
        hasher: xxhash.xxh3_64 | None,
        actual: bytes,
        now: float,
    ) -> ReceiverRoom | None:
        """A chunk's payload is in the room's pages: verify it (`actual`: the landed pages' digests, or b'' with
        `hasher`), return its credit and count its bytes; the room, or None when the chunk failed it."""
        digests = chunk.page_digests
        if chunk.index == 1 or chunk.last:  # the only fault a decode rank acts on: die while landing the room
            self._ctx.inject_die(self._ctx.faults.pick(record.room, link.info.label))
        if not digests or actual != digests:
            mismatch = self._mismatch(link, chunk, hasher, actual)
            if mismatch is not None:
                self._ctx.counters.add("checksum_failures")
                self._fail(record, mismatch, now)
                self._credit(link, chunk)  # after the ABORT, so the prefill never sees this chunk acked first
                return None
        self._credit(link, chunk)
        record.bytes_done += chunk.nbytes
        record.progress_at = now
        if record.state is not KVPoll.Transferring:
            record.move(KVPoll.Transferring, now)
        return record

    def _mismatch(
        self, link: PrefillLink, chunk: Chunk, hasher: xxhash.xxh3_64 | None, actual: bytes
    ) -> reasons.Reason | None:
        """Why the landed chunk is not what was sent (a checksum failure naming the sender), or None; a chunk
        that carries no checksum counts as unverified. `actual`: the landed pages' digests (with `page_digests`)."""
        room, index, rank, sender = chunk.room, chunk.index, link.info.rank, link.info.label
        if chunk.page_digests:
            expected_digests = chunk.page_digests
            page = next(i for i in range(0, len(actual), 8) if actual[i : i + 8] != expected_digests[i : i + 8]) // 8
            expected = int.from_bytes(expected_digests[8 * page : 8 * page + 8], "big")
            got = int.from_bytes(actual[8 * page : 8 * page + 8], "big")
            return reasons.checksum_mismatch(room, index, rank, expected, got, sender, chunk.page_start + page)
        if hasher is None or chunk.checksum is None:
            self._ctx.counters.add("chunks_unverified")
            return None
        if (actual_sum := hasher.intdigest()) == chunk.checksum:
            return None
        return reasons.checksum_mismatch(room, index, rank, chunk.checksum, actual_sum, sender)

    def _receive_payloads(
        self,
        sock: zmq.Socket[bytes],
        record: ReceiverRoom,
        pairing: Pairing,
        chunk: Chunk,
        hasher: xxhash.xxh3_64 | None,
        more: bool,
    ) -> tuple[str, bytes, bool]:
        """Receive each payload frame into its pages (`more`: frames follow the header), hashing the frame
        (`hasher`) or, when the chunk carries `page_digests`, each page; (what went wrong (counted) or '', the
        landed pages' digests or b'', whether the message has frames beyond them).

        Consecutive whole rows are received in place (a frame of more than a block, with page digests, is
        copied and hashed a block at a time: `land_digested`); anything else through a scratch buffer.
        """
        dst_pages = record.dst_pages
        assert dst_pages is not None
        pool = self._ctx.pool
        width = pairing.nbytes
        whole_rows = pairing.dst_offset == 0 and width == pool.page_bytes
        by_page = bool(chunk.page_digests)
        breaks = record.dst_breaks
        digests: list[bytes] = []
        position = chunk.page_start
        for count in chunk.frame_pages:
            if not more:
                self._ctx.counters.reject("truncated")
                return "chunk ended before its pages", b"", False
            scratch = None
            if whole_rows and (not breaks or is_one_run(breaks, position, count)):
                target = pool.rows(dst_pages.item(position), count)
            else:
                scratch = np.empty(count * width, dtype=np.uint8)
                target = scratch.data
            frame = None
            if by_page and scratch is None and len(target) > LAND_BLOCK_BYTES:  # landed a block at a time
                received_frame = sock.recv(copy=False)
                more = received_frame.more
                frame = received_frame.buffer
                received = len(frame)
            else:
                received = sock.recv_into(target)
                more = bool(sock.getsockopt(_RCVMORE))
            if received != len(target):
                return self._wrong_size(sock, received, len(target)), b"", False
            if frame is not None:
                digests.append(land_digested(frame, target, width))
            elif by_page:
                digests += [xxh3_64_digest(target[o : o + width]) for o in range(0, len(target), width)]
            elif hasher is not None:
                hasher.update(target)
            if scratch is not None:
                rows = dst_pages[position : position + count]
                pool.data[rows, pairing.dst_offset : pairing.dst_offset + width] = scratch.reshape(count, width)
            position += count
        return "", b"".join(digests), more

    def _credit(self, link: PrefillLink, chunk: Chunk) -> None:
        """Owe the prefill rank this chunk's bytes (landed or not, the credit returns).

        Acks are coalesced: one per quarter window, at a room's last chunk, and on every tick,
        so the prefill rank never waits on credit that the decode rank is sitting on.
        """
        link.landed[chunk.room] = link.landed.get(chunk.room, 0) + chunk.nbytes
        link.unacked += chunk.nbytes
        if chunk.last or link.unacked >= self._ack_bytes:
            self._flush_acks(link)

    def _flush_acks(self, link: PrefillLink) -> None:
        if link.landed:
            self._send(link, Ack(list(link.landed.items())))
            link.landed.clear()
            link.unacked = 0

    def _finish_if_complete(self, record: ReceiverRoom, now: float) -> None:
        if record.complete and record.move(KVPoll.Success, now):
            self._ctx.counters.add("rooms_succeeded")

    # --- failures -------------------------------------------------------------------

    def fail_by_instance(self, record: ReceiverRoom, reason: reasons.Reason, origin: str, now: float) -> None:
        """The instance agreed the room failed elsewhere (consensus); fail it here and tell prefill."""
        self._fail(record, reason, now, origin=origin, from_another_rank=origin != self._ctx.info.label)

    def _fail(
        self,
        record: ReceiverRoom,
        reason: reasons.Reason,
        now: float,
        origin: str = "",
        tell_prefill: bool = True,
        from_another_rank: bool = False,
    ) -> None:
        """Fail a room; tell its prefill ranks with ABORT (carrying the origin) unless they told us."""
        origin = origin or self._ctx.info.label
        if not record.fail(reason, now, origin, is_from_another_rank=from_another_rank):
            return
        self._ctx.counters.add("rooms_failed")
        if tell_prefill:
            self._tell_prefill(record, reason, origin)

    def fail_agreed(self, record: ReceiverRoom, reason: reasons.Reason, origin: str) -> None:
        """The instance failed a room this rank had finished: Failed here too, and its prefill ranks are told (those
        of the instance's other ranks may still wait for a request that never comes, and would time out as origins
        of their own)."""
        self._ctx.fail_agreement(record, reason, origin)
        self._tell_prefill(record, reason, origin)

    def _tell_prefill(self, record: ReceiverRoom, reason: reasons.Reason, origin: str) -> None:
        """ABORT, carrying the origin, to each prefill rank of the room: now where its link is up, else once it is.
        A room that fails before its handshake (refused, or failed by its instance meanwhile) pairs first: its
        prefill ranks would otherwise wait for its requests until their own timeout, and name this side for it."""
        record.abort = abort = Abort(
            record.room, reason.text, str(reason.reason_class), origin, reason.suspect, reason.origin_class
        )
        if not record.pairings and record.prefill_instance:
            self._pair(record, time.monotonic())
        for pairing in record.pairings:
            link = self._link_for(pairing.prefill_rank, record)
            if link is not None and link.welcomed:
                self._send_abort(link, abort)

    def _send_abort(self, link: PrefillLink, abort: Abort) -> None:
        self._send(link, abort)
        self._ctx.counters.add("aborts_sent")
        self._ctx.emit(AbortEvent(time.time(), abort.room, "sent", link.info.label, abort.origin))

    def _lose_link(self, link: PrefillLink, now: float) -> None:
        """A silent prefill rank: fail its unfinished rooms once, forget its route."""
        self._ctx.counters.add("peers_lost")
        reason = reasons.prefill_peer_lost(link.info.data_endpoint.removeprefix("tcp://"), link.info.label)
        self._drop_link(link)
        self._routes.forget(link.info.instance)
        for room in link.rooms:
            record = self.rooms.get(room)
            if record is not None:
                self._fail(record, reason, now)

    def _drop_link(self, link: PrefillLink) -> None:
        self._links.pop((link.info.instance, link.info.rank), None)
        self._by_socket.pop(link.socket, None)
        self.socket_generation += 1
        link.socket.close(linger=0)

    def _send(self, link: PrefillLink, message: Hello | Heartbeat | TransferRequest | Ack | Abort) -> None:
        if not send_now(link.socket, encode(message)):
            self._ctx.counters.add("send_failures")
