"""`kvtop bench ingest`: events/s applied to the cluster model vs decoding the same frames alone.

Frames are real encoded `EventBatch`es of a realistic mix (room state changes,
progress, transfers done, failures and echoes) from 16 agents. The decode-only
leg runs the same decoder over the same frames; the ratio shows what the model
costs on top. With `floor`, a third leg decodes and keeps only a table of each
room's state per rank (a dict of dicts): the least any model keyed by room pays,
so its ratio bounds what a faster loop over such a model could reach. The check
leg times the installed `kvtop check` against a small local cluster under load
(the workload's Router driving rooms through it all along), Python start
included; a check that gives no verdict (exit code not 0-2, or UNKNOWN), or a
cluster that finished no room while the checks ran, fails the bench.
"""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_least, at_most
from kvtop.model.cluster import ClusterModel
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.workload import Router, WorkloadSpec, WorkloadStats
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, Failure, Progress, RoomState, TransferDone
from transport.wire import FrameDecoder, encode

_AGENTS = [f"{role}-{i}/TP{r}" for role in ("prefill", "decode") for i in range(4) for r in range(2)]


@dataclass(frozen=True)
class IngestResult:
    events_per_s: float
    decode_only_per_s: float
    ratio: float
    check_wall_s: float
    """Median wall time of `kvtop check` against a cluster under load."""
    check_exit_codes: list[int]
    """Each check's verdict (0 OK, 1 WARNING, 2 CRITICAL): anything else fails the bench."""
    check_load_rooms: int
    """Rooms the cluster finished while the checks ran (the load they were timed under)."""
    events: int
    repeats: int
    floor_per_s: float | None = None
    """Decode plus a bare room table (None unless asked for)."""
    ratio_floor: float | None = None

    REPORT: ClassVar[Report] = Report(
        setting=("events", "repeats"),
        compare=(
            Compare("events_per_s", "decode_only_per_s", "ratio"),
            Compare("floor_per_s", "decode_only_per_s", "ratio_floor"),
        ),
        targets=(at_least("events_per_s", 300_000), at_least("ratio", 0.5), at_most("check_wall_s", 1.0)),
    )

    def as_dict(self) -> dict[str, float | int | list[int] | None]:
        return asdict(self)


def _room_events(rng: random.Random, ts: float, label: str) -> list[Event]:
    room = rng.getrandbits(63)
    failed = rng.random() < 0.05
    events: list[Event] = [
        RoomState(ts, room, int(KVPoll.WaitingForInput), int(KVPoll.Bootstrapping), "prefill-0", 1 << 20),
        RoomState(ts, room, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "prefill-0", 1 << 20),
        Progress(ts, room, 1 << 19, 1 << 20),
    ]
    if failed:
        events.append(Failure(ts, room, label, "KV chunk failed its checksum", "checksum", "error", False, label))
        events.append(RoomState(ts, room, int(KVPoll.Failed), int(KVPoll.Transferring), "prefill-0", 1 << 20))
    else:
        events.append(RoomState(ts, room, int(KVPoll.Success), int(KVPoll.Transferring), "prefill-0", 1 << 20))
        events.append(TransferDone(ts, room, 1 << 20, 0.01, "prefill-0"))
    return events


def synthetic_frames(events_total: int, per_batch: int = 200, seed: int = 1) -> list[tuple[str, bytes]]:
    """(agent label, encoded batch) pairs holding about `events_total` events."""
    rng = random.Random(seed)
    frames: list[tuple[str, bytes]] = []
    seqs = dict.fromkeys(_AGENTS, 0)
    made = 0
    ts = time.time()
    while made < events_total:
        label = rng.choice(_AGENTS)
        events: list[Event] = []
        while len(events) < per_batch:
            events.extend(_room_events(rng, ts, label))
        seqs[label] += 1
        instance, _, rank = label.rpartition("/TP")
        role = "prefill" if instance.startswith("prefill") else "decode"
        frames.append((label, encode(EventBatch(EVENT_SCHEMA, role, instance, int(rank), 1, seqs[label], ts, events))))
        made += len(events)
    return frames


def _decode_only(frames: list[tuple[str, bytes]]) -> tuple[float, int]:
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    started = time.perf_counter()
    count = sum(len(decoder.decode(frame).events) for _, frame in frames)
    return time.perf_counter() - started, count


def _room_table(frames: list[tuple[str, bytes]]) -> tuple[float, int]:
    """Decode, then find or create each room's record and set the rank's state in it: nothing else."""
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    rooms: dict[int, dict[str, int]] = {}
    started = time.perf_counter()
    count = 0
    for label, frame in frames:
        batch = decoder.decode(frame)
        for event in batch.events:
            if type(event) is RoomState:
                states = rooms.get(event.room)
                if states is None:
                    states = rooms[event.room] = {}
                states[label] = event.state
        count += len(batch.events)
    return time.perf_counter() - started, count


def _ingest(frames: list[tuple[str, bytes]]) -> tuple[float, int]:
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    model = ClusterModel()
    started = time.perf_counter()
    count = 0
    now = time.time()
    for label, frame in frames:
        batch = decoder.decode(frame)
        model.apply(label, batch, now)
        count += len(batch.events)
    model.sweep(now)
    return time.perf_counter() - started, count


LOAD = WorkloadSpec(rate=20.0, median_pages=16, max_pages=128, max_inflight=32, seed=1)
"""The load the checks are timed under: 20 rooms/s of ~256 KiB through a 1P1D TP2 cluster."""


class _Load(threading.Thread):
    """The workload's Router driving rooms through the cluster until stopped (its sockets live on this thread)."""

    def __init__(self, bootstrap: str, spec: WorkloadSpec) -> None:
        super().__init__(name="bench-load", daemon=True)
        self.bootstrap = bootstrap
        self.spec = spec
        self.stats = WorkloadStats()
        self.error = ""
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            router = Router(self.bootstrap, self.spec)
        except Exception as error:
            self.error = f"the workload did not start: {error}"
            raise
        self.stats = router.stats
        try:
            while not self.stop.is_set():
                router.step()
                time.sleep(0.002)
        finally:
            router.close()

    def finished(self) -> int:
        return self.stats.succeeded + self.stats.failed

    def wait_rooms(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.finished() < count:
            if not self.is_alive() or time.monotonic() > deadline:
                raise BenchFailed(
                    self.error or f"the loaded cluster finished {self.finished()} rooms in {timeout_s:g} s"
                )
            time.sleep(0.05)


_VERDICTS = {0: "OK", 1: "WARNING", 2: "CRITICAL"}


def verdict(returncode: int, stdout: str) -> str:
    """Why a `kvtop check` run gave no verdict ("" when it gave one: exit 0-2 and the status line to match;
    a crash also exits 1, but prints no `KVTOP WARNING - ...`)."""
    shown = stdout.strip()[:300]
    if "UNKNOWN" in stdout:
        return f"kvtop check said UNKNOWN (exit {returncode}): {shown!r}"
    word = _VERDICTS.get(returncode)
    if word is None:
        return f"kvtop check exited {returncode}: {shown!r}"
    if not stdout.startswith(f"KVTOP {word} - "):
        return f"kvtop check exited {returncode} without its KVTOP {word} line: {shown!r}"
    return ""


def check_wall_s(repeats: int, load: WorkloadSpec = LOAD) -> tuple[float, list[int], int]:
    """Median wall time of the installed `kvtop check` against a 1P1D TP2 local cluster under `load`, each
    check's exit code, and the rooms the cluster finished meanwhile; raises BenchFailed when a check gave
    no verdict or no room finished while they ran."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    spec = ClusterSpec(prefill_tp=2, decode_tp=2, num_pages=1024, page_bytes=16384, log_level="WARNING")
    with LocalCluster(spec) as cluster:
        driver = _Load(cluster.endpoint, load)
        driver.start()
        try:
            driver.wait_rooms(10, 60.0)  # the load is flowing before the first check
            before = driver.finished()
            walls: list[float] = []
            codes: list[int] = []
            for _ in range(repeats):
                started = time.perf_counter()
                done = subprocess.run(
                    [command, "check", "--bootstrap", cluster.endpoint], capture_output=True, text=True, check=False
                )
                walls.append(time.perf_counter() - started)
                codes.append(done.returncode)
                problem = verdict(done.returncode, done.stdout)
                if problem:
                    raise BenchFailed(problem + (f" (stderr: {done.stderr.strip()[-300:]!r})" if done.stderr else ""))
            during = driver.finished() - before
        finally:
            driver.stop.set()
            driver.join(10)
    if during == 0:
        raise BenchFailed("the cluster finished no room while the checks ran: they were not timed under load")
    return statistics.median(walls), codes, during


def measure_ingest(
    events_total: int, repeats: int, progress: Callable[[str], None], floor: bool = False
) -> IngestResult:
    frames = synthetic_frames(events_total)
    ingest: list[float] = []
    decode: list[float] = []
    table: list[float] = []
    count = 0
    for repeat in range(repeats):
        seconds, count = _decode_only(frames)
        decode.append(count / seconds)
        seconds, count = _ingest(frames)
        ingest.append(count / seconds)
        line = f"run {repeat + 1}/{repeats}: ingest {ingest[-1]:,.0f} events/s, decode only {decode[-1]:,.0f}"
        if floor:
            seconds, count = _room_table(frames)
            table.append(count / seconds)
            line += f", room table only {table[-1]:,.0f}"
        progress(line)
    wall, codes, during = check_wall_s(repeats)
    progress(
        f"kvtop check: {wall:.2f} s wall (median of {repeats}, Python start included), exit codes {codes}, "
        f"{during} rooms finished meanwhile"
    )
    rate, base = statistics.median(ingest), statistics.median(decode)
    result = IngestResult(
        events_per_s=round(rate),
        decode_only_per_s=round(base),
        ratio=round(rate / base, 3),
        check_wall_s=round(wall, 3),
        check_exit_codes=codes,
        check_load_rooms=during,
        events=count,
        repeats=repeats,
    )
    if not floor:
        return result
    bare = statistics.median(table)
    return replace(result, floor_per_s=round(bare), ratio_floor=round(bare / base, 3))
