"""Position a model at any time of a recording (`Replay.at`): restore the latest keyframe before it, replay
the ops after it up to that time. A `Cursor` then steps forward op by op (`advance`); a step back is a
new `at`. The failure origins (`marks`) come from the MARKS blocks alone, without decoding the events."""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.record.format import BlockKind
from kvtop.record.keyframes import restore
from kvtop.record.reader import Recording
from kvtop.record.records import MARKS_DECODER, OPS_DECODER, Delivered, Dropped, Gapped, Mark, Op, apply_op
from transport.plane.events import Event, Snapshot

log = logging.getLogger("kvtop.record")

RUNS_APART_S = 5.0
"""A segment that opens this long after the block before it is another run of the recorder (a run writes a block
every `writer.FLUSH_S` while it hears anything, and rolls segments over without a pause)."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What the model accepted of one replayed delivery (the live collector's `Heard`), at arrival `now`."""

    now: float
    label: str
    events: list[Event]
    snapshot: bool
    """An agent's snapshot (its memory), not a batch of new events."""


@dataclass
class Cursor:
    """A model positioned at `time` of a recording; `advance(t)` moves it forward."""

    replay: Replay
    model: ClusterModel
    time: float
    block: int
    """Index in `recording.blocks` of the next block to read."""
    ops: list[Op] = field(default_factory=list)
    op: int = 0
    """Index in `ops` (the decoded block before `block`) of the next op to apply."""
    inexact: bool = False
    """Something between the keyframe and `time` was lost (a damaged block, ops the recorder dropped): the
    model may differ from the one the collector held until the next keyframe puts it right."""
    failed: int = 0
    """Deliveries the model could not apply (as live: counted by the collector, skipped)."""

    def advance(self, until: float) -> list[Applied | Gapped]:
        """Apply every op up to `until` (arrival times); returns what each delivery's model accepted, and
        each gap found (batches that never arrived), in order: the live collector's news."""
        heard: list[Applied | Gapped] = []
        for op in self._ops_until(until):
            self._apply(op, heard)
        self.time = max(self.time, until)
        return heard

    def deliveries(self, until: float) -> Iterator[Delivered]:
        """The deliveries up to `until`, each applied to the model before it is yielded (`kvtop dump`)."""
        for op in self._ops_until(until):
            self._apply(op, [])
            if type(op) is Delivered:
                yield op
        self.time = max(self.time, until)

    def _ops_until(self, until: float) -> Iterator[Op]:
        """The ops from the cursor's position up to `until`, moving the position past each one."""
        recording = self.replay.recording
        while True:
            while self.op < len(self.ops):
                op = self.ops[self.op]
                if op.now > until:
                    return
                self.op += 1
                yield op
            if self.block >= len(recording.blocks):
                return
            block = recording.blocks[self.block]
            if block.kind is BlockKind.MARKS or (
                block.kind is BlockKind.KEYFRAME and not self.inexact and not block.opens_segment
            ):
                self.block += 1  # nothing to apply: read neither (a segment's first keyframe may be a new run's)
                continue
            if block.entry.t_first > until:
                return
            self.block += 1
            self._enter(block.kind, recording.read(block))

    def _enter(self, kind: BlockKind, raw: bytes | None) -> None:
        self.ops, self.op = [], 0
        if raw is None:
            self.inexact = True
        elif kind is BlockKind.KEYFRAME:  # back in step with the collector's model
            try:
                self.model = restore(raw, self.replay.journal_events)
            except ValueError:  # no model's state (a damaged or a forged block, its checksum right): skipped
                self.replay.recording.damage.blocks += 1
                self.inexact = True
                log.debug("a keyframe could not be restored (skipped)", exc_info=True)
                return
            self.inexact = False
        else:
            try:
                self.ops = OPS_DECODER.decode(raw)
            except msgspec.DecodeError:
                self.replay.recording.damage.blocks += 1
                self.inexact = True

    def _apply(self, op: Op, heard: list[Applied | Gapped]) -> None:
        if type(op) is Dropped:
            self.inexact = True
            return
        if type(op) is Gapped:
            heard.append(op)
            return
        try:
            accepted = apply_op(self.model, op)
        except Exception:
            self.failed += 1
            log.debug("a recorded delivery could not be applied (skipped)", exc_info=True)
            return
        if accepted is not None and type(op) is Delivered:
            heard.append(Applied(op.now, op.label, accepted, type(op.item) is Snapshot))


class Replay:
    """Seeks in one recording: `at(t)` is a model at `t`; `marks()` the failure origins, in arrival order."""

    def __init__(self, recording: Recording | str | Path, journal_events: int = 0) -> None:
        """`journal_events`: the event tail the models keep (the dashboard's `JOURNAL_EVENTS_KEPT`)."""
        self.recording = recording if isinstance(recording, Recording) else Recording(recording)
        self.journal_events = journal_events
        blocks = self.recording.blocks
        self._keyframes = [i for i, b in enumerate(blocks) if b.kind is BlockKind.KEYFRAME]
        self._keyframe_times = [blocks[i].entry.t_first for i in self._keyframes]
        self._marks: list[Mark] | None = None

    @property
    def start(self) -> float:
        return self.recording.start

    @property
    def end(self) -> float:
        return self.recording.end

    def at(self, t: float) -> Cursor:
        """A model at time `t`: the latest readable keyframe at or before it, then the ops up to `t`.

        Before the first keyframe (or when none before `t` can be read), the ops replay from the recording's
        first block onto an empty model (exact only when the recording starts there: `Cursor.inexact` says
        when it cannot be)."""
        blocks = self.recording.blocks
        position = bisect.bisect_right(self._keyframe_times, t)
        while position > 0:
            index = self._keyframes[position - 1]
            raw = self.recording.read(blocks[index])
            if raw is not None:
                try:
                    model = restore(raw, self.journal_events)
                except ValueError:  # no keyframe of this schema, or one that does not hang together
                    self.recording.damage.blocks += 1
                else:
                    cursor = Cursor(self, model, blocks[index].entry.t_first, index + 1)
                    cursor.advance(t)
                    return cursor
            position -= 1
        cursor = Cursor(self, ClusterModel(self.journal_events), self.start, 0, inexact=bool(self._keyframes))
        cursor.advance(t)
        return cursor

    def unrecorded(self, t: float) -> tuple[float, float] | None:
        """The stretch around `t` that no run of the recorder recorded (from one run's last block to the next run's
        first: the recorder was not running), None when `t` lies in what was recorded."""
        blocks = [b for b in self.recording.blocks if b.kind is not BlockKind.MARKS]
        for before, after in itertools.pairwise(blocks):
            stopped, started = before.entry.t_last, after.entry.t_first
            if stopped < t < started and after.opens_segment and started - stopped > RUNS_APART_S:
                return stopped, started
        return None

    def marks(self) -> list[Mark]:
        """Every failure origin of the recording (a rank's own failure), by arrival time."""
        if self._marks is None:
            marks: list[Mark] = []
            for block in self.recording.blocks:
                if block.kind is BlockKind.MARKS:
                    raw = self.recording.read(block)
                    try:
                        marks += MARKS_DECODER.decode(raw) if raw is not None else []
                    except msgspec.DecodeError:
                        self.recording.damage.blocks += 1
            start, end = self.start, self.end  # the ring may have deleted what older marks point at
            self._marks = sorted((m for m in marks if start <= m.arrived <= end), key=lambda mark: mark.arrived)
        return self._marks

    def next_origin(self, t: float) -> Mark | None:
        """The first failure origin that arrived after `t` (None: none)."""
        marks = self.marks()
        index = bisect.bisect_right([m.arrived for m in marks], t)
        return marks[index] if index < len(marks) else None

    def previous_origin(self, t: float) -> Mark | None:
        """The last failure origin that arrived before `t` (None: none)."""
        marks = self.marks()
        index = bisect.bisect_left([m.arrived for m in marks], t)
        return marks[index - 1] if index > 0 else None
