"""`kvtop bench transfer`: KV transfer throughput vs raw pyzmq at the same message size.

Both legs run a sender process and a receiving process on loopback and move
the same number of bytes:

- raw: PUSH sends zero-copy frames of `chunk_bytes` from a numpy buffer; PULL
  lands each with `recv_into` in a numpy buffer (the least work that moves
  bytes from one pool into another); both buffers as big as kvtop's pools;
- kvtop: a prefill rank and a decode rank with KV pools, bootstrap, transfer
  requests, credit flow control, per-chunk xxh3 checksums and acks; rooms of
  `room_bytes`, three in flight;
- floor (optional): the protocol's least work in pure pyzmq, no kvtop code:
  ROUTER to DEALER, a header frame with the payload's xxh3 and the zero-copy
  payload, verified after `recv_into`, a credit window acked per quarter. The
  gap from raw to floor is what the protocol costs; from floor to kvtop, what
  kvtop's implementation adds.

Legs alternate, repeats give medians, and the ratio is of the medians.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Event as EventType
from typing import Protocol

import numpy as np
import numpy.typing as npt
import xxhash
import zmq

from kvtop.bench import BenchFailed
from transport import BootstrapServer, KVManager, KVPoll, KVPool, Role, TransferConfig
from transport.pool import PageIndices

_ROOMS_IN_FLIGHT = 3
_PAGE_BYTES_MAX = 64 << 10


@dataclass(frozen=True)
class TransferResult:
    """One chunk size's figures (GB/s are 1e9 bytes per second)."""

    chunk_bytes: int
    kvtop_gbps: float
    """With per-chunk checksums (the default)."""
    raw_gbps: float
    ratio: float
    kvtop_unchecked_gbps: float
    """The same transfers with checksums off (TransferConfig.checksums=False)."""
    ratio_unchecked: float
    repeats: int
    total_bytes: int
    floor_gbps: float | None = None
    """The protocol's least work in pure pyzmq (None unless asked for)."""
    ratio_floor: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _page_bytes(chunk_bytes: int) -> int:
    return min(chunk_bytes, _PAGE_BYTES_MAX)


# --- raw pyzmq leg ---------------------------------------------------------------------


def pool_bytes(chunk_bytes: int, room_bytes: int) -> int:
    """Bytes of each side's KV pool in the kvtop leg: the other legs move bytes between buffers this big.

    Memory footprint alone moves throughput here: the floor leg ran at 3.66 GB/s through 64 MiB buffers and
    2.74 through 192 MiB ones (1 MiB chunks), so every leg sends from and lands in as much memory."""
    return _room_pages(chunk_bytes, room_bytes) * _page_bytes(chunk_bytes) * _ROOMS_IN_FLIGHT


def _source(chunk_bytes: int, buffer_bytes: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(1).integers(0, 256, size=max(chunk_bytes, buffer_bytes), dtype=np.uint8)


def _target(chunk_bytes: int, buffer_bytes: int) -> npt.NDArray[np.uint8]:
    """A landing buffer with every page touched, as a registered KV pool's are (no page faults when timed)."""
    target = np.empty(max(chunk_bytes, buffer_bytes), dtype=np.uint8)
    target.fill(0)
    return target


def _raw_sender(endpoint: str, chunk_bytes: int, total_bytes: int, buffer_bytes: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.connect(endpoint)
    source = _source(chunk_bytes, buffer_bytes)
    view = source.data
    slots = len(source) // chunk_bytes
    for i in range(total_bytes // chunk_bytes):
        start = (i % slots) * chunk_bytes
        sock.send(view[start : start + chunk_bytes], copy=False)
    sock.close(linger=-1)
    context.term()


def run_raw(chunk_bytes: int, total_bytes: int, buffer_bytes: int) -> float:
    """Seconds to receive `total_bytes` in `chunk_bytes` messages with `recv_into`, cycling through buffers."""
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    target = _target(chunk_bytes, buffer_bytes)
    view = target.data
    slots = len(target) // chunk_bytes
    sender = mp.get_context("spawn").Process(
        target=_raw_sender, args=(f"tcp://127.0.0.1:{port}", chunk_bytes, total_bytes, buffer_bytes)
    )
    sender.start()
    try:
        sock.recv_into(view[:chunk_bytes])
        started = time.perf_counter()
        for i in range(1, total_bytes // chunk_bytes):
            start = (i % slots) * chunk_bytes
            sock.recv_into(view[start : start + chunk_bytes])
        elapsed = time.perf_counter() - started
    finally:
        sender.join(30)
        sock.close()
        context.term()
    return elapsed * (total_bytes // chunk_bytes) / max(1, total_bytes // chunk_bytes - 1)


# --- protocol floor leg ----------------------------------------------------------------


def _floor_sender(endpoint: str, chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.router_mandatory = True
    sock.connect(endpoint)
    source = _source(chunk_bytes, buffer_bytes)
    view = source.data
    slots = len(source) // chunk_bytes
    identity = sock.recv_multipart()[0]
    inflight = 0
    for i in range(total_bytes // chunk_bytes):
        while inflight + chunk_bytes > window_bytes or sock.poll(0):
            inflight -= int.from_bytes(sock.recv_multipart()[1], "little")  # an ack returns credit
        start = (i % slots) * chunk_bytes
        payload = view[start : start + chunk_bytes]
        digest = xxhash.xxh3_64_intdigest(payload)
        sock.send_multipart([identity, digest.to_bytes(8, "little"), payload], copy=False)
        inflight += chunk_bytes
    while inflight > 0:  # every byte acked before leaving, so the receiver's last acks find this socket
        inflight -= int.from_bytes(sock.recv_multipart()[1], "little")
    sock.close(linger=-1)
    context.term()


def run_floor(chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int) -> float:
    """Seconds to receive `total_bytes` through the protocol's least work in pure pyzmq (module docstring)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = sock.rcvtimeo = 60_000
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    target = _target(chunk_bytes, buffer_bytes)
    view = target.data
    slots = len(target) // chunk_bytes
    count = total_bytes // chunk_bytes
    sender = mp.get_context("spawn").Process(
        target=_floor_sender,
        args=(f"tcp://127.0.0.1:{port}", chunk_bytes, total_bytes, window_bytes, buffer_bytes),
    )
    sender.start()
    mismatched = unacked = 0
    started = 0.0
    try:
        sock.send(b"hello")  # the sender learns this DEALER's routing id from it
        for i in range(count):
            header = sock.recv()
            if i == 1:
                started = time.perf_counter()
            start = (i % slots) * chunk_bytes
            landed = view[start : start + chunk_bytes]
            sock.recv_into(landed)
            mismatched += xxhash.xxh3_64_intdigest(landed) != int.from_bytes(header, "little")
            unacked += chunk_bytes
            if unacked >= window_bytes // 4:
                sock.send(unacked.to_bytes(8, "little"))
                unacked = 0
        elapsed = time.perf_counter() - started
        if unacked:  # the rest of the credit: the sender waits for all of it
            sock.send(unacked.to_bytes(8, "little"))
    except zmq.Again:
        raise RuntimeError("the floor leg's sender did not deliver within 60 s") from None
    finally:
        sender.join(30)
        if sender.is_alive():
            sender.kill()
        sock.close()
        context.term()
    if mismatched:
        raise RuntimeError(f"{mismatched} floor-leg payloads failed their checksum")
    return elapsed * count / max(1, count - 1)


# --- kvtop leg -------------------------------------------------------------------------


def _room_pages(chunk_bytes: int, room_bytes: int) -> int:
    return max(1, room_bytes // _page_bytes(chunk_bytes))


class _Room(Protocol):
    def poll(self) -> KVPoll: ...
    def release(self) -> None: ...


def _drive(room_ids: range, slots: list[PageIndices], begin: Callable[[int, PageIndices], _Room]) -> int:
    """Run the rooms `len(slots)` at a time, each in a free slot of pages; returns how many failed."""
    live: dict[int, tuple[_Room, PageIndices]] = {}
    pending = iter(room_ids)
    failed = 0
    free = list(slots)
    deadline = time.monotonic() + 120
    exhausted = False
    while (not exhausted or live) and time.monotonic() < deadline:
        while free and not exhausted:
            room = next(pending, None)
            if room is None:
                exhausted = True
                break
            slot = free.pop()
            live[room] = (begin(room, slot), slot)
        for room, (handle, slot) in list(live.items()):
            state = handle.poll()
            if state.is_terminal:
                failed += state is KVPoll.Failed
                handle.release()
                free.append(slot)
                del live[room]
        time.sleep(0.005)
    return failed + len(live)


def _prefill_process(
    bootstrap: str,
    chunk_bytes: int,
    room_bytes: int,
    rooms: int,
    ready: EventType,
    release: EventType,
    publish_events: bool,
    checksums: bool,
) -> None:
    pages = _room_pages(chunk_bytes, room_bytes)
    pool = KVPool(pages * _ROOMS_IN_FLIGHT, _page_bytes(chunk_bytes))
    pool.data[:] = np.random.default_rng(2).integers(0, 256, size=pool.data.shape, dtype=np.uint8)
    slots = [pool.allocate(pages) for _ in range(_ROOMS_IN_FLIGHT)]
    with KVManager(
        role=Role.PREFILL, instance="bench-prefill", rank=0, tp=1, pool=pool, bootstrap=bootstrap,
        config=_config(chunk_bytes, checksums), publish_events=publish_events,
    ) as manager:  # fmt: skip
        manager.start()
        ready.set()

        def begin(room: int, slot: PageIndices) -> _Room:
            sender = manager.sender(room)
            sender.send(slot)
            return sender

        _drive(range(1, rooms + 1), slots, begin)
        release.wait(120)  # a watcher may still be reading this rank's last events: closing drops them


def _config(chunk_bytes: int, checksums: bool) -> TransferConfig:
    return TransferConfig(chunk_bytes=chunk_bytes, window_bytes=max(32 << 20, 4 * chunk_bytes), checksums=checksums)


class Watcher(Protocol):
    """Something that watches a kvtop run's ranks (`bench events`: a collector in its own process)."""

    def start(self, bootstrap: str) -> None:
        """Both ranks registered at `bootstrap` and nothing moved yet: subscribe, return when ready."""

    def settle(self) -> None:
        """The timed transfers ended; the ranks stay up until this returns."""

    def stop(self) -> None:
        """End the watch (idempotent; also called when the run failed)."""


def run_kvtop(
    chunk_bytes: int,
    room_bytes: int,
    rooms: int,
    publish_events: bool = True,
    checksums: bool = True,
    watcher: Watcher | None = None,
) -> float:
    """Seconds for a decode rank to receive `rooms` rooms from a prefill process (both publishing events),
    watched by `watcher` when one is given."""
    bootstrap = BootstrapServer().start()
    spawn = mp.get_context("spawn")
    ready, release = spawn.Event(), spawn.Event()
    prefill = spawn.Process(
        target=_prefill_process,
        args=(bootstrap.endpoint, chunk_bytes, room_bytes, rooms, ready, release, publish_events, checksums),
    )
    prefill.start()
    pages = _room_pages(chunk_bytes, room_bytes)
    pool = KVPool(pages * _ROOMS_IN_FLIGHT, _page_bytes(chunk_bytes))
    slots = [pool.allocate(pages) for _ in range(_ROOMS_IN_FLIGHT)]
    try:
        with KVManager(
            role=Role.DECODE, instance="bench-decode", rank=0, tp=1, pool=pool, bootstrap=bootstrap.endpoint,
            config=_config(chunk_bytes, checksums), publish_events=publish_events,
        ) as manager:  # fmt: skip
            manager.start()
            if not ready.wait(60):
                raise BenchFailed("the prefill process did not start within 60 s")
            if watcher is not None:
                watcher.start(bootstrap.endpoint)

            def begin(room: int, slot: PageIndices) -> _Room:
                receiver = manager.receiver(room, "bench-prefill")
                receiver.init(slot)
                return receiver

            failed = _drive(range(1, 2), slots, begin)
            started = time.perf_counter()
            failed += _drive(range(2, rooms + 1), slots, begin)
            elapsed = time.perf_counter() - started
            if failed:
                raise BenchFailed(f"{failed} benchmark rooms failed")
            if watcher is not None:
                watcher.settle()
    finally:
        if watcher is not None:
            watcher.stop()
        release.set()
        prefill.join(30)
        if prefill.is_alive():
            prefill.kill()
        bootstrap.close()
    return elapsed * rooms / (rooms - 1)


def measure(
    chunk_sizes: list[int],
    room_bytes: int,
    rooms: int,
    repeats: int,
    progress: Callable[[str], None],
    floor: bool = False,
) -> list[TransferResult]:
    """Alternate raw, kvtop, unchecked kvtop (and floor) legs `repeats` times per chunk size; medians, ratios."""
    results = []
    total = room_bytes * rooms
    for chunk_bytes in chunk_sizes:
        raw: list[float] = []
        checked: list[float] = []
        unchecked: list[float] = []
        floors: list[float] = []
        pool = pool_bytes(chunk_bytes, room_bytes)
        window = _config(chunk_bytes, True).window_bytes
        for repeat in range(repeats):
            raw.append(total / run_raw(chunk_bytes, total, pool) / 1e9)
            checked.append(total / run_kvtop(chunk_bytes, room_bytes, rooms) / 1e9)
            unchecked.append(total / run_kvtop(chunk_bytes, room_bytes, rooms, checksums=False) / 1e9)
            if floor:
                floors.append(total / run_floor(chunk_bytes, total, window, pool) / 1e9)
            progress(
                f"chunk {chunk_bytes} B, run {repeat + 1}/{repeats}: raw {raw[-1]:.2f} GB/s, "
                f"kvtop {checked[-1]:.2f} GB/s, without checksums {unchecked[-1]:.2f} GB/s"
                + (f", floor {floors[-1]:.2f} GB/s" if floor else "")
            )
        base, kv, bare = statistics.median(raw), statistics.median(checked), statistics.median(unchecked)
        least = statistics.median(floors) if floors else None
        results.append(
            TransferResult(
                chunk_bytes=chunk_bytes,
                kvtop_gbps=round(kv, 3),
                raw_gbps=round(base, 3),
                ratio=round(kv / base, 3),
                kvtop_unchecked_gbps=round(bare, 3),
                ratio_unchecked=round(bare / base, 3),
                repeats=repeats,
                total_bytes=total,
                floor_gbps=round(least, 3) if least is not None else None,
                ratio_floor=round(least / base, 3) if least is not None else None,
            )
        )
    return results
