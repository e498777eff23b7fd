"""The on-disk layout of a recording, documented once, and its errors.

A recording is a folder (mode 0750) of segments, each with an index beside it (files 0640)::

    seg-<first arrival, µs since the epoch, 17 digits>-<seq, 6 digits>.kvr    the segment
    seg-....kvr.idx                                                        its time index

    segment  FILE_HEADER, then blocks, appended; never rewritten
        FILE_HEADER (32 bytes)  magic b"KVTOPREC", schema u16, event schema u16, created f64 (epoch s),
                                reserved u64, xxh32 of the first 28 bytes u32
        block                   BLOCK_HEADER (44 bytes), then `comp_len` bytes of zstd payload
        BLOCK_HEADER            magic b"KVBK", kind u8, codec u8, reserved u16, t_first f64, t_last f64,
                                ops u32, raw_len u32, comp_len u32, xxh32 of the payload u32,
                                xxh32 of the first 40 header bytes u32
        payload                 zstd frame of one msgpack array of ops (records.py)

    index    INDEX_HEADER (32 bytes, as FILE_HEADER with magic b"KVTOPIDX"), then one INDEX_ENTRY per
             block: t_first f64, t_last f64, offset u64, comp_len u32, kind u8, reserved u8+u16,
             ops u32, xxh32 of the first 36 bytes u32 (40 bytes)

Block kinds: OPS (what the collector applied, in order), KEYFRAME (the model's whole state at one instant),
MARKS (failure origins of the OPS blocks before it, for jump-to-origin without decoding the events).

A torn write (kill -9, a full disk) leaves a block or an index entry whose checksum fails or that ends
early: it reads as absent, and everything after it in that segment counts as lost (`Damage`). The index is
derived: one missing, short or damaged is rebuilt by scanning its segment. A segment whose header is bad
is skipped and counted; the segments after it replay.

Errors (the root is `RecordingError`)::

    RecordingError          a recording cannot be opened or read (no such folder, no segment)
    ├── UnknownSchema       a file of another schema version (written by another kvtop)
    └── NotARecording       a file that is no kvtop segment (bad magic)
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

import xxhash

from transport.plane.events import EVENT_SCHEMA

SCHEMA_VERSION: Final = 1
"""Bumped when the layout or the ops change incompatibly; a reader refuses every other version."""
SEGMENT_MAGIC: Final = b"KVTOPREC"
INDEX_MAGIC: Final = b"KVTOPIDX"
BLOCK_MAGIC: Final = b"KVBK"
SEGMENT_SUFFIX: Final = ".kvr"
INDEX_SUFFIX: Final = ".kvr.idx"
CODEC_ZSTD: Final = 1

FILE_MODE: Final = 0o640
DIR_MODE: Final = 0o750

FILE_HEADER = struct.Struct("<8sHHdQI")
BLOCK_HEADER = struct.Struct("<4sBBHddIIIII")
INDEX_ENTRY = struct.Struct("<ddQIBBHII")
MAX_BLOCK_BYTES: Final = 256 << 20
"""The largest payload a reader accepts (compressed or not): a header naming more is damage."""


class BlockKind(IntEnum):
    OPS = 1
    KEYFRAME = 2
    MARKS = 3


class RecordingError(Exception):
    """A recording that cannot be opened or read."""


class UnknownSchema(RecordingError):
    """A file written in another schema version."""


class NotARecording(RecordingError):
    """A file that is no kvtop segment or index."""


class NothingRecorded(RecordingError):
    """A recording's folder with no segment in it (yet: a recorder writes its first within a second)."""


def checksum(data: bytes | memoryview) -> int:
    return int(xxhash.xxh32_intdigest(data))


def file_header(magic: bytes, created: float) -> bytes:
    body = FILE_HEADER.pack(magic, SCHEMA_VERSION, EVENT_SCHEMA, created, 0, 0)[:-4]
    return body + struct.pack("<I", checksum(body))


def check_file_header(data: bytes, magic: bytes, name: str) -> float:
    """The creation time in a segment's or index's header; raises when it is no header of this schema."""
    if len(data) < FILE_HEADER.size:
        raise NotARecording(f"{name}: {len(data)} bytes, shorter than a header")
    found, schema, event_schema, created, _, crc = FILE_HEADER.unpack_from(data)
    if found != magic:
        raise NotARecording(f"{name}: not a kvtop recording file (magic {found!r})")
    if crc != checksum(data[: FILE_HEADER.size - 4]):
        raise NotARecording(f"{name}: damaged header (checksum mismatch)")
    if schema != SCHEMA_VERSION:
        raise UnknownSchema(f"{name}: recording schema {schema}, this kvtop reads schema {SCHEMA_VERSION}")
    if event_schema != EVENT_SCHEMA:
        raise UnknownSchema(f"{name}: event schema {event_schema}, this kvtop reads event schema {EVENT_SCHEMA}")
    return float(created)


def block_header(kind: BlockKind, t_first: float, t_last: float, ops: int, raw_len: int, payload: bytes) -> bytes:
    body = BLOCK_HEADER.pack(
        BLOCK_MAGIC, kind, CODEC_ZSTD, 0, t_first, t_last, ops, raw_len, len(payload), checksum(payload), 0
    )[:-4]
    return body + struct.pack("<I", checksum(body))


def index_entry(kind: BlockKind, t_first: float, t_last: float, offset: int, comp_len: int, ops: int) -> bytes:
    body = INDEX_ENTRY.pack(t_first, t_last, offset, comp_len, kind, 0, 0, ops, 0)[:-4]
    return body + struct.pack("<I", checksum(body))
