"""`kvtop bench replay`: what the flight recorder costs and how fast a recording seeks, each figure against
a baseline measured in the same run.

Legs:

- **transfer**: `bench events`' watched transfer runs (a collector in its own process decoding every batch
  into a model), alternating a collector that records (`kvtop.record`, as `kvtop record` does) with one
  that does not. Cost = 1 - GB/s recorded / GB/s not; bytes per million events from the real recordings.
- **ingest**: the collector's loop over the `bench ingest` frames (decode, apply, sweep), with and without
  a recorder fed as the live collector feeds it (its writer thread running; the time includes writing
  everything out). Ratio = events/s recorded / events/s not.
- **keep up**: the recorder alone on one thread: the collector's side (`delivered`, with the frames the
  batches came in, as the live collector hands them over) for 1M events, then the writer's flush (encode,
  compress, write), plus the keyframes those events cost (captures of a warm model, amortised): events/s
  against the 200k/s target.
- **formats**: the same synthetic blocks written to append-only segments and to SQLite (WAL): seconds per
  million events written, bytes per million events, and the median time to find, read and decompress the
  blocks a seek needs (segments also check their checksums; SQLite has none per block).
- **seek**: a synthetic hour at 50k events/s (see kvtop.bench.recordings: a warm model's keyframe every
  50k events, the ingest mix re-timed between them), then seeks to random times: open, restore the
  keyframe, replay up to the time; median and worst, and the memory a seek took (tracemalloc peak).
"""

from __future__ import annotations

import bisect
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import zstandard

from kvtop.bench import BenchFailed
from kvtop.bench.ingest import synthetic_frames
from kvtop.bench.recordings import synthetic_blocks, warm_model, write_segments
from kvtop.bench.report import Compare, Report, at_least, at_most
from kvtop.bench.sqlite_store import SqliteBlocks
from kvtop.bench.transfer import run_kvtop
from kvtop.bench.watch import CollectorProcess
from kvtop.model.cluster import ClusterModel
from kvtop.record.format import BlockKind
from kvtop.record.keyframes import capture
from kvtop.record.reader import Recording
from kvtop.record.replay import Replay
from kvtop.record.segment import KEYFRAME_ZSTD_LEVEL
from kvtop.record.writer import KEYFRAME_EVENTS, Recorder
from transport.plane.events import EventBatch
from transport.wire import FrameDecoder

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReplayResult:
    gbps_recording: float
    gbps_not_recording: float
    transfer_cost: float
    """1 - recording/not: the share of a watched cluster's transfer throughput recording costs (target <= 0.03)."""
    cpu_s_per_gb_recording: float
    """Median CPU seconds per GB moved (both ranks and the collector), recording and not."""
    cpu_s_per_gb_not_recording: float
    cpu_cost: float
    """1 - not/recording of CPU per GB: the share of the work recording adds, whatever share of a shared
    machine's cores the runs got (the steadier figure where other work competes for the cores)."""
    events_recorded: int
    """Events the recording collector wrote in the run that wrote the fewest."""
    recorder_cpu_share: float
    """The recorder's own CPU per GB moved (the events of a GB at the keep-up rate) over the CPU per GB of the
    runs that did not record: what recording adds, measured apart from the noise of whole transfer runs."""
    bytes_per_million_events: float
    """Of the real recordings (the transfer legs: rooms of 4 MiB, keyframes included)."""
    ingest_per_s_recording: float
    ingest_per_s_not_recording: float
    ingest_ratio: float
    keep_up_events_per_s: float
    """The recorder alone on one core (collector side, writer, keyframes amortised; per CPU second of its
    thread, so other work on a shared machine does not count); target >= 200k."""
    keyframe_capture_ms: float
    """Capturing a warm model's keyframe (under the collector's lock), median CPU ms."""
    keyframe_bytes: int
    """A warm model's keyframe on disk (compressed)."""
    synthetic_bytes_per_million_events: float
    """The keep-up leg's recording (the ingest mix: random room ids, 200 events per batch)."""
    segments_write_s_per_million: float
    sqlite_write_s_per_million: float
    segments_bytes_per_million: float
    sqlite_bytes_per_million: float
    segments_lookup_ms: float
    sqlite_lookup_ms: float
    seek_hours: float
    seek_events: int
    seek_open_ms: float
    seek_median_ms: float
    seek_max_ms: float
    seek_median_cpu_ms: float
    """CPU time of a seek (its thread's): what it costs, apart from waiting for a shared machine's cores."""
    seek_peak_mib: float
    """The largest memory one seek took (tracemalloc peak, the model it builds included)."""
    seek_from_start_s: float
    """The baseline a seek replaces: replaying the hour from its start at this run's ingest rate (estimated
    from the ingest leg: seek_events / ingest_per_s_not_recording)."""
    seeks: int
    repeats: int

    REPORT: ClassVar[Report] = Report(
        setting=("repeats", "seeks", "seek_hours", "seek_events"),
        compare=(
            Compare("gbps_recording", "gbps_not_recording", "transfer_cost"),
            Compare("cpu_s_per_gb_recording", "cpu_s_per_gb_not_recording", "cpu_cost"),
            Compare("ingest_per_s_recording", "ingest_per_s_not_recording", "ingest_ratio"),
        ),
        targets=(
            at_most("transfer_cost", 0.03),
            at_least("keep_up_events_per_s", 200_000),
            at_most("seek_median_ms", 200.0),
        ),
    )

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class _Transfer:
    gbps_on: float
    gbps_off: float
    cpu_on: float
    """CPU seconds per GB moved: both ranks and the collector (`kvtop.bench.cpu`)."""
    cpu_off: float
    events: int
    bytes_per_million: float


def _transfer(chunk: int, room: int, rooms: int, repeats: int, folder: Path, progress: Progress) -> _Transfer:
    recording: list[float] = []
    plain: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    recorded: list[tuple[int, int]] = []
    total = room * rooms
    for repeat in range(repeats):
        recorder = CollectorProcess(rooms, record_to=str(folder / f"transfer-{repeat}"))
        collector = CollectorProcess(rooms)
        if repeat % 2:  # each leg goes first every other repeat: a machine's drift favours neither
            off = run_kvtop(chunk, room, rooms, publish_events=True, watcher=collector)
        on = run_kvtop(chunk, room, rooms, publish_events=True, watcher=recorder)
        if not repeat % 2:
            off = run_kvtop(chunk, room, rooms, publish_events=True, watcher=collector)
        watched = recorder.result()
        collector.result()
        if not watched.recorded_events:
            raise BenchFailed("the recording collector wrote no events: the recording run measured nothing")
        recording.append(total / on.seconds / 1e9)
        plain.append(total / off.seconds / 1e9)
        cpu_on.append(on.cpu_seconds / total * 1e9)
        cpu_off.append(off.cpu_seconds / total * 1e9)
        recorded.append((watched.recorded_events, watched.recorded_bytes))
        progress(
            f"transfer {repeat + 1}/{repeats}: recording {recording[-1]:.2f} GB/s ({watched.recorded_events:,} events, "
            f"{watched.recorded_bytes:,} bytes; {cpu_on[-1]:.2f} CPU s/GB), not recording {plain[-1]:.2f} GB/s "
            f"({cpu_off[-1]:.2f} CPU s/GB)"
        )
    events = sum(e for e, _ in recorded)
    return _Transfer(
        statistics.median(recording), statistics.median(plain), statistics.median(cpu_on), statistics.median(cpu_off),
        min(e for e, _ in recorded), sum(b for _, b in recorded) / events * 1e6,
    )  # fmt: skip


def _ingest_once(frames: list[tuple[str, bytes]], recorder: Recorder | None) -> float:
    """Events/s of the collector's loop over `frames` (passes of 25 frames), recording into `recorder`."""
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    model = ClusterModel()
    events = 0
    now = time.time()
    started = time.perf_counter()
    if recorder is not None:
        recorder.start()
        recorder.tick(model, now)
    for index, (label, frame) in enumerate(frames):
        batch = decoder.decode(frame)
        if recorder is not None:
            recorder.delivered(label, batch, now, frame)
        model.apply(label, batch, now)
        events += len(batch.events)
        if index % 25 == 24:
            now += 0.05
            if index % 250 == 249:
                model.sweep(now)
                if recorder is not None:
                    recorder.swept(now)
            if recorder is not None:
                recorder.accounted(model, now)
                recorder.tick(model, now)
    if recorder is not None:
        recorder.close()
        if recorder.stats().events != events:
            raise BenchFailed(f"the recorder wrote {recorder.stats().events} of {events} events")
    return events / (time.perf_counter() - started)


def _ingest(events: int, repeats: int, folder: Path, progress: Progress) -> tuple[float, float]:
    frames = synthetic_frames(events)
    recording: list[float] = []
    plain: list[float] = []
    for repeat in range(repeats):
        recording.append(_ingest_once(frames, Recorder(folder / f"ingest-{repeat}")))
        plain.append(_ingest_once(frames, None))
        progress(f"ingest {repeat + 1}/{repeats}: recording {recording[-1]:,.0f} events/s, not {plain[-1]:,.0f}")
    return statistics.median(recording), statistics.median(plain)


def _keep_up(events: int, folder: Path, model: ClusterModel, progress: Progress) -> tuple[float, float, int, float]:
    """Events/s of the recorder alone on one thread; keyframe capture ms and bytes; bytes per M events."""
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    batches = [(label, decoder.decode(frame), frame) for label, frame in synthetic_frames(events, seed=5)]
    captures = []
    for _ in range(5):
        started = time.thread_time()
        state = capture(model)
        captures.append(time.thread_time() - started)
    capture_s = statistics.median(captures)
    recorder = Recorder(folder / "keep-up", keyframe_events=10**12, keyframe_s=1e12)
    now = time.time()
    started = time.thread_time()  # CPU time of this thread: one core's work, whoever else wants the cores
    for index, (label, batch, frame) in enumerate(batches):
        recorder.delivered(label, batch, now, frame)
        if index % 25 == 24:
            now += 0.05
    recorder.close()  # not started: the flush runs on this thread
    spent = time.thread_time() - started
    stats = recorder.stats()
    if stats.events != sum(len(b.events) for _, b, _ in batches) or stats.error:
        raise BenchFailed(f"the recorder wrote {stats.events} events ({stats.error or 'no error'})")
    keyframes = stats.events / KEYFRAME_EVENTS
    rate = stats.events / (spent + keyframes * capture_s)
    keyframe_bytes = len(zstandard.ZstdCompressor(level=KEYFRAME_ZSTD_LEVEL).compress(state))
    progress(f"keep up: {rate:,.0f} events/s on one thread (keyframe capture {capture_s * 1000:.1f} ms)")
    return rate, capture_s * 1000, keyframe_bytes, stats.bytes / stats.events * 1e6


def _formats(seconds: float, model: ClusterModel, folder: Path, seeks: int, progress: Progress) -> dict[str, float]:
    blocks = list(synthetic_blocks(seconds, model=model))
    events = seconds * 50_000
    segments_s = write_segments(folder / "segments", blocks)
    store = SqliteBlocks(folder / "blocks.sqlite")
    started = time.perf_counter()
    for block in blocks:
        store.append(*block)
    sqlite_s = time.perf_counter() - started
    store.close()
    store = SqliteBlocks(folder / "blocks.sqlite")
    recording = Recording(folder / "segments")
    keyframes = [(b.entry.t_first, i) for i, b in enumerate(recording.blocks) if b.kind is BlockKind.KEYFRAME]
    rng = random.Random(3)
    times = [rng.uniform(recording.start, recording.end) for _ in range(seeks)]
    segment_ms, sqlite_ms = [], []
    decompressor = zstandard.ZstdDecompressor()
    for t in times:
        started = time.perf_counter()
        _segment_lookup(recording, keyframes, t)
        segment_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        [decompressor.decompress(blob) for blob in store.seek(t)]
        sqlite_ms.append((time.perf_counter() - started) * 1000)
    sqlite_bytes = store.bytes_on_disk()
    store.db.close()
    result = {
        "segments_write_s_per_million": segments_s / events * 1e6,
        "sqlite_write_s_per_million": sqlite_s / events * 1e6,
        "segments_bytes_per_million": recording.bytes_on_disk() / events * 1e6,
        "sqlite_bytes_per_million": sqlite_bytes / events * 1e6,
        "segments_lookup_ms": statistics.median(segment_ms),
        "sqlite_lookup_ms": statistics.median(sqlite_ms),
    }
    progress("formats: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()))
    return result


def _segment_lookup(recording: Recording, keyframes: list[tuple[float, int]], t: float) -> list[bytes | None]:
    """The payloads a seek to `t` reads from segments (the latest keyframe, then the ops blocks up to `t`),
    found as `Replay.at` finds them (`keyframes`: (time, block index) of each, in order)."""
    blocks = recording.blocks
    keyframe = keyframes[bisect.bisect_right(keyframes, (t, len(blocks))) - 1][1]
    wanted = [blocks[keyframe]]
    for block in blocks[keyframe + 1 :]:
        if block.entry.t_first > t:
            break
        if block.kind is BlockKind.OPS:
            wanted.append(block)
    return [recording.read(block) for block in wanted]


def _seek(hours: float, seeks: int, model: ClusterModel, folder: Path, progress: Progress) -> dict[str, float]:
    started = time.perf_counter()
    write_segments(folder / "hour", synthetic_blocks(hours * 3600, model=model))
    progress(f"seek: wrote {hours:g} h at 50k events/s in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    replay = Replay(folder / "hour")
    open_ms = (time.perf_counter() - started) * 1000
    rng = random.Random(4)
    spent: list[float] = []
    cpu: list[float] = []
    for _ in range(seeks):
        t = rng.uniform(replay.start, replay.end)
        started, started_cpu = time.perf_counter(), time.thread_time()
        cursor = replay.at(t)
        spent.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        if cursor.inexact or (not cursor.model.rooms and not cursor.model.finished):
            raise BenchFailed(f"a seek to {t} built no model (inexact={cursor.inexact})")
    tracemalloc.start()
    replay.at(rng.uniform(replay.start, replay.end))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    progress(f"seek: open {open_ms:.1f} ms, median {statistics.median(spent):.0f} ms, max {max(spent):.0f} ms")
    return {
        "seek_open_ms": open_ms,
        "seek_median_ms": statistics.median(spent),
        "seek_max_ms": max(spent),
        "seek_median_cpu_ms": statistics.median(cpu),
        "seek_peak_mib": peak / (1 << 20),
        "seek_events": int(hours * 3600 * 50_000),
    }


def measure_replay(
    chunk: int,
    room: int,
    rooms: int,
    repeats: int,
    ingest_events: int,
    hours: float,
    seeks: int,
    progress: Progress,
) -> ReplayResult:
    with tempfile.TemporaryDirectory(prefix="kvtop-bench-replay-") as tmp:
        folder = Path(tmp)
        transfer = _transfer(chunk, room, rooms, repeats, folder, progress)
        ingest_on, ingest_off = _ingest(ingest_events, repeats, folder, progress)
        model = warm_model()
        keep_up, capture_ms, keyframe_bytes, synthetic_per_million = _keep_up(1_000_000, folder, model, progress)
        formats = _formats(300.0, model, folder / "formats", seeks, progress)
        seek = _seek(hours, seeks, model, folder, progress)
    return ReplayResult(
        gbps_recording=round(transfer.gbps_on, 3),
        gbps_not_recording=round(transfer.gbps_off, 3),
        transfer_cost=round(1 - transfer.gbps_on / transfer.gbps_off, 4),
        cpu_s_per_gb_recording=round(transfer.cpu_on, 3),
        cpu_s_per_gb_not_recording=round(transfer.cpu_off, 3),
        cpu_cost=round(1 - transfer.cpu_off / transfer.cpu_on, 4),
        events_recorded=transfer.events,
        recorder_cpu_share=round(transfer.events / (room * rooms / 1e9) / keep_up / transfer.cpu_off, 5),
        bytes_per_million_events=round(transfer.bytes_per_million),
        ingest_per_s_recording=round(ingest_on),
        ingest_per_s_not_recording=round(ingest_off),
        ingest_ratio=round(ingest_on / ingest_off, 3),
        keep_up_events_per_s=round(keep_up),
        keyframe_capture_ms=round(capture_ms, 2),
        keyframe_bytes=keyframe_bytes,
        synthetic_bytes_per_million_events=round(synthetic_per_million),
        **{key: round(value, 4) for key, value in formats.items()},
        seek_hours=hours,
        seek_events=int(seek.pop("seek_events")),
        **{key: round(value, 2) for key, value in seek.items()},
        seek_from_start_s=round(hours * 3600 * 50_000 / ingest_off, 1),
        seeks=seeks,
        repeats=repeats,
    )
