"""Reading one log file in blocks: only lines holding a marker come out; follow, rotation and `.gz` handled.

A block is cut at its last newline (the rest waits for the next read, as
`tail -f` does); all markers are found in one Aho-Corasick pass over the block
(a piece of whole lines at a time, its newlines counted while it is in cache), so
lines without one are never split, decoded or parsed. Batch lines (queue
depth gauges) are looked for only in the last `SAMPLED_BYTES` of a block: a
large file gives one sample of them per block, a followed file all of them. A traceback comes
out as one item (a line that starts one, or a record that logs one: `Scheduler hit an exception:
Traceback ...`): its first line and the unprefixed lines that continue it. One that reaches the
end of what was read waits for more, until the file gained nothing for `QUIET_S` (by the
clock): then it is complete (a server's last words before it died need no later line).
A crash with no time of its own (a thread's death, a fatal signal) comes out after the dated
line before it (its time and rank), and `last_dated` is the last dated line read (how far the
file's time goes), whatever was marked.

Following: after reading to the end, `read()` looks at the path again. A new
file there (rotated by rename) is opened from its start once the old one is
drained; a file shorter than what was read (copied and truncated), or whose
last bytes before the read position changed (copied, truncated and written
past that position again before the next look), is read again from its start.
A line that is not valid UTF-8 is counted and skipped.

A `.gz` is decompressed piece by piece: when it turns out damaged (cut short,
corrupt, or not gzip at all), what came before the damage is used, the file
ends there, and `ReadStats.damaged` says what was wrong.

A last line without its newline, where the file ends (read once, or damaged) or
moves away, is never read as whole: its end may be missing (a log copied while its
server wrote it, `bootstrap_addr: 1` of `10.0.0.5:8998`). It is not read, and
counted (`ReadStats.cut`); while following, it waits for its newline.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import ahocorasick_rs
import numpy as np

from kvtop.sources.sglang.lines import MARKERS, SAMPLED_MARKERS

BLOCK_BYTES = 4 << 20
SAMPLED_BYTES = 256 << 10
"""`SAMPLED_MARKERS` are looked for in the last this many bytes of each block (all of a small one)."""
SCAN_BYTES = 256 << 10
"""A block is scanned for markers and its newlines counted a piece of about this many bytes at a time."""
MAX_LINE_BYTES = 1 << 20
"""A "line" longer than this without a newline is garbage (binary, a lost newline): cut and counted."""
TRACEBACK = b"Traceback (most recent call last)"
THREAD_DEATH = b"Exception in thread "
"""Python's report of a thread's death: its traceback follows on the next lines."""
_POD = b"[pod/"
_WRAPPER = (
    rb"(?:\d{4}-\d\d-\d\dT\S+ (?:stdout|stderr) [FP] |[A-Z][a-z]{2} \d{1,2}, \d{4} @ \S+[ \t]*"
    rb"|(?:\d{4}-\d\d-\d\dT\S+|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ [\w.@/-]+(?:\[\d+\])?: "
    rb"|(?:[A-Z]+ +)?\d{4}-\d\d-\d\dT\S+ +(?:\[severity: \w+\] +)?"
    rb"|[A-Za-z0-9][\w.-]* +\| |\[pod/[^\]\s]+\] )"
)
"""A log shipper's wrapper (`prefix._WRAPPERS`, `prefix._STREAMS`)."""
_WRAPPED_RECORD = re.compile(_WRAPPER + rb"\[\d{4}-\d\d-\d\d ")
"""A record's first line inside a log shipper's wrapper: where a wrapped traceback ends."""
_COLOURED = rb"(?:\x1b\[[0-9;]*[A-Za-z])*"
"""A terminal's colour codes before a line (a log captured from a TTY)."""
_DATED_RECORD = re.compile(_COLOURED + rb"(?:\[\d{4}-\d\d-\d\d |" + _WRAPPED_RECORD.pattern + rb")")
"""A line that SGLang's prefix dates, wrapped or not."""
_DATE_START = b"[20"
"""Where a dated line's prefix starts (found by `rfind` at C speed before a line is matched)."""
_UNDATED_CRASH = re.compile(
    _COLOURED
    + _WRAPPER
    + rb"?(?:\[[^\]\s]*\] )?(?:Exception in thread |Fatal Python error: |Caught signal |!+ Segfault encountered"
    rb"|terminate called after throwing )"
)
"""A rank's crash that names neither time nor rank (a thread's death, a fatal signal: `lines.py`), UCX's
`[host:pid:tid:thread]` before it or not."""
_CRASH_WORDS = (b"Exception in thread ", b"Fatal Python error: ", b"Caught signal ", b"Segfault encountered",
                b"terminate called after throwing ")  # fmt: skip
"""What every match of `_UNDATED_CRASH` holds, on its line (no part of it matches a newline): looked for first, as
the regex (~2 us) would run on every marked line."""
_STREAM_PREFIX = re.compile(
    rb"(?P<who>[A-Za-z0-9][\w.-]* +\| |\[pod/[^\]\s]+\] )"
    rb"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?P<tag>\[(?:/[^\]\s]*|[^\]\s]+@<\d+,\d+>)\]: )"
)
"""A wrapper on every line of a server's output (`prefix._STREAMS`, a launcher's `[time] [/bin/sh@<0,0>]: ` or
`[time] [/bin/sh]: `: `prefix._LAUNCHED`): its traceback's lines are its own, told apart by the server it names
(the launcher's tag, whatever its time)."""
TRACEBACK_LINES = 64
QUIET_S = 1.0
"""A followed file that gained nothing for this long is complete for now: a traceback at its end comes out."""
_NEWLINE = ord("\n")
TAIL_BYTES = 64
HEAD_BYTES = 256
"""The file's first bytes, compared before each read too: after a `copytruncate` and new lines the bytes before the
read position can match the old ones (SGLang's lines of one kind end alike); the head is the new lines'."""
"""The last bytes read, compared with the file's before each read: a file rewritten in place differs."""
_MARKER_SCANNER = ahocorasick_rs.BytesAhoCorasick(list(MARKERS), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST)
"""Every marker in one pass over a block (a `bytes.find` pass per marker cost six times more). Leftmost-first: the
crate's SIMD searcher serves only the leftmost kinds; with the standard kind the 20 markers took 11 x as long (a
50 MiB log: 90 against 8 ms, more than plain line iteration's 57). The lines marked are the same: a match never
spans a newline, and `_marked_lines` reads only the first of each line."""
_SPECIAL = frozenset(
    index
    for index, marker in enumerate(MARKERS)
    if any(marker in word or word in marker for word in (TRACEBACK, THREAD_DEATH, *_CRASH_WORDS))
)
"""The markers (their indexes in `MARKERS`) of a traceback, a thread's death or a crash: only a line where the scan
found one is searched for them. No marker's end overlaps the start of one of their words (`test_sglang_reader`),
so a leftmost-first match never hides one."""


@dataclass
class ReadStats:
    """What one file gave so far."""

    bytes: int = 0
    lines: int = 0
    matched: int = 0
    """Lines holding a marker (handed on to be parsed)."""
    garbled: int = 0
    """Lines skipped: longer than `MAX_LINE_BYTES` (a byte that is not UTF-8 costs its character, not the line)."""
    rotations: int = 0
    damaged: str = ""
    """What was wrong with a `.gz` that could not be read to its end ("" while it could)."""
    cut: int = 0
    """Last lines without their newline where the file ended, was damaged or moved away (a log copied while its
    server wrote it): not read, as their end may be missing (`bootstrap_addr: 1` of `10.0.0.5:8998`)."""


GZIP_DAMAGE = (EOFError, OSError, zlib.error)
"""What a damaged `.gz` raises: cut short (EOFError), not gzip or a bad CRC (BadGzipFile), corrupt (zlib)."""


def damage(error: BaseException) -> str:
    """What a gzip error says about the file, in a few words."""
    if isinstance(error, EOFError):
        return f"cut short ({error})"
    if isinstance(error, zlib.error):
        return f"corrupt ({error})"
    return f"not gzip or corrupt ({error})"


class LogEncodingError(OSError):
    """A log that is not text kvtop can read (UTF-16): refused with a clear line, never read as no failures."""


def check_encoding(head: bytes, path: Path) -> None:
    """Raise `LogEncodingError` for a file whose first bytes are UTF-16 (a byte order mark, or ASCII with every
    other byte NUL): its markers would match nothing, and the views would say "0 failures"."""
    order = {b"\xff\xfe": "UTF-16 LE", b"\xfe\xff": "UTF-16 BE"}.get(head[:2], "")
    even, odd = head[0:64:2], head[1:64:2]
    if not order and len(head) >= 8 and head[:64].count(0) < len(head[:64]):  # all NUL: a hole (copytruncate), no text
        order = "UTF-16 LE" if odd.count(0) == len(odd) else "UTF-16 BE" if even.count(0) == len(even) else ""
    if order:
        raise LogEncodingError(
            f"{path} is {order}, not UTF-8 text: convert it first (iconv -f UTF-16 -t UTF-8 {path} > log.txt)"
        )


_GZIP_MAGIC = b"\x1f\x8b"


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading; FileNotFoundError when it is no regular file, found in the same open (a FIFO
    that replaced a followed log between a look and an open blocked the open for ever: a sidecar deaf to SIGTERM)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{path} is no regular file")
    return os.fdopen(fd, "rb")


def is_gzip(path: Path) -> bool:
    """Whether the file is gzip: by its name (`.gz`), else by its first two bytes (a `.log` that was gzipped)."""
    if path.name.endswith(".gz"):
        return True
    try:
        with open_regular(path) as raw:
            return raw.read(2) == _GZIP_MAGIC
    except OSError:  # not there yet (a followed log): its name tells
        return False


def read_head(path: Path, limit: int) -> bytes:
    """Up to `limit` bytes of the file's text (decompressed for `.gz`): what could be read, damage or not.
    FileNotFoundError when the path is no regular file (a fifo would block the open for ever, a folder fail it)."""
    gz = is_gzip(path)
    with open_regular(path) as raw:
        if not gz:
            return raw.read(limit)
        pieces: list[bytes] = []
        size = 0
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            try:
                while size < limit and (piece := unzipped.read1(limit - size)):
                    pieces.append(piece)
                    size += len(piece)
            except GZIP_DAMAGE:
                pass  # the reader counts the damage; the head is what came before it
        return b"".join(pieces)


class LogReader:
    """`read()` returns the marked lines added since the last call (all of them on the first)."""

    def __init__(self, path: Path, block_bytes: int = BLOCK_BYTES, quiet_s: float = QUIET_S) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self.quiet_s = quiet_s
        self.quiet = False
        """The last `read()` found the file had gained nothing for `quiet_s`: what it held at the end came out."""
        self._grew_at = time.monotonic()
        self.stats = ReadStats()
        self._file: BinaryIO | None = None
        self._raw: BinaryIO | None = None
        """The compressed file under a `.gz`'s GzipFile (which does not close it)."""
        self._identity: tuple[int, int] = (0, 0)
        self._offset = 0
        self._tail = self._head = b""
        self._carry = b""
        self._in_long_line = False
        """Skipping the rest of a line past `MAX_LINE_BYTES` (counted once, as one garbled line)."""
        self.last_dated = ""
        """The last line read that SGLang's prefix dates ("" before one)."""
        self._dated_handed = False
        """`last_dated` came out already (a marked line, or handed on to date a crash after it)."""
        self._buffer = bytearray(block_bytes + MAX_LINE_BYTES)
        """Blocks are read into this one buffer (a fresh 4 MiB object per block costs page faults)."""
        self._view = memoryview(self._buffer)
        self._newlines = np.empty(len(self._buffer), dtype=np.bool_)
        self.gz = is_gzip(path)

    @property
    def last_dated_handed(self) -> bool:
        """`last_dated` came out of `read()` already (as a marked line, or to date a crash after it)."""
        return self._dated_handed

    @property
    def position(self) -> int:
        """Bytes read of the file now open (decompressed bytes for a `.gz`)."""
        return self._offset

    def open(self) -> None:
        """Open the file now (raises OSError if it cannot be read)."""
        if self._file is None:
            self._file = self._open()

    def _open(self) -> BinaryIO:
        """The file, positioned at its start; raises `LogEncodingError` for a UTF-16 file, FileNotFoundError while
        the path is no regular file (`read_head`: a followed log replaced by one is waited for as one not there
        yet)."""
        check_encoding(read_head(self.path, 64), self.path)
        raw = open_regular(self.path)  # kept open while following
        status = os.fstat(raw.fileno())
        self._identity = (status.st_dev, status.st_ino)
        self._offset = 0
        self._tail = self._head = b""
        self._in_long_line = False
        if self.gz:
            self._raw = raw
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        return raw

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def read(self, final: bool = False, max_bytes: int = 64 << 20) -> list[str]:
        """Marked lines from what was added since the last call, up to about `max_bytes` of file.

        `final`: the file is complete, so a last line without a newline counts too.
        """
        self.quiet = False
        if self._file is None:
            try:
                self._file = self._open()
            except FileNotFoundError:
                return []  # following a file that is not there yet
        out: list[str] = []
        if not self.gz and self._rewritten():
            self._scan_rest(out)
            self._file.seek(0)
            self._offset, self._tail, self._head, self._in_long_line = 0, b"", b"", False
            self.stats.rotations += 1
        budget = max_bytes
        while budget > 0:
            size = self._fill()
            if not size:
                break
            budget -= size
            self._scan(self._buffer, len(self._carry) + size, out)
        else:
            return out
        if not self.gz and self._rotated():
            self._scan_rest(out)
            self.close()
            self.stats.rotations += 1
            try:
                self._file = self._open()
            except FileNotFoundError:  # gone, or no regular file: waited for
                self._file = None
            if self._file is not None:
                out += self.read(final, budget)
            return out
        if final or self.stats.damaged:  # a damaged file ends where the damage starts
            self._scan_rest(out)
        elif time.monotonic() - self._grew_at >= self.quiet_s:
            self.quiet = True
            self._close_held(out)
        return out

    def at_end(self) -> bool:
        """Nothing left unread in the file as it is now."""
        if self._file is None or self.stats.damaged:
            return True
        if self.gz:
            try:
                return not bool(self._file.peek(1))  # type: ignore[attr-defined]
            except GZIP_DAMAGE as error:
                self.stats.damaged = damage(error)
                return True
        return os.fstat(self._file.fileno()).st_size <= self._offset

    def _rewritten(self) -> bool:
        """The bytes before the read position, or the file's first ones, are no longer those read: copied and
        truncated, then written."""
        tail, head = self._tail, self._head
        if not tail or self._file is None:
            return False
        try:
            fd = self._file.fileno()
            return os.pread(fd, len(tail), self._offset - len(tail)) != tail or os.pread(fd, len(head), 0) != head
        except OSError:
            return False

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

    def _count_lines(self, block: bytes | bytearray, start: int, end: int) -> int:
        """Newlines in `block[start:end]` (numpy's SIMD compare into a reused mask: five times `bytes.count`)."""
        size = end - start
        mask = self._newlines[:size]
        return int(np.count_nonzero(np.equal(np.frombuffer(block, np.uint8, size, start), _NEWLINE, out=mask)))

    def _marked_lines(self, block: bytes | bytearray, end: int) -> tuple[list[int], set[int], int]:
        """Start offsets of the lines in `block[:end]` that hold a marker, in order, those of them that hold one of
        `_SPECIAL` (the scan tells which marker it found: no line is searched again for them), and the newlines.

        A piece of `SCAN_BYTES` (whole lines: no marker spans a newline) is scanned for markers and its newlines
        counted while it is in the CPU's cache: over whole 4 MiB blocks the two passes took 30-40 % longer."""
        starts: set[int] = set()
        special: set[int] = set()
        find, rfind = block.find, block.rfind
        line_end = line_start = -1
        newlines = piece = 0
        view = memoryview(block)
        while piece < end:
            piece_end = find(b"\n", min(piece + SCAN_BYTES, end) - 1, end) + 1  # `end` follows a newline
            for marker, pos, _ in _MARKER_SCANNER.find_matches_as_indexes(view[piece:piece_end]):
                pos += piece
                if pos > line_end:  # the first marker of its line
                    line_start = rfind(b"\n", 0, pos) + 1
                    starts.add(line_start)
                    line_end = find(b"\n", pos, end)
                if marker in _SPECIAL:
                    special.add(line_start)
            newlines += self._count_lines(block, piece, piece_end)
            piece = piece_end
        sampled_from = max(0, end - SAMPLED_BYTES)
        for sampled in SAMPLED_MARKERS:
            pos = find(sampled, sampled_from, end)
            while pos >= 0:
                starts.add(rfind(b"\n", 0, pos) + 1)
                pos = find(sampled, find(b"\n", pos, end) + 1, end)
        return sorted(starts), special, newlines

    def _fill(self) -> int:
        """Read the next block into the buffer, after the carried partial line; how many bytes came (0: none)."""
        assert self._file is not None
        kept = len(self._carry)
        self._buffer[:kept] = self._carry
        view = self._view[kept : kept + self.block_bytes]
        size = self._fill_gz(view) if self.gz else self._file.readinto(view)  # type: ignore[attr-defined]
        self._offset += size
        self.stats.bytes += size
        if size:
            self._grew_at = time.monotonic()
        if size and not self.gz:
            end = kept + size
            self._tail = bytes(self._buffer[max(0, end - TAIL_BYTES) : end])
            if self._offset == size:  # the file's start
                self._head = bytes(self._buffer[: min(size, HEAD_BYTES)])
        return int(size)

    def _fill_gz(self, view: memoryview) -> int:
        """Decompress into `view` a piece at a time, so that damage loses only what follows it."""
        assert self._file is not None
        if self.stats.damaged:
            return 0
        size = 0
        try:
            while size < len(view):
                piece = self._file.read1(len(view) - size)  # type: ignore[attr-defined]
                if not piece:
                    break
                view[size : size + len(piece)] = piece
                size += len(piece)
        except GZIP_DAMAGE as error:
            self.stats.damaged = damage(error)
        return size

    def _scan_rest(self, out: list[str]) -> None:
        """What was held at the end (the file ended or moved away): a traceback's whole lines are read; a last line
        without its newline is cut, never read as whole (its end may be missing): counted in `stats.cut`."""
        if self._carry:
            rest, self._carry = self._carry, b""
            if not rest.endswith(b"\n"):
                self.stats.cut += 1
            self._scan(rest, len(rest), out, carry=False)  # whole lines only: what follows the last newline is left

    def _close_held(self, out: list[str]) -> None:
        """The file was quiet: a traceback held at the end of what was read is complete (a partial line still
        waits for its newline)."""
        if b"\n" in self._carry:  # only a traceback holds whole lines
            held, self._carry = self._carry, b""
            self._scan(held, len(held), out, hold_traceback=False)

    def _scan(
        self, block: bytes | bytearray, size: int, out: list[str], carry: bool = True, hold_traceback: bool = True
    ) -> None:
        """Hand on the marked lines of `block[:size]`.

        With `carry`, the last partial line waits for the next block, and with `hold_traceback` a traceback
        that reaches the end too.
        """
        if self._in_long_line:  # the rest of a line too long to read, up to its newline
            first = block.find(b"\n", 0, size)
            if first < 0:
                self._in_long_line = carry
                return
            self._in_long_line = False
            rest = bytes(block[first + 1 : size])
            self._scan(rest, len(rest), out, carry, hold_traceback)
            return
        end = block.rfind(b"\n", 0, size) + 1
        if carry:
            self._carry = b""
            if end == 0 and size < MAX_LINE_BYTES:
                self._carry = bytes(block[:size])
                return
            if end == 0:
                self.stats.garbled += 1
                self.stats.lines += 1
                self._in_long_line = True
                return
            if size - end >= MAX_LINE_BYTES:
                self.stats.garbled += 1
                self.stats.lines += 1
                self._in_long_line = True
            else:
                self._carry = bytes(block[end:size])
        cut = end
        covered = -1
        in_streams: set[int] = set()
        came_out: set[int] = set()
        """Where the lines handed on from this block start."""
        starts, special, newlines = self._marked_lines(block, end)
        for start in starts:
            if start <= covered or start in in_streams:
                continue  # inside a traceback already handed on
            stop = block.find(b"\n", start, end)
            raw: bytes | bytearray | None = None
            odd = start in special  # only such a line can start a traceback or be a crash
            if odd and (block.find(TRACEBACK, start, stop) >= 0 or block.find(THREAD_DEATH, start, stop) >= 0):
                # a traceback's own line, a record that logs one (a crash), or a thread's death before one
                stream = _STREAM_PREFIX.match(block, start, stop)
                if stream is None:
                    last = stop = covered = _traceback_end(block, stop, end)
                else:  # its lines may interleave with other servers': gather its own
                    last, lines = _stream_traceback(block, stop, end, _stream_name(stream))
                    in_streams.update(line_start for line_start, _ in lines)
                    raw = b"\n".join([block[start:stop], *(block[a:b] for a, b in lines)])
                if carry and hold_traceback and last + 1 >= end and size - start < MAX_LINE_BYTES:
                    cut = start  # it may go on in the next block: read it whole from there
                    self._carry = bytes(block[start:size])
                    break
            if raw is None:
                raw = block[start:stop]
            text = raw.decode("utf-8", "replace")  # a byte of another encoding costs its character, not the line
            if odd and _holds_crash(block, start, stop) and _UNDATED_CRASH.match(block, start):
                self._hand_on_dated(block, start, came_out, out)  # the dated line before it tells its time and rank
            out.append(text)
            came_out.add(start)
            self.stats.matched += 1
        last = _dated_before(block, cut, 0)
        if last >= 0:
            self.last_dated, self._dated_handed = _text(block, last), last in came_out
        self.stats.lines += newlines - (self._count_lines(block, cut, end) if cut < end else 0)

    def _hand_on_dated(self, block: bytes | bytearray, before: int, came_out: set[int], out: list[str]) -> None:
        """Hand on the nearest dated line before offset `before` (a line start) unless it came out already: in
        `block` (`came_out`: the lines of it handed on), else `last_dated`, the blocks before's."""
        start = _dated_before(block, before, 0)
        if start >= 0:
            if start not in came_out:
                out.append(_text(block, start))
                came_out.add(start)
        elif self.last_dated and not self._dated_handed:
            out.append(self.last_dated)
            self._dated_handed = True


def _holds_crash(block: bytes | bytearray, start: int, stop: int) -> bool:
    """Whether `block[start:stop]` holds one of `_CRASH_WORDS`."""
    for word in _CRASH_WORDS:  # noqa: SIM110  # any() over a generator costs twice the loop
        if block.find(word, start, stop) >= 0:
            return True
    return False


def _dated_before(block: bytes | bytearray, before: int, floor: int) -> int:
    """Start of the last line in `block[floor:before]` (`before` a line start) that SGLang's prefix dates; -1: none."""
    position = before
    while (position := block.rfind(_DATE_START, floor, position)) >= 0:
        line_start = block.rfind(b"\n", 0, position) + 1
        if line_start < floor:
            return -1
        if _DATED_RECORD.match(block, line_start):
            return line_start
        position = line_start
    return -1


def _text(block: bytes | bytearray, start: int) -> str:
    """The line at `start`, as text (bytes that are not UTF-8 replaced: it only tells a time)."""
    return bytes(block[start : block.find(b"\n", start)]).decode("utf-8", "replace")


def _stream_name(stream: re.Match[bytes]) -> bytes:
    """Which server a `_STREAM_PREFIX` wrapper names (its name, or the launcher's tag)."""
    return stream["who"] or stream["tag"]


def _stream_traceback(block: bytes | bytearray, stop: int, end: int, name: bytes) -> tuple[int, list[tuple[int, int]]]:
    """A traceback inside a wrapper that names its server (`name`: `_stream_name`), whose lines may interleave
    with other servers': (where the scan stopped, the (start, stop) of each of its continuation lines), up to a
    line of its server that is blank or begins a record."""
    lines: list[tuple[int, int]] = []
    for _ in range(4 * TRACEBACK_LINES):
        if stop + 1 >= end or len(lines) >= TRACEBACK_LINES:
            break
        nxt = block.find(b"\n", stop + 1, end)
        if nxt < 0:
            break
        stream = _STREAM_PREFIX.match(block, stop + 1, nxt)
        if stream is not None and _stream_name(stream) == name:
            rest = stream.end()
            if rest >= nxt or block[rest : rest + 1] == b"[" or _WRAPPED_RECORD.match(block, rest, nxt):
                break  # blank, or its server's next record (in a second wrapper: `docker compose logs -t`)
            lines.append((stop + 1, nxt))
        stop = nxt
    return stop, lines


def _traceback_end(block: bytes | bytearray, stop: int, end: int) -> int:
    """Where a traceback that starts at the line ending at `stop` ends: its unprefixed continuation lines (up to
    a blank line or the next record, wrapped by a log shipper or not)."""
    for _ in range(TRACEBACK_LINES):
        if stop + 1 >= end:
            break
        following = block[stop + 1 : stop + 2]
        if following == b"\n" or _WRAPPED_RECORD.match(block, stop + 1, end):
            break
        if following == b"[" and not block.startswith(_POD, stop + 1):  # a kubectl wrapper may go on with it
            break
        nxt = block.find(b"\n", stop + 1, end)
        if nxt < 0:
            break
        stop = nxt
    return stop
