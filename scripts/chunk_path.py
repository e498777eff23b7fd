"""CPU per chunk of the engines' chunk paths against the least work, in one process: what kvtop's code adds.

`kvtop bench transfer` measures whole transfers (two processes, both engines, ZeroMQ's I/O threads, the
kernel's copies); on a shared 2-core machine its runs swing by more than the engines' own work. This script
times only the engine side of one chunk, by thread CPU time, against the least work that does the same
(the floor of `kvtop.bench.baselines`), alternated in one run:

- landing: a decode rank's `DecodeSide` reads chunks (kvtop's header, one 1 MiB payload of sealed pages)
  from an inproc socket into its pool, verifies every page's digest and acknowledges; the floor receives
  the header, lands the payload as kvtop does (`land_digested`) and compares the page digests.
- sending: a prefill rank's `PrefillSide` serves a DEALER thread that asks for the rooms and acknowledges
  every quarter window as a decode rank does (real TCP on loopback); the floor sends the same frames
  (routing id, header, zero-copy payload) under the same credit window.

The sides are driven directly (the engine thread's loop is left out): a mistake shows as a failed room or
an unverified chunk, and the script exits 1. Not part of the tests.

`--stub-landing` leaves out the copy and the hashes both landing legs share (a pool of zero pages, one
digest for all, and a `land_digested` that returns the digests): what is left is the code around the
landing, ~10 us of the ~110, without the noise of 1 MiB copied.

    .venv/bin/python scripts/chunk_path.py            # 7 alternated rounds, medians
    .venv/bin/python scripts/chunk_path.py --rounds 3
    .venv/bin/python scripts/chunk_path.py --stub-landing
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq
from xxhash import xxh3_64_digest

import transport.kv.decode
from transport.config import TransferConfig
from transport.counters import Counters
from transport.kv.decode import DecodeSide, PrefillLink
from transport.kv.engine import COUNTER_NAMES
from transport.kv.faults import FaultInjector
from transport.kv.mapping import Pairing
from transport.kv.pool import KVPool, land_digested, run_breaks
from transport.kv.prefill import PrefillSide
from transport.kv.rooms import ReceiverRoom, SenderRoom
from transport.kv.side import SideContext
from transport.kvpoll import KVPoll
from transport.wire import Ack, AgentInfo, Chunk, FrameDecoder, Hello, LinkMessage, TransferRequest, encode

PAGE = 64 << 10
CHUNK = 1 << 20
PAGES_PER_CHUNK = CHUNK // PAGE
ROOM_CHUNKS = 64
ROOMS = 32
CHUNKS = ROOMS * ROOM_CHUNKS
SLOTS = 3
WINDOW = TransferConfig().window_bytes
_FLOOR_HEADER = struct.Struct("<QIIQ")
_CONTEXT = zmq.Context()
_DECODE = AgentInfo("decode", "bench-decode", 0, 1, PAGE, "", "", 1, "localhost", 1)
_PREFILL = AgentInfo("prefill", "bench-prefill", 0, 1, PAGE, "tcp://127.0.0.1:1", "", 1, "localhost", 2)


class Failed(Exception):
    """What a leg measured did not happen (a room failed, a chunk went unverified)."""


def _slot_pages(room: int) -> np.ndarray:
    first = (room - 1) % SLOTS * ROOM_CHUNKS * PAGES_PER_CHUNK
    return np.arange(first, first + ROOM_CHUNKS * PAGES_PER_CHUNK, dtype=np.uint32)


def _sealed_pool() -> KVPool:
    pool = KVPool(SLOTS * ROOM_CHUNKS * PAGES_PER_CHUNK, PAGE)
    pool.data[:] = np.random.default_rng(1).integers(0, 256, size=pool.data.shape, dtype=np.uint8)
    pool.seal(np.arange(pool.num_pages, dtype=np.uint32))
    return pool


def _stub_landing() -> KVPool:
    """A sealed pool of zero pages, and both landing legs' `land_digested` replaced by one that neither copies nor
    hashes: it returns what the zero pages' digests are."""
    pool = KVPool(SLOTS * ROOM_CHUNKS * PAGES_PER_CHUNK, PAGE)
    pool.seal(np.arange(pool.num_pages, dtype=np.uint32))
    digests = xxh3_64_digest(bytes(PAGE)) * PAGES_PER_CHUNK

    def landed(frame: memoryview, target: memoryview, page_bytes: int) -> bytes:
        return digests

    global land_digested
    transport.kv.decode.land_digested = land_digested = landed
    return pool


def _context(pool: KVPool, info: AgentInfo) -> SideContext:
    counters = Counters(COUNTER_NAMES).for_socket("data")
    config = TransferConfig(chunk_bytes=CHUNK, window_bytes=WINDOW)
    return SideContext(info, pool, config, FaultInjector(), counters, _CONTEXT)


def _pair() -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    sender, receiver = _CONTEXT.socket(zmq.PAIR), _CONTEXT.socket(zmq.PAIR)
    sender.sndhwm = receiver.rcvhwm = 0
    name = f"inproc://chunk-path-{time.monotonic_ns()}"
    receiver.bind(name)
    sender.connect(name)
    return sender, receiver


def _queue_chunks(source: KVPool, sock: zmq.Socket[bytes]) -> None:
    """Every room's chunks as a prefill rank sends them (header, then the pool's rows zero-copy)."""
    for room in range(1, ROOMS + 1):
        pages = _slot_pages(room)
        for index in range(ROOM_CHUNKS):
            chunk_pages = pages[index * PAGES_PER_CHUNK : (index + 1) * PAGES_PER_CHUNK]
            digests = source.sealed_digests(chunk_pages) or b""
            start = index * PAGES_PER_CHUNK
            header = Chunk(room, index, index == ROOM_CHUNKS - 1, start, [PAGES_PER_CHUNK], CHUNK, None, digests)
            sock.send(encode(header), zmq.SNDMORE)
            sock.send(source.rows(int(chunk_pages[0]), PAGES_PER_CHUNK), copy=False)


def land_kvtop(source: KVPool) -> float:
    """Thread CPU us per chunk for `DecodeSide` to land, verify and acknowledge every queued chunk."""
    sender, receiver = _pair()
    ctx = _context(KVPool(source.num_pages, PAGE), _DECODE)
    side = DecodeSide(ctx, routes=None)  # type: ignore[arg-type]  # the rooms are paired below, never looked up
    link = PrefillLink(_PREFILL, receiver, last_seen=0.0, welcomed=True)
    side._links[(_PREFILL.instance, 0)] = link
    side._by_socket[receiver] = link
    acks: list[object] = []
    side._send = lambda link, message: acks.append(message)  # type: ignore[method-assign]  # acks counted, not sent
    for room in range(1, ROOMS + 1):
        record = ReceiverRoom(room, 0.0, prefill_instance=_PREFILL.instance, state=KVPoll.WaitingForInput)
        record.pairings = [Pairing(0, 0, 0, 0, PAGE, 1, 1)]
        record.dst_pages = _slot_pages(room)
        record.dst_breaks = run_breaks(record.dst_pages)
        record.bytes_total = ROOM_CHUNKS * CHUNK
        side.rooms[room] = record
    _queue_chunks(source, sender)
    started = time.thread_time()
    while ctx.counters["chunks_landed"] + ctx.counters["checksum_failures"] < CHUNKS:
        side.handle(receiver, time.monotonic())
    spent = time.thread_time() - started
    sender.close(0)
    receiver.close(0)
    if ctx.counters["checksum_failures"] or not acks:
        raise Failed(f"landing: {ctx.counters['checksum_failures']} checksum failures, {len(acks)} acks")
    return spent / CHUNKS * 1e6


def land_floor(source: KVPool) -> float:
    """The least work: receive the header, land the payload a block at a time hashing each page (as kvtop
    lands a frame larger than a block: `land_digested`), compare the pages' digests."""
    sender, receiver = _pair()
    view = KVPool(source.num_pages, PAGE).data.reshape(-1).data
    digest_bytes = 8 * PAGES_PER_CHUNK
    _queue_chunks(source, sender)
    started = time.thread_time()
    mismatched = 0
    for i in range(CHUNKS):
        header = receiver.recv()
        first = int(_slot_pages(1 + i // ROOM_CHUNKS)[(i % ROOM_CHUNKS) * PAGES_PER_CHUNK]) * PAGE
        landed = view[first : first + CHUNK]
        digests = land_digested(receiver.recv(copy=False).buffer, landed, PAGE)
        mismatched += digests != header[-digest_bytes:]  # kvtop's header ends with the page digests
    spent = time.thread_time() - started
    sender.close(0)
    receiver.close(0)
    if mismatched:
        raise Failed(f"landing floor: {mismatched} chunks failed their digests")
    return spent / CHUNKS * 1e6


def _decode_peer(endpoint: str, received: list[int]) -> None:
    """A decode rank's side of the link: hello, one request per room, an ack every quarter window."""
    sock = _CONTEXT.socket(zmq.DEALER)
    sock.routing_id = b"decode"
    sock.rcvhwm = 0
    sock.connect(endpoint)
    decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
    sock.send(encode(Hello(_DECODE, WINDOW)))
    for room in range(1, ROOMS + 1):
        sock.send(encode(TransferRequest(room, 0, _slot_pages(room).astype("<u4").tobytes(), 0, 0, PAGE, 1)))
    unacked: dict[int, int] = {}
    pending = chunks = 0
    while chunks < CHUNKS:
        frames = sock.recv_multipart(copy=False)
        message = decoder.decode(frames[0].bytes)
        if isinstance(message, Chunk):
            chunks += 1
            unacked[message.room] = unacked.get(message.room, 0) + message.nbytes
            pending += message.nbytes
            if message.last or pending >= WINDOW // 4:
                sock.send(encode(Ack(list(unacked.items()))))
                unacked.clear()
                pending = 0
    received.append(chunks)
    sock.close(0)


def send_kvtop(source: KVPool) -> float:
    """Thread CPU us per chunk for `PrefillSide` to serve every room to a decode peer under credit."""
    ctx = _context(source, _PREFILL)
    side = PrefillSide(ctx, "127.0.0.1")
    received: list[int] = []
    peer = threading.Thread(target=_decode_peer, args=(side.endpoint, received))
    peer.start()
    sock = side.sockets()[0]
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    started = time.thread_time()
    now = time.monotonic()
    for room in range(1, ROOMS + 1):
        side.send(side.attach_sender(SenderRoom(room, now)), _slot_pages(room), now)
    deadline = now + 60
    while any(not record.state.is_terminal for record in side.rooms.values()) and now < deadline:
        ready = dict(poller.poll(100))
        now = time.monotonic()
        if ready:
            side.handle(sock, now)
        side.pump(now)
    spent = time.thread_time() - started
    peer.join(10)
    side.close()
    succeeded = sum(record.state is KVPoll.Success for record in side.rooms.values())
    if succeeded != ROOMS or received != [CHUNKS]:
        raise Failed(f"sending: {succeeded} of {ROOMS} rooms succeeded, the peer received {received}")
    return spent / CHUNKS * 1e6


def _floor_peer(endpoint: str, received: list[int]) -> None:
    sock = _CONTEXT.socket(zmq.DEALER)
    sock.rcvhwm = 0
    sock.connect(endpoint)
    sock.send(b"hello")
    pending = 0
    for _ in range(CHUNKS):
        sock.recv_multipart(copy=False)
        pending += CHUNK
        if pending >= WINDOW // 4:
            sock.send(pending.to_bytes(8, "little"))
            pending = 0
    if pending:
        sock.send(pending.to_bytes(8, "little"))
    received.append(CHUNKS)
    sock.close(0)


def send_floor(source: KVPool) -> float:
    """The least work: routing id, header (with the page digests), zero-copy payload; credit read when full."""
    sock = _CONTEXT.socket(zmq.ROUTER)
    sock.router_mandatory = True
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    received: list[int] = []
    peer = threading.Thread(target=_floor_peer, args=(f"tcp://127.0.0.1:{port}", received))
    peer.start()
    view = source.data.reshape(-1).data
    stored = source.digests.tobytes()
    started = time.thread_time()
    identity = sock.recv()
    sock.recv()
    inflight = 0
    for i in range(CHUNKS):
        while inflight + CHUNK > WINDOW:
            sock.recv()
            inflight -= int.from_bytes(sock.recv(), "little")
        first = int(_slot_pages(1 + i // ROOM_CHUNKS)[(i % ROOM_CHUNKS) * PAGES_PER_CHUNK])
        header = _FLOOR_HEADER.pack(1, i, PAGES_PER_CHUNK, 0) + stored[first * 8 : (first + PAGES_PER_CHUNK) * 8]
        sock.send(identity, zmq.SNDMORE)
        sock.send(header, zmq.SNDMORE)
        sock.send(view[first * PAGE : first * PAGE + CHUNK], copy=False)
        inflight += CHUNK
    while inflight > 0:
        sock.recv()
        inflight -= int.from_bytes(sock.recv(), "little")
    spent = time.thread_time() - started
    peer.join(10)
    sock.close(0)
    if received != [CHUNKS]:
        raise Failed(f"sending floor: the peer received {received}")
    return spent / CHUNKS * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds; figures are medians")
    parser.add_argument("--stub-landing", action="store_true", help="leave out the landing's copy and hashes")
    args = parser.parse_args()
    rounds = args.rounds
    source = _stub_landing() if args.stub_landing else _sealed_pool()
    legs: dict[str, Callable[[KVPool], float]] = {
        "landing kvtop": land_kvtop,
        "landing floor": land_floor,
        "sending kvtop": send_kvtop,
        "sending floor": send_floor,
    }
    runs: dict[str, list[float]] = {name: [] for name in legs}
    try:
        for _ in range(rounds):
            for name, leg in legs.items():
                runs[name].append(leg(source))
    except Failed as failed:
        print(f"chunk_path: FAILED: {failed}", file=sys.stderr)
        return 1
    medians = {name: statistics.median(values) for name, values in runs.items()}
    stubbed = " (the landing's copy and hashes left out)" if args.stub_landing else ""
    print(f"CPU us per {CHUNK >> 20} MiB chunk of sealed pages{stubbed}, medians of {rounds} alternated rounds:")
    for side in ("landing", "sending"):
        kvtop, floor = medians[f"{side} kvtop"], medians[f"{side} floor"]
        print(f"  {side}: kvtop {kvtop:.1f}, least work {floor:.1f}, kvtop adds {kvtop - floor:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
