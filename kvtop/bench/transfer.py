"""`kvtop bench transfer`: KV transfer throughput vs raw pyzmq at the same message size.

Every leg runs a sender process and a receiving process on loopback and moves
the same bytes in messages of the same size (`chunk_bytes`, checked by
`check_sizes`), between buffers as big as kvtop's pools:

- raw, and optionally the protocol's least work (floor: with kvtop's checksums,
  without, or with end-to-end page checksums), in pure pyzmq: `baselines`;
  with `floor`, raw again with its frames sent as registered memory, as kvtop's
  prefill ranks send theirs (raw pyzmq pays a garbage-collector round trip per
  zero-copy frame that they do not);
- kvtop: a prefill rank and a decode rank with KV pools, bootstrap, transfer
  requests, credit flow control (a rank's default window, at least four chunks;
  the floor and Mooncake legs get the same window), end-to-end page checksums
  (the prefill's pages sealed when written, each verified where it lands) and
  acks; rooms of `room_bytes`, three in flight; again with checksums off
  (unchecked); and with `floor`, with per-chunk checksums (pages not sealed:
  the sender hashes each chunk as it goes);
- optionally Mooncake Transfer Engine's TCP transport (`kvtop.bench.mooncake`).

Raw to floor is what the protocol costs; floor to kvtop, what kvtop's
implementation adds. Every leg's receiving process runs under the allocator
setting a kvtop decode rank applies (`transport.kv.memory`), set before the
first leg for the largest chunk asked (its thresholds only ever rise). Legs
alternate, repeats give medians, and the ratio is of the medians. Each leg
also reports the CPU seconds both of its processes spent per GB in its timed
window (`kvtop.bench.cpu`): on a shared machine GB/s follows the share of the
cores a run got, CPU per byte the work it did.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event as EventType
from typing import ClassVar, Protocol

import numpy as np

from kvtop.bench import BenchFailed
from kvtop.bench.baselines import page_bytes, run_floor, run_raw, write_hash_gbps
from kvtop.bench.child import Child
from kvtop.bench.cpu import CpuMeter, Leg
from kvtop.bench.mooncake import require_mooncake, run_mooncake
from kvtop.bench.report import Compare, Report, at_least, at_most
from transport import BootstrapClient, BootstrapError, BootstrapServer, KVManager, KVPoll, KVPool, Role, TransferConfig
from transport.curve import CurveKeys
from transport.kv.memory import keep_receive_buffers
from transport.kv.pool import PageIndices
from transport.kv.registered import registered_sends
from transport.sockets import data_frame_bound

_ROOMS_IN_FLIGHT = 3


@dataclass(frozen=True)
class TransferResult:
    """One chunk size's figures (GB/s are 1e9 bytes per second)."""

    chunk_bytes: int
    kvtop_gbps: float
    """With checksums (the default): the bench's pages are sealed, so end-to-end page checksums."""
    raw_gbps: float
    ratio: float
    kvtop_unchecked_gbps: float
    """The same transfers with checksums off (TransferConfig.checksums=False)."""
    ratio_unchecked: float
    repeats: int
    total_bytes: int
    kvtop_chunk_gbps: float | None = None
    """kvtop with per-chunk checksums (pages not sealed; None unless the floor legs ran)."""
    ratio_chunk: float | None = None
    floor_gbps: float | None = None
    """The protocol's least work in pure pyzmq, with kvtop's per-chunk checksums (None unless asked for)."""
    ratio_floor: float | None = None
    floor_unchecked_gbps: float | None = None
    """The same least work without checksums."""
    ratio_floor_unchecked: float | None = None
    raw_registered_gbps: float | None = None
    """Raw with its frames sent as registered memory (None unless the floor legs ran where libzmq's calls are
    at hand): raw pyzmq without the per-frame garbage-collector round trip that kvtop's registered sends leave
    out."""
    ratio_raw_registered: float | None = None
    kvtop_vs_raw_registered: float | None = None
    """kvtop's median GB/s over raw's with registered sends."""
    e2e_gbps: float | None = None
    """The least work with end-to-end page checksums (hashed when written, verified where they land)."""
    ratio_e2e: float | None = None
    ratio_gap_e2e: float | None = None
    """How far kvtop's ratio is below the least work with the same checks (`ratio_e2e - ratio`): what kvtop's
    implementation costs over the protocol's floor."""
    mooncake_gbps: float | None = None
    """Mooncake Transfer Engine's TCP transport moving the same bytes in the same transfers (None unless asked)."""
    ratio_mooncake: float | None = None
    kvtop_vs_mooncake: float | None = None
    """kvtop's median GB/s over Mooncake's."""
    e2e_vs_mooncake: float | None = None
    """The least work with end-to-end checksums over Mooncake: the most `kvtop_vs_mooncake` can reach with
    kvtop's checks on this machine."""
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
    cpu_s_per_gb_by_thread: dict[str, dict[str, float]] = field(default_factory=dict)
    """`cpu_s_per_gb` split by thread group (`kvtop.bench.cpu.THREAD_GROUPS`: engine, events, zeromq_io, main,
    exited, ...), medians per group: where a leg spends what it costs more than another (empty off Linux)."""

    REPORT: ClassVar[Report] = Report(
        setting=("chunk_bytes", "total_bytes", "repeats"),
        compare=(
            Compare("kvtop_gbps", "raw_gbps", "ratio"),
            Compare("kvtop_unchecked_gbps", "raw_gbps", "ratio_unchecked"),
            Compare("kvtop_chunk_gbps", "raw_gbps", "ratio_chunk"),
            Compare("floor_gbps", "raw_gbps", "ratio_floor"),
            Compare("floor_unchecked_gbps", "raw_gbps", "ratio_floor_unchecked"),
            Compare("raw_registered_gbps", "raw_gbps", "ratio_raw_registered"),
            Compare("kvtop_gbps", "raw_registered_gbps", "kvtop_vs_raw_registered"),
            Compare("e2e_gbps", "raw_gbps", "ratio_e2e"),
            Compare("mooncake_gbps", "raw_gbps", "ratio_mooncake"),
            Compare("kvtop_gbps", "mooncake_gbps", "kvtop_vs_mooncake"),
            Compare("e2e_gbps", "mooncake_gbps", "e2e_vs_mooncake"),
        ),
        targets=(at_least("ratio", 0.9), at_least("kvtop_vs_mooncake", 2.0), at_most("ratio_gap_e2e", 0.03)),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def check_sizes(chunk_bytes: int, room_bytes: int) -> None:
    """Refuse sizes that would make the legs move different messages (ValueError, saying why).

    kvtop sends whole pages (of min(chunk, 64 KiB) here), so a chunk of 96 KiB would go as 64 KiB
    while raw sends 96 KiB; a room that is no whole number of chunks ends in a shorter one."""
    page = page_bytes(chunk_bytes)
    if chunk_bytes % page:
        raise ValueError(
            f"chunk of {chunk_bytes} B: kvtop sends whole {page} B pages, so a chunk is at most {page} B "
            f"or a multiple of it (raw and floor would move bigger messages than kvtop)"
        )
    if room_bytes < chunk_bytes or room_bytes % chunk_bytes:
        raise ValueError(f"room of {room_bytes} B is not a whole number of {chunk_bytes} B chunks")


def pool_bytes(chunk_bytes: int, room_bytes: int) -> int:
    """Bytes of each side's KV pool in the kvtop leg: the other legs move bytes between buffers this big.

    Memory footprint alone moves throughput here: the floor leg ran at 3.66 GB/s through 64 MiB buffers and
    2.74 through 192 MiB ones (1 MiB chunks), so every leg sends from and lands in as much memory."""
    return _room_pages(chunk_bytes, room_bytes) * page_bytes(chunk_bytes) * _ROOMS_IN_FLIGHT


# --- kvtop leg -------------------------------------------------------------------------


def _room_pages(chunk_bytes: int, room_bytes: int) -> int:
    return max(1, room_bytes // page_bytes(chunk_bytes))


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
    curve_keys: str = "",
    seal: bool = True,
) -> None:
    pages = _room_pages(chunk_bytes, room_bytes)
    pool = KVPool(pages * _ROOMS_IN_FLIGHT, page_bytes(chunk_bytes))
    slots = [pool.allocate(pages) for _ in range(_ROOMS_IN_FLIGHT)]
    pool.data[:] = np.random.default_rng(2).integers(0, 256, size=pool.data.shape, dtype=np.uint8)
    if seal:  # as a forward pass would, once its pages are written (before anything is timed)
        pool.seal(np.arange(pool.num_pages, dtype=np.uint32))
    with KVManager(
        role=Role.PREFILL, instance="bench-prefill", rank=0, tp=1, pool=pool, bootstrap=bootstrap,
        config=_config(chunk_bytes, checksums), publish_events=publish_events, curve=_keys(curve_keys),
    ) as manager:  # fmt: skip
        manager.start()
        ready.set()

        def begin(room: int, slot: PageIndices) -> _Room:
            sender = manager.sender(room)
            sender.send(slot)
            return sender

        _drive(range(1, rooms + 1), slots, begin)
        release.wait(120)  # a watcher may still be reading this rank's last events: closing drops them


def _keys(curve_keys: str) -> CurveKeys | None:
    return CurveKeys.load(curve_keys, serve=True) if curve_keys else None


def _refuses_plain_clients(bootstrap: str) -> None:
    """Raise BenchFailed unless the bootstrap service ignores a client without keys (CURVE really is on)."""
    try:
        with BootstrapClient(bootstrap, timeout_s=0.3) as client:
            client.list_agents()
    except BootstrapError:
        return
    raise BenchFailed(f"the CURVE leg's bootstrap service {bootstrap} answered a client without keys")


def _config(chunk_bytes: int, checksums: bool) -> TransferConfig:
    """The settings a rank runs with by default, at this chunk size (a window of at least four chunks)."""
    window = max(TransferConfig().window_bytes, 4 * chunk_bytes)
    return TransferConfig(chunk_bytes=chunk_bytes, window_bytes=window, checksums=checksums)


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
    curve_keys: str = "",
    seal: bool = True,
) -> Leg:
    """Seconds (wall and CPU) for a decode rank to receive `rooms` rooms from a prefill process (both
    publishing events), watched by `watcher` when one is given; every socket with CURVE given `curve_keys`;
    the prefill's pages sealed (end-to-end checksums) unless `seal` is False (per-chunk checksums)."""
    bootstrap = BootstrapServer(curve=_keys(curve_keys)).start()
    spawn = mp.get_context("spawn")
    ready, release = spawn.Event(), spawn.Event()
    prefill = Child(
        target=_prefill_process,
        args=(
            bootstrap.endpoint,
            chunk_bytes,
            room_bytes,
            rooms,
            ready,
            release,
            publish_events,
            checksums,
            curve_keys,
            seal,
        ),
    )
    prefill.start()
    pages = _room_pages(chunk_bytes, room_bytes)
    pool = KVPool(pages * _ROOMS_IN_FLIGHT, page_bytes(chunk_bytes))
    slots = [pool.allocate(pages) for _ in range(_ROOMS_IN_FLIGHT)]
    try:
        with KVManager(
            role=Role.DECODE, instance="bench-decode", rank=0, tp=1, pool=pool, bootstrap=bootstrap.endpoint,
            config=_config(chunk_bytes, checksums), publish_events=publish_events, curve=_keys(curve_keys),
        ) as manager:  # fmt: skip
            manager.start()
            _wait_ready(prefill, ready)
            if curve_keys:
                _refuses_plain_clients(bootstrap.endpoint)
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
            timed = meter.stop_leg(time.perf_counter() - started)
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


def _by_thread(runs: list[Leg], total_bytes: int) -> dict[str, float]:
    """Median CPU seconds per GB of each thread group over a leg's runs (a group absent from a run spent 0)."""
    groups = sorted({group for leg in runs for group in leg.cpu_by_thread})
    return {
        group: round(statistics.median(leg.cpu_by_thread.get(group, 0.0) / total_bytes * 1e9 for leg in runs), 3)
        for group in groups
    }


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
    mooncake: bool = False,
) -> list[TransferResult]:
    """Alternate raw, kvtop, unchecked kvtop (per-chunk-checksum kvtop, floor, unchecked floor, registered raw;
    e2e; Mooncake) legs `repeats` times per chunk size; medians and ratios. Raises ValueError for sizes the legs
    cannot share (`check_sizes`), BenchFailed before any leg runs when Mooncake is asked for and missing."""
    for chunk_bytes in chunk_sizes:
        check_sizes(chunk_bytes, room_bytes)
    if mooncake:
        require_mooncake()
    largest = max(chunk_sizes)
    keep_receive_buffers(data_frame_bound(largest, page_bytes(largest)), _config(largest, True).window_bytes)
    results = []
    total = room_bytes * rooms
    for chunk_bytes in chunk_sizes:
        names = ("raw", "kvtop", "unchecked", "chunk", "floor", "floor_unchecked", "raw_registered", "e2e", "mooncake")
        legs: dict[str, list[Leg]] = {name: [] for name in names}
        pool = pool_bytes(chunk_bytes, room_bytes)
        window = _config(chunk_bytes, True).window_bytes
        for repeat in range(repeats):
            legs["raw"].append(run_raw(chunk_bytes, total, pool))
            legs["kvtop"].append(run_kvtop(chunk_bytes, room_bytes, rooms))
            legs["unchecked"].append(run_kvtop(chunk_bytes, room_bytes, rooms, checksums=False))
            if floor:
                legs["chunk"].append(run_kvtop(chunk_bytes, room_bytes, rooms, seal=False))
                legs["floor"].append(run_floor(chunk_bytes, total, window, pool, "chunk"))
                legs["floor_unchecked"].append(run_floor(chunk_bytes, total, window, pool, "none"))
                if registered_sends():  # else it would be raw pyzmq under another name: left out (None)
                    legs["raw_registered"].append(run_raw(chunk_bytes, total, pool, registered=True))
            if e2e:
                legs["e2e"].append(run_floor(chunk_bytes, total, window, pool, "page"))
            if mooncake:
                legs["mooncake"].append(run_mooncake(chunk_bytes, total, window, pool))
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
        chunk_gbps, ratio_chunk = _figure(med, "chunk")
        floor_gbps, ratio_floor = _figure(med, "floor")
        floor_unchecked, ratio_floor_unchecked = _figure(med, "floor_unchecked")
        raw_registered, ratio_raw_registered = _figure(med, "raw_registered")
        e2e_gbps, ratio_e2e = _figure(med, "e2e")
        mooncake_gbps, ratio_mooncake = _figure(med, "mooncake")
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
                kvtop_chunk_gbps=chunk_gbps,
                ratio_chunk=ratio_chunk,
                floor_gbps=floor_gbps,
                ratio_floor=ratio_floor,
                floor_unchecked_gbps=floor_unchecked,
                ratio_floor_unchecked=ratio_floor_unchecked,
                raw_registered_gbps=raw_registered,
                ratio_raw_registered=ratio_raw_registered,
                kvtop_vs_raw_registered=round(med["kvtop"] / med["raw_registered"], 3) if raw_registered else None,
                e2e_gbps=e2e_gbps,
                ratio_e2e=ratio_e2e,
                ratio_gap_e2e=round(ratio_e2e - med["kvtop"] / base, 3) if ratio_e2e is not None else None,
                mooncake_gbps=mooncake_gbps,
                ratio_mooncake=ratio_mooncake,
                kvtop_vs_mooncake=round(med["kvtop"] / med["mooncake"], 3) if mooncake else None,
                e2e_vs_mooncake=round(med["e2e"] / med["mooncake"], 3) if mooncake and e2e else None,
                e2e_write_hash_gbps=round(write_hash_gbps(chunk_bytes, pool), 2) if e2e else None,
                runs_gbps={name: [round(g, 3) for g in runs] for name, runs in gbps.items()},
                cpu_s_per_gb={name: round(c, 3) for name, c in cpu.items()},
                cpu_ratio={name: round(cpu["raw"] / c, 3) if c else None for name, c in cpu.items()},
                cpu_s_per_gb_by_thread={name: _by_thread(runs, total) for name, runs in ran.items()},
            )
        )
    return results
