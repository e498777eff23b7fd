"""The recorder's bounds: a capped ring stays within its cap as it writes, a segment holds its size in ops
however big the keyframes grow, and a disk that fills stops the recording with every op written or counted."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.record.format import BLOCK_HEADER, BlockKind
from kvtop.record.lock import LOCK_NAME
from kvtop.record.reader import Recording
from kvtop.record.replay import Replay
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder, RecorderStats
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.failures import to_json
from kvtop.views.tables import status_json
from tests.conftest import wait_for

CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2, spacing_s=0.001, failure_rate=0.1)
CAP = 1 << 20


def _said(model: ClusterModel, now: float) -> str:
    return json.dumps([status_json(model, now, 60.0), to_json(model.groups(), None)])


def _folder_bytes(folder: Path) -> int:
    """The bytes of the folder's segments (their data and index files; not the recorder's lock, which holds its
    pid), newest first: its files only grow and older ones only go, so a measurement taken while the writer deletes
    and appends never counts more than the folder held at once."""
    total = 0
    for path in sorted(folder.iterdir(), reverse=True):
        if path.name == LOCK_NAME:  # `max_bytes` bounds the segments (writer.py); a 5-digit pid put it 5 bytes over
            continue
        with contextlib.suppress(FileNotFoundError):  # retired meanwhile
            total += path.stat().st_size
    return total


def _written_each_pass(recorder: Recorder) -> Callable[[float], None]:
    """An `on_pass` that waits until the writer has written a block since the last pass (so segments fill
    and rotate between passes, as a live collector's would)."""
    blocks = [recorder.stats().blocks]

    def written(_: float) -> None:
        blocks[0] = wait_for(lambda: recorder.stats().blocks > blocks[0] and recorder.stats().blocks, 10.0, "a block")

    return written


@pytest.mark.slow
def test_a_capped_ring_stays_within_its_cap_as_it_writes_and_replays_its_tail(tmp_path: Path) -> None:
    """max_bytes 1 MiB, six times that recorded: segments of an eighth of the cap; the folder never holds more
    than the cap, the oldest segments went, and the tail replays the model the live side held at the end.
    (The ring once counted a new segment's index header nowhere: 32 bytes a segment past the cap.)"""
    folder = tmp_path / "ring"
    recorder = Recorder(folder, max_bytes=CAP, flush_s=0.01, fork_keyframes=False).start()
    model = ClusterModel()
    sizes: list[int] = []
    said: list[tuple[float, str]] = []
    wait = _written_each_pass(recorder)

    def note(now: float) -> None:
        wait(now)
        sizes.append(_folder_bytes(folder))
        said.append((now, _said(model, now)))

    feed(recorder, model, CLUSTER, 200, rooms_per_pass=50, on_pass=note)
    recorder.close()
    stats = recorder.stats()
    assert max(sizes) <= CAP and _folder_bytes(folder) <= CAP
    assert stats.error == "" and stats.deleted_segments > 0
    held = _folder_bytes(folder)
    assert stats.bytes == held  # the count the ring keeps its segments to the cap by is what they hold
    assert recorder.segment_bytes == CAP // 8
    replay = Replay(folder)
    assert not replay.recording.damage
    assert replay.start > said[0][0]
    now, live = said[-1]
    assert _said(replay.at(now).model, now) == live


def test_a_keyframe_bigger_than_a_segment_does_not_close_it_before_it_holds_its_size_in_ops(tmp_path: Path) -> None:
    """Keyframes grow past segment_bytes: each segment still holds segment_bytes of blocks after the keyframe
    it opens with (a segment full of its keyframe alone asked for a keyframe at every pass)."""
    folder = tmp_path / "rec"
    segment_bytes = 64 << 10
    recorder = Recorder(folder, segment_bytes=segment_bytes, flush_s=0.01, fork_keyframes=False).start()
    passes = 120
    feed(recorder, ClusterModel(), CLUSTER, passes, rooms_per_pass=50, on_pass=_written_each_pass(recorder))
    recorder.close()
    recording = Recording(folder)
    keyframes = [block for block in recording.blocks if block.kind is BlockKind.KEYFRAME]
    assert max(block.entry.comp_len for block in keyframes) > segment_bytes, "the test wants big keyframes"
    for segment in recording.segments[:-1]:
        opening = segment.entries[0]
        assert opening.kind is BlockKind.KEYFRAME
        assert segment.size - (opening.offset + BLOCK_HEADER.size + opening.comp_len) >= segment_bytes, (
            segment.path.name
        )
    assert len(keyframes) < passes // 4


class FullDisk:
    """`os.write` to the files of one folder as on a disk with `room` bytes left: a write past it writes what
    fits, the next raises ENOSPC (writes elsewhere go through)."""

    def __init__(self, folder: Path, room: int) -> None:
        self.folder, self.room = str(folder), room
        self._write = os.write

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(self.folder):
            return self._write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._write(fd, memoryview(data)[: self.room])
        self.room -= written
        return written


def _record_onto(folder: Path, monkeypatch: pytest.MonkeyPatch, room: int | None) -> RecorderStats:
    """The same 40 passes recorded into `folder`, on a disk with `room` bytes left (None: room enough)."""
    if room is not None:
        monkeypatch.setattr(os, "write", FullDisk(folder, room).write)
    recorder = Recorder(folder, keyframe_events=3000, segment_bytes=40_000, flush_s=3600.0)
    feed(recorder, ClusterModel(), CLUSTER, 40, rooms_per_pass=20)
    recorder.close()
    monkeypatch.undo()
    return recorder.stats()


def test_a_disk_that_fills_stops_the_recording_with_every_op_written_or_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC mid-block: the recording stops with one reason, the ops written and those dropped add up to
    all the ops handed over, and what was written replays (up to the torn block)."""
    whole = _record_onto(tmp_path / "whole", monkeypatch, None)
    assert whole.segments > 1 and whole.dropped_ops == 0
    cut = _record_onto(tmp_path / "cut", monkeypatch, whole.bytes // 2)
    assert cut.error == f"recording to {tmp_path / 'cut'} stopped: No space left on device"
    assert cut.dropped_ops > 0
    assert cut.ops + cut.dropped_ops == whole.ops
    replay = Replay(tmp_path / "cut")
    assert not replay.recording.damage.segments_skipped and replay.end > replay.start


def test_a_disk_full_from_the_start_leaves_no_segment_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No room for a segment's header: the segment and its index are removed (they read as a damaged
    recording), and every op is counted as dropped."""
    whole = _record_onto(tmp_path / "whole", monkeypatch, None)
    stats = _record_onto(tmp_path / "full", monkeypatch, 0)
    assert stats.error.endswith("stopped: No space left on device")
    assert stats.ops == 0 and stats.dropped_ops == whole.ops
    assert not list((tmp_path / "full").glob("seg-*"))
