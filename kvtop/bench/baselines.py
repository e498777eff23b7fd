"""The legs of `kvtop bench transfer` without kvtop code: raw pyzmq and the protocol's least work.

- raw: PUSH sends zero-copy frames of `chunk_bytes` from a numpy buffer; PULL
  lands each with `recv_into` in a numpy buffer (the least work that moves
  bytes from one pool into another with pyzmq); "registered": the same, its
  frames sent as registered memory, as a prefill rank sends its pool
  (`transport.kv.registered`: no pyzmq garbage-collector round trip per frame);
- floor: ROUTER to DEALER, kvtop's frames (routing id, a small header, the
  payload as registered memory) sent frame by frame with SNDMORE, blocking, credit read
  only when the window is full (no per-chunk poll); the receiver lands the
  payload with `recv_into` and acks per quarter window. It verifies what kvtop
  verifies ("chunk": xxh3 of each chunk, hashed by the sender), nothing
  ("none"), or end-to-end page checksums ("page": each page hashed when it is
  written, before anything moves, as a forward pass would; the digests ride in
  the header; each landed page is verified: no hash on the sender's path; a
  chunk of more than a block is copied and hashed a block at a time, as a
  decode rank lands it: `transport.kv.pool.land_digested`).

Each returns a `Leg`: wall and CPU seconds of both processes for its bytes.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from typing import Literal

import numpy as np
import numpy.typing as npt
import zmq
from xxhash import xxh3_64_digest as xxh3_digest
from xxhash import xxh3_64_intdigest

from kvtop.bench import BenchFailed
from kvtop.bench.child import Child
from kvtop.bench.cpu import CpuMeter, Leg
from transport.kv.pool import LAND_BLOCK_BYTES, land_digested
from transport.kv.registered import RegisteredMemory

PAGE_BYTES_MAX = 64 << 10
"""The bench's page size for chunks of 64 KiB and more (kvtop moves whole pages)."""

Check = Literal["chunk", "none", "page"]
"""What the floor verifies (module docstring)."""


def page_bytes(chunk_bytes: int) -> int:
    """The page size of every leg at this chunk size: the chunk itself up to 64 KiB."""
    return min(chunk_bytes, PAGE_BYTES_MAX)


def source_buffer(chunk_bytes: int, buffer_bytes: int) -> npt.NDArray[np.uint8]:
    """The bytes a sender cycles through: random, as big as a pool (each leg's are the same)."""
    return np.random.default_rng(1).integers(0, 256, size=max(chunk_bytes, buffer_bytes), dtype=np.uint8)


def target_buffer(chunk_bytes: int, buffer_bytes: int) -> npt.NDArray[np.uint8]:
    """A landing buffer with every page touched, as a registered KV pool's are (no page faults when timed)."""
    target = np.empty(max(chunk_bytes, buffer_bytes), dtype=np.uint8)
    target.fill(0)
    return target


@contextlib.contextmanager
def _sender_socket(kind: int) -> Iterator[zmq.Socket[bytes]]:
    """A sending leg's socket. Leaving normally, whatever it queued is delivered first (its receiver counts every
    byte); stopped (a Ctrl-C), what is queued is dropped: its receiver stopped too, and waiting to deliver to it kept
    the process alive for good."""
    context = zmq.Context()
    sock = context.socket(kind)
    linger = 0
    try:
        yield sock
        linger = -1
    finally:
        sock.close(linger=linger)
        context.term()


def _raw_sender(endpoint: str, chunk_bytes: int, total_bytes: int, buffer_bytes: int, registered: bool) -> None:
    with _sender_socket(zmq.PUSH) as sock:
        sock.connect(endpoint)
        source = source_buffer(chunk_bytes, buffer_bytes)
        view = source.data
        memory = RegisteredMemory(view)
        slots = len(source) // chunk_bytes
        for i in range(total_bytes // chunk_bytes):
            start = (i % slots) * chunk_bytes
            if registered:
                memory.send(sock, start, chunk_bytes, 0)
            else:
                sock.send(view[start : start + chunk_bytes], copy=False)


def run_raw(chunk_bytes: int, total_bytes: int, buffer_bytes: int, registered: bool = False) -> Leg:
    """Seconds (wall and CPU) to receive `total_bytes` in `chunk_bytes` messages with `recv_into`, cycling
    through buffers; sent with pyzmq's zero-copy send, or as registered memory."""
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    target = target_buffer(chunk_bytes, buffer_bytes)
    view = target.data
    slots = len(target) // chunk_bytes
    sender = Child(
        target=_raw_sender, args=(f"tcp://127.0.0.1:{port}", chunk_bytes, total_bytes, buffer_bytes, registered)
    )
    sender.start()
    meter = CpuMeter(sender.pid)
    try:
        sock.recv_into(view[:chunk_bytes])
        meter.start()
        started = time.perf_counter()
        for i in range(1, total_bytes // chunk_bytes):
            start = (i % slots) * chunk_bytes
            sock.recv_into(view[start : start + chunk_bytes])
        timed = meter.stop_leg(time.perf_counter() - started)
    finally:
        sender.join(30)
        if sender.is_alive():
            sender.kill()
        sock.close()
        context.term()
    return timed.scaled((total_bytes // chunk_bytes) / max(1, total_bytes // chunk_bytes - 1))


_HEADER = struct.Struct("<QIIQ")
"""The floor's chunk header: room, chunk index, pages, xxh3-64 of the payload (0 when none); page digests
follow it with check "page". kvtop's msgpack `Chunk` header carries the same and the page runs."""


def page_digests(buffer: npt.NDArray[np.uint8], page_bytes: int) -> bytes:
    """xxh3-64 of each page of `buffer`, 8 bytes each in page order: what a writer stores beside its pages."""
    view = buffer.data
    return b"".join(xxh3_digest(view[o : o + page_bytes]) for o in range(0, len(buffer) - page_bytes + 1, page_bytes))


def write_hash_gbps(chunk_bytes: int, buffer_bytes: int) -> float:
    """GB/s of hashing every page as it is written (the cost end-to-end checksums move to the writer)."""
    source = source_buffer(chunk_bytes, buffer_bytes)
    started = time.perf_counter()
    page_digests(source, page_bytes(chunk_bytes))
    return len(source) / (time.perf_counter() - started) / 1e9


def _floor_sender(
    endpoint: str, chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int, check: Check
) -> None:
    """The least work that sends kvtop's frames: [routing id, header, payload] per chunk, blocking sends,
    the payload as registered memory, credit read only when the window is full (no per-chunk poll)."""
    with _sender_socket(zmq.ROUTER) as sock:
        sock.router_mandatory = True
        sock.connect(endpoint)
        source = source_buffer(chunk_bytes, buffer_bytes)
        view = source.data
        memory = RegisteredMemory(view)
        slots = len(source) // chunk_bytes
        pages = chunk_bytes // page_bytes(chunk_bytes)
        stored = page_digests(source, page_bytes(chunk_bytes)) if check == "page" else b""  # at write time
        identity = sock.recv()
        sock.recv()  # the receiver's hello
        more = zmq.SNDMORE
        inflight = 0
        for i in range(total_bytes // chunk_bytes):
            while inflight + chunk_bytes > window_bytes:
                sock.recv()
                inflight -= int.from_bytes(sock.recv(), "little")  # an ack returns credit
            slot = i % slots
            payload = view[slot * chunk_bytes : (slot + 1) * chunk_bytes]
            if check == "chunk":
                header = _HEADER.pack(1, i, pages, xxh3_64_intdigest(payload))
            elif check == "page":
                header = _HEADER.pack(1, i, pages, 0) + stored[slot * pages * 8 : (slot + 1) * pages * 8]
            else:
                header = _HEADER.pack(1, i, pages, 0)
            sock.send(identity, more)
            sock.send(header, more)
            memory.send(sock, slot * chunk_bytes, chunk_bytes, 0)
            inflight += chunk_bytes
        while inflight > 0:  # every byte acked before leaving, so the receiver's last acks find this socket
            sock.recv()
            inflight -= int.from_bytes(sock.recv(), "little")


def run_floor(chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int, check: Check = "chunk") -> Leg:
    """Seconds (wall and CPU) to receive `total_bytes` through the protocol's least work in pure pyzmq
    (module docstring)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = sock.rcvtimeo = 60_000
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    target = target_buffer(chunk_bytes, buffer_bytes)
    view = target.data
    slots = len(target) // chunk_bytes
    count = total_bytes // chunk_bytes
    page = page_bytes(chunk_bytes)
    offsets = range(0, chunk_bytes, page)
    blockwise = check == "page" and chunk_bytes > LAND_BLOCK_BYTES  # copied and hashed a block at a time, as kvtop
    sender = Child(
        target=_floor_sender,
        args=(f"tcp://127.0.0.1:{port}", chunk_bytes, total_bytes, window_bytes, buffer_bytes, check),
    )
    sender.start()
    meter = CpuMeter(sender.pid)
    mismatched = unacked = 0
    started = 0.0
    try:
        sock.send(b"hello")  # the sender learns this DEALER's routing id from it
        for i in range(count):
            header = sock.recv()
            if i == 1:
                meter.start()
                started = time.perf_counter()
            slot = i % slots
            landed = view[slot * chunk_bytes : (slot + 1) * chunk_bytes]
            if blockwise:
                mismatched += land_digested(sock.recv(copy=False).buffer, landed, page) != header[_HEADER.size :]
            else:
                sock.recv_into(landed)
            if check == "chunk":
                mismatched += xxh3_64_intdigest(landed) != _HEADER.unpack_from(header)[3]
            elif check == "page" and not blockwise:
                mismatched += b"".join([xxh3_digest(landed[o : o + page]) for o in offsets]) != header[_HEADER.size :]
            unacked += chunk_bytes
            if unacked >= window_bytes // 4:
                sock.send(unacked.to_bytes(8, "little"))
                unacked = 0
        timed = meter.stop_leg(time.perf_counter() - started)
        if unacked:  # the rest of the credit: the sender waits for all of it
            sock.send(unacked.to_bytes(8, "little"))
    except zmq.Again:
        raise BenchFailed("the floor leg's sender did not deliver within 60 s") from None
    finally:
        sender.join(30)
        if sender.is_alive():
            sender.kill()
        sock.close()
        context.term()
    if mismatched:
        raise BenchFailed(f"{mismatched} floor-leg chunks failed their checksum")
    return timed.scaled(count / max(1, count - 1))
