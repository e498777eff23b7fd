"""`kvtop bench incidents`: what the incidents cost ingest, and their memory with a million failed rooms.

Cost: real encoded frames of a synthetic cluster (every room's states on every rank of both instances; 5 % of
rooms fail the way real ones do, a checksum origin on a decode rank naming its sender, an echo on its other
rank and on both prefill ranks), decoded and applied to the model with a sweep every 1,000 rooms, as the
collector applies them, at the garbage collector's thresholds of every long-lived collecting process
(`tune_gc`: the dashboard's model process, `kvtop export`, `kvtop record`). Two figures: the time spent in
the incident tracker (its `add` and `update`, timed inside the run) as a share of the run, and the A/B ratio
against the same model whose tracker takes nothing, the legs run back to back in each repeat (in turns first),
the median of the repeats' ratios (this VM's speed drifts by tens of percent within seconds: the in-run share
is the steadier figure).

Memory: a million failed rooms (an origin naming one of eight senders, and an echo), applied in deliveries
with a sweep every 10,000 rooms; the process's RSS and the tracker's bounded structures are read at 10 %,
50 % and 100 %. The bench fails when the rooms were not all taken in or no incident formed.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

import psutil

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_most
from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import Observed
from kvtop.model.incidents import IncidentTracker
from kvtop.model.suspects import Surroundings
from kvtop.sources.live import tune_gc
from kvtop.sources.synthetic import SyntheticCluster
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, Failure
from transport.wire import FrameDecoder, encode

CLUSTER = SyntheticCluster(prefill=4, decode=4, tp=2, spacing_s=0.001, failure_rate=0.05)
ROOMS_PER_CHUNK = 50
SWEEP_EVERY_ROOMS = 1000


@dataclass(frozen=True)
class IncidentsResult:
    events_per_s_tracked: float
    events_per_s_untracked: float
    cost: float
    """1 - the median of the repeats' tracked / untracked ratios (target <= 0.05)."""
    share: float
    """The time inside the incident tracker over the tracked run's time (median of the repeats)."""
    events: int
    failures: int
    incidents: int
    repeats: int
    memory_rooms: int
    rss_mb: list[float]
    """The process's RSS at 10 %, 50 % and 100 % of the failed rooms."""
    tracked_rooms: int
    listed_rooms: int
    incidents_kept: int

    REPORT: ClassVar[Report] = Report(
        setting=("events", "repeats", "memory_rooms"),
        compare=(Compare("events_per_s_tracked", "events_per_s_untracked", "cost"),),
        targets=(at_most("cost", 0.05),),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Untracked(IncidentTracker):
    """The baseline: a tracker that takes nothing."""

    def add(self, failure: Observed, around: Surroundings) -> None:
        pass

    def update(self, around: Surroundings, final: bool = True) -> None:
        pass


class _Timed(IncidentTracker):
    """The tracker as the model runs it, its own time summed."""

    spent = 0.0

    def add(self, failure: Observed, around: Surroundings) -> None:
        started = time.perf_counter()
        super().add(failure, around)
        self.spent += time.perf_counter() - started

    def update(self, around: Surroundings, final: bool = True) -> None:
        started = time.perf_counter()
        super().update(around, final)
        self.spent += time.perf_counter() - started


def _frames(rooms: int) -> list[list[tuple[str, bytes]]]:
    """Encoded batches, a list per chunk of `ROOMS_PER_CHUNK` rooms (one batch per rank each)."""
    chunks = []
    for first in range(0, rooms, ROOMS_PER_CHUNK):
        chunks.append([(label, encode(batch)) for label, batch in CLUSTER.rooms(ROOMS_PER_CHUNK, first)])
    return chunks


def _ingest(chunks: list[list[tuple[str, bytes]]], tracked: bool) -> tuple[float, int, ClusterModel]:
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    model = ClusterModel()
    model.incidents = _Timed() if tracked else _Untracked()
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, CLUSTER.start)
    count = 0
    started = time.perf_counter()
    for index, chunk in enumerate(chunks):
        now = CLUSTER.start + (index + 1) * ROOMS_PER_CHUNK * CLUSTER.spacing_s
        for label, frame in chunk:
            batch = decoder.decode(frame)
            model.apply(label, batch, now)
            count += len(batch.events)
        if (index + 1) * ROOMS_PER_CHUNK % SWEEP_EVERY_ROOMS == 0:
            model.sweep(now)
    model.sweep(now + 2.0)
    return time.perf_counter() - started, count, model


def _memory(rooms: int, progress: Callable[[str], None]) -> tuple[list[float], ClusterModel]:
    """A million failed rooms (or `rooms`): RSS at 10 %, 50 %, 100 %, and the model they left."""
    model = ClusterModel()
    process = psutil.Process()
    marks = {rooms // 10, rooms // 2, rooms}
    rss: list[float] = []
    start, per_delivery = CLUSTER.start, 100
    for seq, first in enumerate(range(0, rooms, per_delivery), start=1):
        origins: list[Event] = []
        echoes: list[Event] = []
        for room in range(first, min(rooms, first + per_delivery)):
            ts = start + room * 0.01
            sender = f"prefill-{room % 8}/TP0"
            reason = f"KV chunk 1 of room {room} from prefill rank 0 failed its checksum"
            origins.append(
                Failure(ts, room, "decode-0/TP0", reason, "checksum", "error", False, "decode-0/TP0", sender)
            )
            echoes.append(Failure(ts, room, "decode-0/TP1", "Failed due to an unknown reason from another rank",
                                  "propagated", "debug", True, "decode-0/TP0"))  # fmt: skip
        now = start + min(rooms, first + per_delivery) * 0.01
        for rank, events in ((0, origins), (1, echoes)):
            batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", rank, 1, seq, now, events)
            model.apply(f"decode-0/TP{rank}", batch, now)
        done = min(rooms, first + per_delivery)
        if done % 10_000 == 0 or done == rooms:
            model.sweep(now)
        if done in marks:
            gc.collect()
            rss.append(round(process.memory_info().rss / 2**20, 1))
            progress(f"{done:,} failed rooms: RSS {rss[-1]:,.0f} MiB, {len(model.incidents.incidents)} incidents kept")
    return rss, model


def measure_incidents(rooms: int, repeats: int, memory_rooms: int, progress: Callable[[str], None]) -> IncidentsResult:
    thresholds = tune_gc()
    try:
        return _measure(rooms, repeats, memory_rooms, progress)
    finally:
        gc.set_threshold(*thresholds)


def _measure(rooms: int, repeats: int, memory_rooms: int, progress: Callable[[str], None]) -> IncidentsResult:
    chunks = _frames(rooms)
    tracked: list[float] = []
    untracked: list[float] = []
    ratios: list[float] = []
    shares: list[float] = []
    count = failures = incidents = 0
    for repeat in range(repeats):
        runs: dict[bool, tuple[float, int, ClusterModel]] = {}
        for leg in (False, True) if repeat % 2 else (True, False):
            runs[leg] = _ingest(chunks, tracked=leg)
        (seconds, count, model), (plain, _, _) = runs[True], runs[False]
        tracked.append(count / seconds)
        untracked.append(count / plain)
        ratios.append(plain / seconds)
        timed = model.incidents
        assert isinstance(timed, _Timed)
        shares.append(timed.spent / seconds)
        failures, incidents = model.failures_total, len(timed.incidents)
        progress(
            f"run {repeat + 1}/{repeats}: {tracked[-1]:,.0f} events/s with incidents, {untracked[-1]:,.0f} without "
            f"(x{ratios[-1]:.3f}); {shares[-1]:.1%} of the run inside the tracker ({failures:,} failures, "
            f"{incidents} incidents)"
        )
    if not failures or not incidents:
        raise BenchFailed(f"the runs took {failures} failures into {incidents} incidents: nothing was measured")
    rss, model = _memory(memory_rooms, progress)
    expected = 2 * memory_rooms
    if model.failures_total != expected or not model.incidents.incidents:
        raise BenchFailed(f"the memory run took {model.failures_total:,} of {expected:,} failures")
    return IncidentsResult(
        events_per_s_tracked=round(statistics.median(tracked)),
        events_per_s_untracked=round(statistics.median(untracked)),
        cost=round(1 - statistics.median(ratios), 4),
        share=round(statistics.median(shares), 4),
        events=count,
        failures=failures,
        incidents=incidents,
        repeats=repeats,
        memory_rooms=memory_rooms,
        rss_mb=rss,
        tracked_rooms=model.incidents.tracking,
        listed_rooms=model.incidents.listed,
        incidents_kept=len(model.incidents.incidents),
    )
