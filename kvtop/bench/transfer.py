"""`kvtop bench transfer`: KV transfer throughput vs raw pyzmq at the same message size.

Every leg runs a sender process and a receiving process on loopback and moves
the same bytes in messages of the same size (`chunk_bytes`, checked by
`check_sizes`), between buffers as big as kvtop's pools:

- raw: PUSH sends zero-copy frames of `chunk_bytes` from a numpy buffer; PULL
  lands each with `recv_into` in a numpy buffer (the least work that moves
  bytes from one pool into another);
- kvtop: a prefill rank and a decode rank with KV pools, bootstrap, transfer
  requests, credit flow control, per-chunk xxh3 checksums and acks; rooms of
  `room_bytes`, three in flight; and again with checksums off (unchecked);
- floor (optional): the protocol's least work in pure pyzmq, no kvtop code:
  ROUTER to DEALER, kvtop's frames (routing id, a small header, the zero-copy
  payload) sent frame by frame with SNDMORE, blocking, credit read only when
  the window is full (no per-chunk poll); the receiver lands the payload with
  `recv_into` and acks per quarter window. It verifies what kvtop verifies
  (xxh3 of each chunk, hashed by the sender), nothing (floor unchecked), or,
  with `e2e`, end-to-end page checksums: each page hashed when it is written
  (before anything moves, as a forward pass would), digests carried in the
  header, each landed page verified. Raw to floor is what the protocol costs;
  floor to kvtop, what kvtop's implementation adds.

Legs alternate, repeats give medians, and the ratio is of the medians.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event as EventType
from typing import Protocol

import numpy as np
import numpy.typing as npt
import zmq
from xxhash import xxh3_64_digest as xxh3_digest
from xxhash import xxh3_64_intdigest

from kvtop.bench import BenchFailed
from kvtop.bench.cpu import CpuMeter, Leg
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
    """The protocol's least work in pure pyzmq, with kvtop's per-chunk checksums (None unless asked for)."""
    ratio_floor: float | None = None
    floor_unchecked_gbps: float | None = None
    """The same least work without checksums."""
    ratio_floor_unchecked: float | None = None
    e2e_gbps: float | None = None
    """The least work with end-to-end page checksums (hashed when written, verified where they land)."""
    ratio_e2e: float | None = None
    e2e_write_hash_gbps: float | None = None
    """GB/s of hashing pages as they are written: what end-to-end checksums cost the writer instead."""
    runs_gbps: dict[str, list[float]] = field(default_factory=dict)
    """Every run's GB/s per leg, in the order they alternated (single runs swing on a shared machine)."""
    cpu_s_per_gb: dict[str, float] = field(default_factory=dict)
    """Median CPU seconds per GB moved, per leg: both processes, every thread, user and system
    (`kvtop.bench.cpu`); what a leg costs, whatever share of the cores it got."""
    cpu_ratio: dict[str, float | None] = field(default_factory=dict)
    """Raw's CPU per GB over each leg's: the GB/s ratio a machine the transfer saturates would show (None
    for a leg too short for the CPU clock's 10 ms ticks)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _page_bytes(chunk_bytes: int) -> int:
    return min(chunk_bytes, _PAGE_BYTES_MAX)


def check_sizes(chunk_bytes: int, room_bytes: int) -> None:
    """Refuse sizes that would make the legs move different messages (ValueError, saying why).

    kvtop sends whole pages (of min(chunk, 64 KiB) here), so a chunk of 96 KiB would go as 64 KiB
    while raw sends 96 KiB; a room that is no whole number of chunks ends in a shorter one."""
    page = _page_bytes(chunk_bytes)
    if chunk_bytes % page:
        raise ValueError(
            f"chunk of {chunk_bytes} B: kvtop sends whole {page} B pages, so a chunk is at most {page} B "
            f"or a multiple of it (raw and floor would move bigger messages than kvtop)"
        )
    if room_bytes < chunk_bytes or room_bytes % chunk_bytes:
        raise ValueError(f"room of {room_bytes} B is not a whole number of {chunk_bytes} B chunks")


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


def run_raw(chunk_bytes: int, total_bytes: int, buffer_bytes: int) -> Leg:
    """Seconds (wall and CPU) to receive `total_bytes` in `chunk_bytes` messages with `recv_into`, cycling
    through buffers."""
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
    meter = CpuMeter(sender.pid)
    try:
        sock.recv_into(view[:chunk_bytes])
        meter.start()
        started = time.perf_counter()
        for i in range(1, total_bytes // chunk_bytes):
            start = (i % slots) * chunk_bytes
            sock.recv_into(view[start : start + chunk_bytes])
        timed = Leg(time.perf_counter() - started, meter.stop())
    finally:
        sender.join(30)
        sock.close()
        context.term()
    return timed.scaled((total_bytes // chunk_bytes) / max(1, total_bytes // chunk_bytes - 1))


# --- protocol floor leg ----------------------------------------------------------------

CHECKS = ("chunk", "none", "page")
"""What the floor verifies: "chunk", kvtop's checksums (the sender hashes each chunk on the transfer path,
the receiver verifies it where it lands); "none"; "page", end-to-end page checksums (each page hashed when
it is written, the digests stored beside the pages; a chunk's header carries its pages' digests and the
receiver verifies each landed page: no hash on the sender's transfer path)."""
_HEADER = struct.Struct("<QIIQ")
"""The floor's chunk header: room, chunk index, pages, xxh3-64 of the payload (0 when none); page digests
follow it with check "page". kvtop's msgpack `Chunk` header carries the same and the page runs."""


def page_digests(buffer: npt.NDArray[np.uint8], page_bytes: int) -> bytes:
    """xxh3-64 of each page of `buffer`, 8 bytes each in page order: what a writer stores beside its pages."""
    view = buffer.data
    return b"".join(xxh3_digest(view[o : o + page_bytes]) for o in range(0, len(buffer) - page_bytes + 1, page_bytes))


def write_hash_gbps(chunk_bytes: int, buffer_bytes: int) -> float:
    """GB/s of hashing every page as it is written (the cost end-to-end checksums move to the writer)."""
    source = _source(chunk_bytes, buffer_bytes)
    started = time.perf_counter()
    page_digests(source, _page_bytes(chunk_bytes))
    return len(source) / (time.perf_counter() - started) / 1e9


def _floor_sender(
    endpoint: str, chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int, check: str
) -> None:
    """The least work that sends kvtop's frames: [routing id, header, payload] per chunk, blocking sends,
    zero-copy payload, credit read only when the window is full (no per-chunk poll)."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.router_mandatory = True
    sock.connect(endpoint)
    source = _source(chunk_bytes, buffer_bytes)
    view = source.data
    slots = len(source) // chunk_bytes
    pages = chunk_bytes // _page_bytes(chunk_bytes)
    stored = page_digests(source, _page_bytes(chunk_bytes)) if check == "page" else b""  # at write time
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
        sock.send(payload, copy=False)
        inflight += chunk_bytes
    while inflight > 0:  # every byte acked before leaving, so the receiver's last acks find this socket
        sock.recv()
        inflight -= int.from_bytes(sock.recv(), "little")
    sock.close(linger=-1)
    context.term()


def run_floor(chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int, check: str = "chunk") -> Leg:
    """Seconds (wall and CPU) to receive `total_bytes` through the protocol's least work in pure pyzmq
    (module docstring)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = sock.rcvtimeo = 60_000
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    target = _target(chunk_bytes, buffer_bytes)
    view = target.data
    slots = len(target) // chunk_bytes
    count = total_bytes // chunk_bytes
    page = _page_bytes(chunk_bytes)
    offsets = range(0, chunk_bytes, page)
    sender = mp.get_context("spawn").Process(
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
            sock.recv_into(landed)
            if check == "chunk":
                mismatched += xxh3_64_intdigest(landed) != _HEADER.unpack_from(header)[3]
            elif check == "page":
                mismatched += b"".join([xxh3_digest(landed[o : o + page]) for o in offsets]) != header[_HEADER.size :]
            unacked += chunk_bytes
            if unacked >= window_bytes // 4:
                sock.send(unacked.to_bytes(8, "little"))
                unacked = 0
        timed = Leg(time.perf_counter() - started, meter.stop())
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

    @property
    def pid(self) -> int | None:
        """The watching process, whose CPU time counts in the run's (None when there is none)."""


def _wait_ready(process: mp.process.BaseProcess, ready: EventType, timeout_s: float = 60.0) -> None:
    """Wait for the prefill process to say it is up; raise at once if it died (its traceback is above)."""
    deadline = time.monotonic() + timeout_s
    while not ready.wait(0.1):
        if not process.is_alive():
            raise BenchFailed(f"the prefill process exited with {process.exitcode} before it was up")
        if time.monotonic() > deadline:
            raise BenchFailed(f"the prefill process did not start within {timeout_s:g} s")


def run_kvtop(
    chunk_bytes: int,
    room_bytes: int,
    rooms: int,
    publish_events: bool = True,
    checksums: bool = True,
    watcher: Watcher | None = None,
) -> Leg:
    """Seconds (wall and CPU) for a decode rank to receive `rooms` rooms from a prefill process (both
    publishing events), watched by `watcher` when one is given."""
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
            _wait_ready(prefill, ready)
            if watcher is not None:
                watcher.start(bootstrap.endpoint)

            def begin(room: int, slot: PageIndices) -> _Room:
                receiver = manager.receiver(room, "bench-prefill")
                receiver.init(slot)
                return receiver

            failed = _drive(range(1, 2), slots, begin)
            meter = CpuMeter(prefill.pid, watcher.pid if watcher is not None else None)
            meter.start()
            started = time.perf_counter()
            failed += _drive(range(2, rooms + 1), slots, begin)
            timed = Leg(time.perf_counter() - started, meter.stop())
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
    return timed.scaled(rooms / (rooms - 1))


def _figure(medians: dict[str, float], leg: str) -> tuple[float | None, float | None]:
    """A leg's median GB/s and its ratio to raw (None, None when the leg did not run)."""
    if leg not in medians:
        return None, None
    return round(medians[leg], 3), round(medians[leg] / medians["raw"], 3)


def measure(
    chunk_sizes: list[int],
    room_bytes: int,
    rooms: int,
    repeats: int,
    progress: Callable[[str], None],
    floor: bool = False,
    e2e: bool = False,
) -> list[TransferResult]:
    """Alternate raw, kvtop, unchecked kvtop (floor, unchecked floor; e2e) legs `repeats` times per chunk size;
    medians and ratios. Raises ValueError for sizes the legs cannot share (`check_sizes`)."""
    for chunk_bytes in chunk_sizes:
        check_sizes(chunk_bytes, room_bytes)
    results = []
    total = room_bytes * rooms
    for chunk_bytes in chunk_sizes:
        legs: dict[str, list[Leg]] = {"raw": [], "kvtop": [], "unchecked": [], "floor": [], "floor_unchecked": [],
                                      "e2e": []}  # fmt: skip
        pool = pool_bytes(chunk_bytes, room_bytes)
        window = _config(chunk_bytes, True).window_bytes
        for repeat in range(repeats):
            legs["raw"].append(run_raw(chunk_bytes, total, pool))
            legs["kvtop"].append(run_kvtop(chunk_bytes, room_bytes, rooms))
            legs["unchecked"].append(run_kvtop(chunk_bytes, room_bytes, rooms, checksums=False))
            if floor:
                legs["floor"].append(run_floor(chunk_bytes, total, window, pool, "chunk"))
                legs["floor_unchecked"].append(run_floor(chunk_bytes, total, window, pool, "none"))
            if e2e:
                legs["e2e"].append(run_floor(chunk_bytes, total, window, pool, "page"))
            progress(
                f"chunk {chunk_bytes} B, run {repeat + 1}/{repeats}: "
                + ", ".join(
                    f"{name} {total / runs[-1].seconds / 1e9:.2f} GB/s ({runs[-1].cpu_seconds / total * 1e9:.2f} "
                    "CPU s/GB)"
                    for name, runs in legs.items()
                    if runs
                )
            )
        ran = {name: runs for name, runs in legs.items() if runs}
        gbps = {name: [total / leg.seconds / 1e9 for leg in runs] for name, runs in ran.items()}
        med = {name: statistics.median(runs) for name, runs in gbps.items()}
        cpu = {name: statistics.median(leg.cpu_seconds / total * 1e9 for leg in runs) for name, runs in ran.items()}
        base = med["raw"]
        floor_gbps, ratio_floor = _figure(med, "floor")
        floor_unchecked, ratio_floor_unchecked = _figure(med, "floor_unchecked")
        e2e_gbps, ratio_e2e = _figure(med, "e2e")
        results.append(
            TransferResult(
                chunk_bytes=chunk_bytes,
                kvtop_gbps=round(med["kvtop"], 3),
                raw_gbps=round(base, 3),
                ratio=round(med["kvtop"] / base, 3),
                kvtop_unchecked_gbps=round(med["unchecked"], 3),
                ratio_unchecked=round(med["unchecked"] / base, 3),
                repeats=repeats,
                total_bytes=total,
                floor_gbps=floor_gbps,
                ratio_floor=ratio_floor,
                floor_unchecked_gbps=floor_unchecked,
                ratio_floor_unchecked=ratio_floor_unchecked,
                e2e_gbps=e2e_gbps,
                ratio_e2e=ratio_e2e,
                e2e_write_hash_gbps=round(write_hash_gbps(chunk_bytes, pool), 2) if e2e else None,
                runs_gbps={name: [round(g, 3) for g in runs] for name, runs in gbps.items()},
                cpu_s_per_gb={name: round(c, 3) for name, c in cpu.items()},
                cpu_ratio={name: round(cpu["raw"] / c, 3) if c else None for name, c in cpu.items()},
            )
        )
    return results
