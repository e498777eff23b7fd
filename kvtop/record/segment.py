"""One segment file and its index: append blocks (`SegmentWriter`), read them back (`SegmentReader`).

Layout in format.py. The writer appends a block, then its index entry (unbuffered writes, so a kill -9
loses at most the block being written); the reader trusts index entries whose checksums hold, scans the
segment after the last of them for blocks the index missed, and reads each block's payload only when its
checksums hold. What could not be read is counted in `SegmentDamage`, never raised.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from kvtop.record.format import (
    BLOCK_HEADER,
    BLOCK_MAGIC,
    CODEC_ZSTD,
    FILE_HEADER,
    FILE_MODE,
    INDEX_ENTRY,
    INDEX_MAGIC,
    MAX_BLOCK_BYTES,
    SEGMENT_MAGIC,
    BlockKind,
    NotARecording,
    RecordingError,
    block_header,
    check_file_header,
    checksum,
    file_header,
    index_entry,
)

ZSTD_LEVEL = 3
"""zstd's default for ops blocks: level 1 saves little time on them and costs bytes."""
KEYFRAME_ZSTD_LEVEL = 1
"""A keyframe (megabytes of a busy model, mostly float rings) compresses as small at level 1, 40 % faster."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One block as the index (or a scan) knows it."""

    kind: BlockKind
    t_first: float
    t_last: float
    offset: int
    """Where its header starts in the segment."""
    comp_len: int
    ops: int


@dataclass
class SegmentDamage:
    """What of one segment could not be read."""

    blocks: int = 0
    """Blocks whose header or payload failed its checksum (skipped)."""
    bytes: int = 0
    """Bytes of the segment no readable block covers (a torn tail, damaged blocks)."""
    index_rebuilt: bool = False
    """Its index was missing, damaged or short, and the scan of the segment found what it lacked."""


def create_file(path: Path) -> int:
    """A new file of mode 0640 (whatever the umask), opened for appending; refuses one that exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


SEGMENT_HEADERS = 2 * FILE_HEADER.size
"""The bytes of a new segment and its index, before any block."""


def block_bytes(comp_len: int) -> int:
    """The bytes a block of a `comp_len`-byte payload takes on disk, its index entry included."""
    return BLOCK_HEADER.size + comp_len + INDEX_ENTRY.size


class SegmentWriter:
    """Appends compressed blocks to a new segment and their entries to its index."""

    def __init__(self, path: Path, created: float) -> None:
        """Raises `OSError` (a full disk) having removed what it made of the segment and its index."""
        self.path = path
        self.size = 0
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self._keyframe_compressor = zstandard.ZstdCompressor(level=KEYFRAME_ZSTD_LEVEL)
        self._fd = self._index_fd = -1
        try:
            self._fd = create_file(path)
            self._index_fd = create_file(index_path(path))
            self._write(self._fd, file_header(SEGMENT_MAGIC, created))
            self._write(self._index_fd, file_header(INDEX_MAGIC, created))
        except OSError:  # a segment without its header would read as damage
            for fd, made in ((self._fd, path), (self._index_fd, index_path(path))):
                if fd >= 0:
                    os.close(fd)
                    made.unlink(missing_ok=True)
            raise
        self.size = FILE_HEADER.size

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def compress(self, kind: BlockKind, raw: bytes) -> bytes:
        """The payload of a block of `raw` (a zstd frame)."""
        compressor = self._keyframe_compressor if kind is BlockKind.KEYFRAME else self._compressor
        return compressor.compress(raw)

    def append_compressed(
        self, kind: BlockKind, t_first: float, t_last: float, ops: int, raw_len: int, payload: bytes
    ) -> int:
        """Append one block whose payload is compressed already (a zstd frame of `raw_len` bytes); returns
        the bytes it took on disk (`block_bytes`). Raises `OSError` (a full disk)."""
        offset = self.size
        self._write(self._fd, block_header(kind, t_first, t_last, ops, raw_len, payload) + payload)
        self.size += BLOCK_HEADER.size + len(payload)
        self._write(self._index_fd, index_entry(kind, t_first, t_last, offset, len(payload), ops))
        return block_bytes(len(payload))

    def close(self, sync: bool = True) -> None:
        """Sync (`sync`) and close both files (both are closed when a sync fails, which raises `OSError`)."""
        try:
            if sync:
                os.fsync(self._fd)
                os.fsync(self._index_fd)
        finally:
            os.close(self._fd)
            os.close(self._index_fd)


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading; `NotARecording` when it is no regular file (opening a FIFO named like a
    segment waited for a writer: the view hung)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARecording(f"{path.name}: not a regular file")
    return os.fdopen(fd, "rb")


def index_path(segment: Path) -> Path:
    return segment.with_name(segment.name + ".idx")


class SegmentReader:
    """Reads one segment: its blocks (from the index, then a scan of what the index missed) and payloads.

    Raises `RecordingError` (`NotARecording`, `UnknownSchema`) when the segment's header is no header of
    this schema: a caller reading a folder skips such a segment and counts it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.damage = SegmentDamage()
        with open_regular(path) as file:
            self.created = check_file_header(file.read(FILE_HEADER.size), SEGMENT_MAGIC, path.name)
            self.size = os.fstat(file.fileno()).st_size
        self._decompressor = zstandard.ZstdDecompressor()
        self._fd: int | None = None
        self.entries = self._read_index()
        last = self.entries[-1] if self.entries else None
        missed = self._scan(last.offset + BLOCK_HEADER.size + last.comp_len if last else FILE_HEADER.size)
        self.damage.index_rebuilt |= bool(missed)
        self.entries += missed
        covered = sum(BLOCK_HEADER.size + entry.comp_len for entry in self.entries)
        self.damage.bytes = max(0, self.size - FILE_HEADER.size - covered)

    def _read_index(self) -> list[Entry]:
        """The entries of the index whose checksums hold and that fit in the segment, up to the first that
        does not (a torn or damaged index: the scan after it finds the rest)."""
        path = index_path(self.path)
        try:
            with open_regular(path) as file:
                data = file.read()
            check_file_header(data, INDEX_MAGIC, path.name)
        except (OSError, RecordingError):  # an index that cannot be read is rebuilt by the scan
            self.damage.index_rebuilt = True
            return []
        entries: list[Entry] = []
        end = FILE_HEADER.size
        for start in range(FILE_HEADER.size, len(data) - INDEX_ENTRY.size + 1, INDEX_ENTRY.size):
            raw = data[start : start + INDEX_ENTRY.size]
            t_first, t_last, offset, comp_len, kind, _, _, ops, crc = INDEX_ENTRY.unpack(raw)
            if crc != checksum(raw[:-4]) or kind not in BlockKind._value2member_map_ or offset != end:
                self.damage.index_rebuilt = True
                break
            if offset + BLOCK_HEADER.size + comp_len > self.size:
                break  # the index got ahead of a block that never landed whole
            entries.append(Entry(BlockKind(kind), t_first, t_last, offset, comp_len, ops))
            end = offset + BLOCK_HEADER.size + comp_len
        return entries

    def _scan(self, offset: int) -> list[Entry]:
        """Blocks from `offset` on, by their headers; past a damaged header, the next header that checks."""
        found: list[Entry] = []
        with open_regular(self.path) as file:
            while offset + BLOCK_HEADER.size <= self.size:
                file.seek(offset)
                header = file.read(BLOCK_HEADER.size)
                parsed = _parse(header, offset, self.size)
                if parsed is None:
                    self.damage.blocks += 1
                    following = _find_header(file, offset + 1, self.size)
                    if following is None:
                        return found
                    offset = following
                    continue
                found.append(parsed[0])
                offset += BLOCK_HEADER.size + parsed[0].comp_len
        return found

    def read(self, entry: Entry) -> bytes | None:
        """The block's uncompressed payload, or None (counted) when it fails its checksums (the segment stays
        open for the next read: `close()` it)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, BLOCK_HEADER.size + entry.comp_len, entry.offset)
        header, payload = data[: BLOCK_HEADER.size], data[BLOCK_HEADER.size :]
        parsed = _parse(header, entry.offset, self.size)
        if parsed is None or parsed[0] != entry or len(payload) != entry.comp_len:
            self.damage.blocks += 1
            return None
        _, raw_len, crc = parsed
        if crc != checksum(payload):
            self.damage.blocks += 1
            return None
        try:
            return self._decompressor.decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError:
            self.damage.blocks += 1
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _parse(header: bytes, offset: int, size: int) -> tuple[Entry, int, int] | None:
    """The block a header describes, its raw length and its payload's checksum, if the header checks and
    the payload fits in the file."""
    if len(header) < BLOCK_HEADER.size:
        return None
    magic, kind, codec, _, t_first, t_last, ops, raw_len, comp_len, payload_crc, crc = BLOCK_HEADER.unpack(header)
    if magic != BLOCK_MAGIC or crc != checksum(header[:-4]) or codec != CODEC_ZSTD:
        return None
    if kind not in BlockKind._value2member_map_ or max(raw_len, comp_len) > MAX_BLOCK_BYTES:
        return None
    if offset + BLOCK_HEADER.size + comp_len > size:
        return None
    return Entry(BlockKind(kind), t_first, t_last, offset, comp_len, ops), raw_len, payload_crc


def _find_header(file: BinaryIO, start: int, size: int) -> int | None:
    """The offset of the next block header that checks, from `start` on (None: none)."""
    step = 1 << 20
    position = start
    while position < size:
        file.seek(position)
        window = file.read(step + BLOCK_HEADER.size)
        at = window.find(BLOCK_MAGIC)
        while at >= 0:
            if _parse(window[at : at + BLOCK_HEADER.size], position + at, size) is not None:
                return position + at
            at = window.find(BLOCK_MAGIC, at + 1)
        position += step
    return None
