"""Open a recording (a folder of segments, or one segment file): its blocks in time order, its span, its
damage. A segment whose header is damaged is skipped and counted; one of another schema version is a
clear error (`UnknownSchema`): it was written by another kvtop, and reading it as damage would hide that."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from kvtop.record.format import (
    FILE_HEADER,
    SEGMENT_SUFFIX,
    BlockKind,
    NotARecording,
    NothingRecorded,
    RecordingError,
)
from kvtop.record.segment import Entry, SegmentReader

OPEN_SEGMENTS = 4
"""Segments a reader keeps open between reads (a seek reads one or two; a 24 h ring has thousands)."""


@dataclass
class Damage:
    """What of a recording could not be read (the rest replays)."""

    segments_skipped: list[str] = field(default_factory=list)
    """Segments whose header is damaged (name: why), skipped whole."""
    blocks: int = 0
    """Blocks that failed their checksums (skipped), the torn last one of a segment included."""
    bytes: int = 0
    """Bytes no readable block covers."""
    indexes_rebuilt: int = 0
    segments_missing: int = 0
    """Segments missing between two of a run's (`missing_segments`): deleted by hand, never copied."""
    segments_gone: set[str] = field(default_factory=set)
    """Segments that could not be read once the recording was open: deleted since (a recorder's ring, as it
    records into the folder), or no longer readable."""

    def __bool__(self) -> bool:
        return bool(self.segments_skipped or self.blocks or self.bytes or self.segments_missing or self.segments_gone)

    def summary(self) -> str:
        """One line for stderr ("" when nothing was lost)."""
        parts = [f"{len(self.segments_skipped)} segments skipped"] if self.segments_skipped else []
        parts += [f"{self.segments_missing} segments missing between others"] if self.segments_missing else []
        parts += [f"{self.blocks} damaged blocks"] if self.blocks else []
        parts += [f"{self.bytes} bytes unreadable"] if self.bytes else []
        gone = len(self.segments_gone)
        parts += [f"{gone} segments gone since it was opened (a recorder's ring?)"] if gone else []
        return "recording damaged: " + ", ".join(parts) + " (the rest replays)" if parts else ""


@dataclass(frozen=True, slots=True)
class Block:
    """A block of one segment of the recording."""

    segment: SegmentReader
    entry: Entry

    @property
    def kind(self) -> BlockKind:
        return self.entry.kind

    @property
    def opens_segment(self) -> bool:
        """The segment's first block: a keyframe there starts a model afresh (a new run into the folder)."""
        return self.entry.offset == FILE_HEADER.size


def missing_segments(names: list[str]) -> int:
    """How many segments are missing between two of `names` (sorted): each run of the recorder numbers its
    segments 1, 2, 3... (`seg-<first µs>-<seq>.kvr`) and a ring deletes the oldest first, so only the first
    segment of all may be numbered past the one before it plus one; a run that starts again numbers from 1."""
    numbers = [int(seq) if (seq := name.removesuffix(SEGMENT_SUFFIX).rpartition("-")[2]).isdigit() else None
               for name in names]  # fmt: skip
    missing = 0
    for before, after in itertools.pairwise(numbers):
        if before is not None and after is not None and after > 1:
            missing += after - before - 1 if after > before else after - 1
    return missing


class Recording:
    """The blocks of every readable segment at `path`, oldest first (read the payloads with `read`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.damage = Damage()
        if self.path.is_dir():
            files = sorted(p for p in self.path.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        elif self.path.is_file():
            files = [self.path]
        elif self.path.exists():
            raise RecordingError(f"{self.path}: neither a folder nor a regular file (a .kvr file)")
        else:
            raise RecordingError(f"{self.path}: no such recording (a folder of segments or a .kvr file)")
        if not files:
            raise NothingRecorded(f"{self.path}: nothing recorded in it (no *{SEGMENT_SUFFIX} segment)")
        self.damage.segments_missing = missing_segments([file.name for file in files])
        self.segments: list[SegmentReader] = []
        for file in files:
            try:
                self.segments.append(SegmentReader(file))
            except NotARecording as error:
                self.damage.segments_skipped.append(str(error))
            except OSError as error:
                self.damage.segments_skipped.append(f"{file.name}: {error.strerror}")
        if not self.segments:
            why = f" ({self.damage.segments_skipped[0]})" if self.damage.segments_skipped else ""
            raise RecordingError(f"{self.path}: no readable segment{why}")
        self.blocks = [Block(segment, entry) for segment in self.segments for entry in segment.entries]
        self._open: dict[int, SegmentReader] = {}
        """Segments with an open file, least recently read first."""
        for segment in self.segments:
            self.damage.blocks += segment.damage.blocks
            self.damage.bytes += segment.damage.bytes
            self.damage.indexes_rebuilt += segment.damage.index_rebuilt

    @property
    def start(self) -> float:
        """The first instant the recording holds (of its ops and keyframes)."""
        return min(
            (b.entry.t_first for b in self.blocks if b.kind is not BlockKind.MARKS), default=self.segments[0].created
        )

    @property
    def end(self) -> float:
        return max(
            (b.entry.t_last for b in self.blocks if b.kind is not BlockKind.MARKS), default=self.segments[-1].created
        )

    def read(self, block: Block) -> bytes | None:
        """The block's payload, or None (counted in `damage`) when it fails its checksums or its segment is
        gone (a view on a folder a recorder still writes: its ring deletes the oldest segments; a seek there
        raised FileNotFoundError). The last few segments read stay open (`OPEN_SEGMENTS`)."""
        segment = block.segment
        self._open.pop(id(segment), None)
        self._open[id(segment)] = segment
        if len(self._open) > OPEN_SEGMENTS:
            self._open.pop(next(iter(self._open))).close()
        before = segment.damage.blocks
        try:
            raw = segment.read(block.entry)
        except OSError as error:
            self._open.pop(id(segment), None)
            self.damage.segments_gone.add(f"{segment.path.name}: {error.strerror or error}")
            return None
        self.damage.blocks += segment.damage.blocks - before
        return raw

    def close(self) -> None:
        """Close the segments left open by `read` (reading again reopens them)."""
        while self._open:
            self._open.popitem()[1].close()

    def bytes_on_disk(self) -> int:
        return sum(s.size for s in self.segments)
