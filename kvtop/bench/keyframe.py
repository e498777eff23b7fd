"""`kvtop bench keyframe`: how long a keyframe holds the collector's lock, forked vs captured under the lock.

The model is `bench ui`'s (`fill`: 100k rooms over 64 ranks, the dashboard's event journal kept). Each leg
plays the collector for `seconds`: passes `FEED_EVERY_S` apart apply new rooms' events at `events_per_s`
under a lock and tell a started `Recorder` (as the dashboard records: the writer thread running) every
delivery, sweep and pass end, with a keyframe every `keyframe_s`. The baseline leg captures keyframes
under the lock (`fork_keyframes=False`, the recorder as it was); the other forks them. Per leg: the lock
time of the passes that took a keyframe (median, worst), every pass's lock time (what a frame build or
the next delivery waits for), the passes while a child worked against the others (what the fork's
copy-on-write and the child's CPU cost the collector), the children's CPU and memory, and what a pass
without a keyframe spends in `accounted` and `tick`.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_most
from kvtop.bench.ui_load import FEED_EVERY_S, SWEEP_EVERY_S, fill
from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.writer import Recorder, RecorderStats
from kvtop.sources.synthetic import SyntheticCluster

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Leg:
    keyframes: int
    keyframe_lock_ms: float
    """Median lock time of the passes' `tick` that took a keyframe."""
    keyframe_lock_max_ms: float
    pass_lock_ms: float
    """Median lock time of a whole pass (apply, sweep, recorder calls)."""
    pass_lock_p99_ms: float
    pass_lock_max_ms: float
    pass_while_child_ms: float
    """Median pass lock time while a child encoded (forked leg; 0 when none did)."""
    pass_otherwise_ms: float
    child_cpu_ms: float
    """CPU of one child (encode and compress), mean."""
    child_written_mib: float
    """The most memory one child wrote to (copied pages, its buffers)."""
    tick_us: float
    """A pass's `tick` without a keyframe (the failure marks), median."""
    accounted_us: float
    rss_mib: float
    keyframe_bytes: int
    """Recording bytes per keyframe written (keyframes dominate: ops of a few seconds are small)."""
    events_per_s: float


@dataclass(frozen=True)
class KeyframeResult:
    rooms: int
    ranks: int
    in_lock: Leg
    forked: Leg
    ratio: float
    """Keyframe lock time captured under the lock / forked (medians)."""

    REPORT: ClassVar[Report] = Report(
        setting=("rooms", "ranks"),
        compare=(Compare("forked.keyframe_lock_ms", "in_lock.keyframe_lock_ms", "ratio"),),
        targets=(at_most("forked.keyframe_lock_ms", 30.0),),
        table=("in_lock", "forked"),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _in_flight(stats: RecorderStats) -> bool:
    """A forked keyframe neither written nor failed yet (the leg's first keyframe: the one under the lock)."""
    return stats.keyframes_forked > stats.keyframes - 1 + stats.keyframes_failed


def _leg(
    model: ClusterModel, cluster: SyntheticCluster, per_pass: int, first_room: int, folder: Path, forked: bool,
    seconds: float, keyframe_s: float,
) -> tuple[Leg, int]:  # fmt: skip
    lock = threading.Lock()
    recorder = Recorder(folder, keyframe_events=10**12, keyframe_s=keyframe_s, fork_keyframes=forked).start()
    with lock:  # its first keyframe, under the lock, as when a collector starts
        recorder.tick(model, time.time())
    keyframe_ticks: list[float] = []
    ticks: list[float] = []
    accounts: list[float] = []
    passes: list[float] = []
    while_child: list[float] = []
    otherwise: list[float] = []
    applied = 0
    started = time.monotonic()
    next_sweep = 0.0
    step = 0
    while time.monotonic() - started < seconds:
        batches = cluster.rooms(per_pass, first_room + step * per_pass)
        child = forked and _in_flight(recorder.stats())
        now = time.time()
        entered = time.perf_counter()
        with lock:
            for label, batch in batches:
                recorder.delivered(label, batch, now)
                model.apply(label, batch, now)
                applied += len(batch.events)
            if now >= next_sweep:
                model.sweep(now)
                recorder.swept(now)
                next_sweep = now + SWEEP_EVERY_S
            before = time.perf_counter()
            recorder.accounted(model, now)
            ticked = time.perf_counter()
            taken = recorder.stats().keyframes_forked + recorder.stats().keyframes_in_lock
            ticking = time.perf_counter()
            recorder.tick(model, now)
            done = time.perf_counter()
            took = recorder.stats().keyframes_forked + recorder.stats().keyframes_in_lock > taken
        held = done - entered - (ticking - ticked)
        passes.append(held)
        (while_child if child else otherwise).append(held)
        accounts.append(ticked - before)
        (keyframe_ticks if took else ticks).append(done - ticking)
        step += 1
        time.sleep(max(0.0, started + step * FEED_EVERY_S - time.monotonic()))
    rate = applied / (time.monotonic() - started)
    recorder.close()
    stats = recorder.stats()
    if stats.error or not keyframe_ticks or stats.keyframes_failed:
        raise BenchFailed(f"no keyframe taken as asked ({stats})")
    if forked and not stats.keyframes_forked:
        raise BenchFailed(f"no keyframe forked ({stats})")
    ordered = sorted(passes)
    leg = Leg(
        keyframes=len(keyframe_ticks),
        keyframe_lock_ms=statistics.median(keyframe_ticks) * 1e3,
        keyframe_lock_max_ms=max(keyframe_ticks) * 1e3,
        pass_lock_ms=statistics.median(passes) * 1e3,
        pass_lock_p99_ms=ordered[int(len(ordered) * 0.99)] * 1e3,
        pass_lock_max_ms=ordered[-1] * 1e3,
        pass_while_child_ms=statistics.median(while_child) * 1e3 if while_child else 0.0,
        pass_otherwise_ms=statistics.median(otherwise) * 1e3,
        child_cpu_ms=stats.keyframe_child_cpu_s / max(1, stats.keyframes_forked) * 1e3,
        child_written_mib=stats.keyframe_child_bytes / (1 << 20),
        tick_us=statistics.median(ticks) * 1e6,
        accounted_us=statistics.median(accounts) * 1e6,
        rss_mib=_rss_mib(),
        keyframe_bytes=stats.bytes // max(1, stats.keyframes),
        events_per_s=rate,
    )
    return leg, first_room + step * per_pass


def _round(leg: Leg) -> Leg:
    rounded: dict[str, object] = {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(leg).items()}
    return Leg(**rounded)  # type: ignore[arg-type]


def measure_keyframe(
    rooms: int, instances: int, tp: int, events_per_s: float, seconds: float, keyframe_s: float, progress: Progress
) -> KeyframeResult:
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    now = time.time()
    progress(f"filling a model of {rooms:,} rooms over {2 * instances * tp} ranks ...")
    fill(model, rooms, instances, tp, now)
    per_pass = max(1, round(events_per_s * FEED_EVERY_S / (2 * tp * 5 + tp)))  # rooms per pass (ui_load's Feeder)
    cluster = SyntheticCluster(instances, instances, tp, start=now, spacing_s=FEED_EVERY_S / per_pass, seed=2)
    legs: dict[bool, Leg] = {}
    first = 0
    with tempfile.TemporaryDirectory(prefix="kvtop-bench-keyframe-") as tmp:
        for forked in (False, True):
            name = "forked" if forked else "captured under the lock"
            progress(f"{name}: {seconds:g} s at {events_per_s:,.0f} events/s, a keyframe every {keyframe_s:g} s ...")
            legs[forked], first = _leg(model, cluster, per_pass, first, Path(tmp) / name, forked, seconds, keyframe_s)
            leg = legs[forked]
            progress(f"{name}: keyframe lock {leg.keyframe_lock_ms:.1f} ms median, {leg.keyframe_lock_max_ms:.1f} max; "
                     f"pass p99 {leg.pass_lock_p99_ms:.1f} ms")  # fmt: skip
    return KeyframeResult(
        rooms=len(model.rooms) + len(model.finished),
        ranks=len(model.ranks),
        in_lock=_round(legs[False]),
        forked=_round(legs[True]),
        ratio=round(legs[False].keyframe_lock_ms / legs[True].keyframe_lock_ms, 1),
    )
