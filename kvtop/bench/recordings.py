"""Synthetic recordings for `kvtop bench replay`: an hour at 50k events/s, written in the recorder's format.

Encoding and compressing 180M events the way the live recorder does would take the bench minutes, so the
hour is built from parts that cost what real ones cost to *read*: a warm model (a million events of the
`bench ingest` mix applied: full rings, 10k finished rooms) is the keyframe written every
`keyframe_events`, and between keyframes the ops are batches of the same mix (unseen rooms; 200 events
each, 16 agents), re-timed to the rate, pre-encoded once (`msgspec.Raw`: the bytes the recorder would
write) and compressed per block. A seek therefore restores a keyframe as large as a busy cluster's and
replays up to `keyframe_events` events of real batches, as it would in a real hour. Failure-origin marks
are left out (the seek never reads them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
import zstandard

from kvtop.bench.ingest import synthetic_frames
from kvtop.model.cluster import ClusterModel
from kvtop.record.format import SEGMENT_SUFFIX, BlockKind
from kvtop.record.keyframes import capture
from kvtop.record.segment import KEYFRAME_ZSTD_LEVEL, ZSTD_LEVEL, SegmentWriter
from kvtop.record.writer import FLUSH_S, KEYFRAME_EVENTS, SEGMENT_BYTES, make_folder
from transport.plane.events import EventBatch
from transport.wire import FrameDecoder

PASS_S = 0.05
"""The collector's pass: the deliveries of one pass share their arrival time."""


class _RawDelivered(msgspec.Struct, tag="d", array_like=True):
    """Encodes exactly as `records.Delivered`, its batch pre-encoded."""

    now: float
    label: str
    item: msgspec.Raw


class _RawSwept(msgspec.Struct, tag="s", array_like=True):
    now: float


def _batches(events: int, seed: int) -> list[tuple[str, EventBatch]]:
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    return [(label, decoder.decode(frame)) for label, frame in synthetic_frames(events, seed=seed)]


def warm_model(events: int = 1_000_000) -> ClusterModel:
    """A model that applied `events` of the ingest mix (rooms retired as a collector's sweeps would)."""
    model = ClusterModel()
    now = time.time()
    for index, (label, batch) in enumerate(_batches(events, seed=11)):
        model.apply(label, batch, now)
        if index % 50 == 0:
            now += 0.5
            model.sweep(now)
    return model


Block = tuple[BlockKind, float, float, int, int, bytes]
"""(kind, t_first, t_last, ops, raw length, zstd payload): one block as the recorder would write it."""


def synthetic_blocks(
    seconds: float,
    events_per_s: float = 50_000.0,
    keyframe_events: int = KEYFRAME_EVENTS,
    start: float = 1_790_000_000.0,
    model: ClusterModel | None = None,
) -> Iterator[Block]:
    """The blocks of `seconds` of recording at `events_per_s`: a keyframe of the warm model every
    `keyframe_events`, ops blocks every `FLUSH_S` between them."""
    pool = _batches(keyframe_events, seed=12)
    raw_pool = [(label, msgspec.Raw(msgspec.msgpack.encode(batch)), len(batch.events)) for label, batch in pool]
    keyframe = capture(model or warm_model())
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    keyframe_payload = zstandard.ZstdCompressor(level=KEYFRAME_ZSTD_LEVEL).compress(keyframe)
    per_pass = events_per_s * PASS_S
    passes_per_block = round(FLUSH_S / PASS_S)
    since_keyframe, cursor, passes = keyframe_events, 0, 0
    now, end = start, start + seconds
    while now < end:
        if since_keyframe >= keyframe_events:
            yield BlockKind.KEYFRAME, now, now, 1, len(keyframe), keyframe_payload
            since_keyframe, cursor = 0, 0
        ops: list[_RawDelivered | _RawSwept] = []
        first = now + PASS_S
        for _ in range(passes_per_block):
            now += PASS_S
            passes += 1
            budget = per_pass
            while budget > 0 and cursor < len(raw_pool):
                label, raw, count = raw_pool[cursor]
                ops.append(_RawDelivered(now, label, raw))
                cursor += 1
                budget -= count
                since_keyframe += count
            if passes % 10 == 0:
                ops.append(_RawSwept(now))
        raw_block = msgspec.msgpack.encode(ops)
        yield BlockKind.OPS, first, now, len(ops), len(raw_block), compressor.compress(raw_block)


def write_segments(folder: Path, blocks: Iterable[Block]) -> float:
    """Write `blocks` as the recorder does (a new segment at a keyframe past `SEGMENT_BYTES`); returns the
    seconds spent writing (generating the blocks not counted)."""
    make_folder(folder)
    segment: SegmentWriter | None = None
    spent, sequence = 0.0, 0
    for kind, t_first, t_last, ops, raw_len, payload in blocks:
        started = time.perf_counter()
        if kind is BlockKind.KEYFRAME and (segment is None or segment.size >= SEGMENT_BYTES):
            if segment is not None:
                segment.close()
            sequence += 1
            segment = SegmentWriter(folder / f"seg-{int(t_first * 1e6):017d}-{sequence:06d}{SEGMENT_SUFFIX}", t_first)
        assert segment is not None
        segment.append_compressed(kind, t_first, t_last, ops, raw_len, payload)
        spent += time.perf_counter() - started
    if segment is not None:
        segment.close()
    return spent
