"""Reading one log file in blocks: only lines holding a marker come out; follow, rotation and `.gz` handled.

A block is cut at its last newline (the rest waits for the next read, as
`tail -f` does); each marker is found with `bytes.find` over the whole block,
so lines without one are never split, decoded or parsed. Batch lines (queue
depth gauges) are looked for only in the last `SAMPLED_BYTES` of a block: a
large file gives one sample of them per block, a followed file all of them. A traceback comes
out as one item: its first line and the unprefixed lines that continue it.

Following: after reading to the end, `read()` looks at the path again. A new
file there (rotated by rename) is opened from its start once the old one is
drained; a file shorter than what was read (copied and truncated) is read
again from its start. A line that is not valid UTF-8 is counted and skipped.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvtop.sources.sglang.lines import MARKERS, SAMPLED_MARKERS

BLOCK_BYTES = 4 << 20
SAMPLED_BYTES = 256 << 10
"""`SAMPLED_MARKERS` are looked for in the last this many bytes of each block (all of a small one)."""
MAX_LINE_BYTES = 1 << 20
"""A "line" longer than this without a newline is garbage (binary, a lost newline): cut and counted."""
TRACEBACK = b"Traceback (most recent call last)"
TRACEBACK_LINES = 64


@dataclass
class ReadStats:
    """What one file gave so far."""

    bytes: int = 0
    lines: int = 0
    matched: int = 0
    """Lines holding a marker (handed on to be parsed)."""
    garbled: int = 0
    """Lines skipped: not UTF-8, or longer than `MAX_LINE_BYTES`."""
    rotations: int = 0


class LogReader:
    """`read()` returns the marked lines added since the last call (all of them on the first)."""

    def __init__(self, path: Path, block_bytes: int = BLOCK_BYTES) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self.stats = ReadStats()
        self._file: BinaryIO | None = None
        self._identity: tuple[int, int] = (0, 0)
        self._offset = 0
        self._carry = b""
        self.gz = path.name.endswith(".gz")

    def open(self) -> None:
        """Open the file now (raises OSError if it cannot be read)."""
        if self._file is None:
            self._file = self._open()

    def _open(self) -> BinaryIO:
        raw = open(self.path, "rb")  # noqa: SIM115 (kept open while following)
        status = os.fstat(raw.fileno())
        self._identity = (status.st_dev, status.st_ino)
        self._offset = 0
        if self.gz:
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        return raw

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self, final: bool = False, max_bytes: int = 64 << 20) -> list[str]:
        """Marked lines from what was added since the last call, up to about `max_bytes` of file.

        `final`: the file is complete, so a last line without a newline counts too.
        """
        if self._file is None:
            try:
                self._file = self._open()
            except FileNotFoundError:
                return []  # following a file that is not there yet
        out: list[str] = []
        budget = max_bytes
        while budget > 0:
            block = self._file.read(self.block_bytes)
            if not block:
                break
            budget -= len(block)
            self._offset += len(block)
            self.stats.bytes += len(block)
            self._scan(block, out)
        else:
            return out
        if not self.gz and self._rotated():
            self._scan_rest(out)
            self.close()
            self.stats.rotations += 1
            self._file = self._open() if self.path.exists() else None
            if self._file is not None:
                out += self.read(final, budget)
            return out
        if final:
            self._scan_rest(out)
        return out

    def at_end(self) -> bool:
        """Nothing left unread in the file as it is now."""
        if self._file is None:
            return True
        if self.gz:
            return not bool(self._file.peek(1))  # type: ignore[attr-defined]
        return os.fstat(self._file.fileno()).st_size <= self._offset

    def _rotated(self) -> bool:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return False  # moved away, not yet replaced: keep the old one
        if (status.st_dev, status.st_ino) != self._identity:
            return True
        if status.st_size < self._offset:  # copied and truncated in place
            self._identity = (0, 0)
            return True
        return False

    def _scan_rest(self, out: list[str]) -> None:
        """The last line, without a newline (the file ended or moved away)."""
        if self._carry:
            rest, self._carry = self._carry + b"\n", b""
            self._scan(rest, out, carry=False)

    def _scan(self, block: bytes, out: list[str], carry: bool = True) -> None:
        if self._carry:
            block = self._carry + block
            self._carry = b""
        end = block.rfind(b"\n") + 1
        if carry:
            if end == 0 and len(block) < MAX_LINE_BYTES:
                self._carry = block
                return
            if end == 0:
                self.stats.garbled += 1
                self.stats.lines += 1
                return
            self._carry = block[end:]
            if len(self._carry) >= MAX_LINE_BYTES:
                self.stats.garbled += 1
                self._carry = b""
        self.stats.lines += block.count(b"\n", 0, end)
        covered = -1
        for start in _marked_lines(block, end):
            if start <= covered:
                continue  # inside a traceback already handed on
            stop = block.find(b"\n", start, end)
            if block.startswith(TRACEBACK, start):
                stop = covered = _traceback_end(block, stop, end)
            raw = block[start:stop]
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.stats.garbled += 1
                continue
            self.stats.matched += 1


def _marked_lines(block: bytes, end: int) -> list[int]:
    """Start offsets of the lines in `block[:end]` that hold a marker, in order."""
    starts: set[int] = set()
    find, rfind = block.find, block.rfind
    sampled_from = max(0, end - SAMPLED_BYTES)
    for marker, start in [*((m, 0) for m in MARKERS), *((m, sampled_from) for m in SAMPLED_MARKERS)]:
        pos = find(marker, start, end)
        while pos >= 0:
            starts.add(rfind(b"\n", 0, pos) + 1)
            pos = find(marker, find(b"\n", pos, end) + 1, end)
            if pos == -1:
                break
    return sorted(starts)


def _traceback_end(block: bytes, stop: int, end: int) -> int:
    """Where a traceback that starts at the line ending at `stop` ends: its unprefixed continuation lines."""
    for _ in range(TRACEBACK_LINES):
        if stop + 1 >= end:
            break
        following = block[stop + 1 : stop + 2]
        if following == b"[" or following == b"\n":
            break
        nxt = block.find(b"\n", stop + 1, end)
        if nxt < 0:
            break
        stop = nxt
    return stop
