"""Keyframes taken by a forked child (kvtop.record.forked): each one is the model at the fork, byte for byte,
while the model keeps changing; a child that dies or hangs is counted and reaped, and the recording stays
exact (the next keyframe is captured under the lock)."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.record import forked, keyframes
from kvtop.record.format import BlockKind
from kvtop.record.reader import Recording
from kvtop.record.replay import Replay
from kvtop.record.writer import Recorder, RecorderStats
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.failures import to_json
from kvtop.views.tables import status_json

CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2, spacing_s=0.001, failure_rate=0.1)
CHILD_DELAY_S = 0.1
"""How long a child waits before it reads the model: the live side changes it meanwhile."""
DEADLINE_S = 20.0


def _said(model: ClusterModel, now: float) -> str:
    return json.dumps([status_json(model, now, 60.0), to_json(model.groups(), None)])


def _record(
    folder: Path, enough: Callable[[RecorderStats], bool], passes: int = 20
) -> tuple[RecorderStats, list[tuple[float, str]], dict[float, bytes]]:
    """A recording by a started recorder (keyframes forked) of at least `passes` collector passes, until
    its stats are `enough` (at most `DEADLINE_S`); returns its stats, what the live model said at each
    pass, and the keyframe a capture under the lock would have taken at each pass."""
    recorder = Recorder(folder, keyframe_events=2000, segment_bytes=20_000, flush_s=0.05).start()
    model = ClusterModel()
    said: list[tuple[float, str]] = []
    captured: dict[float, bytes] = {}
    now = CLUSTER.start
    recorder.tick(model, now)
    for label, batch in CLUSTER.hello():
        recorder.delivered(label, batch, now)
        model.apply(label, batch, now)
    deadline = time.monotonic() + DEADLINE_S
    index = 0
    while index < passes or (not enough(recorder.stats()) and time.monotonic() < deadline):
        now += 0.05
        for label, batch in CLUSTER.rooms(20, first=index * 20):
            recorder.delivered(label, batch, now)
            model.apply(label, batch, now)
        recorder.accounted(model, now)
        if index % 10 == 0:
            model.sweep(now)
            recorder.swept(now)
        recorder.tick(model, now)
        said.append((now, _said(model, now)))
        captured[now] = keyframes.capture(model)
        index += 1
        time.sleep(0.002)  # passes a few ms apart, as a collector's
    recorder.close()
    return recorder.stats(), said, captured


def _slow_capture(model: ClusterModel) -> bytes:
    time.sleep(CHILD_DELAY_S)
    return keyframes.capture(model)


@pytest.mark.processes
def test_a_forked_keyframe_is_the_model_at_the_fork_while_the_model_keeps_changing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each child reads the model only after the live side applied more passes to it: every keyframe
    written equals, byte for byte, the capture under the lock at its pass, and the replay at each keyframe
    and at every pass after equals the live model."""
    monkeypatch.setattr(forked, "capture", _slow_capture)
    stats, said, captured = _record(tmp_path / "rec", lambda stats: stats.keyframes_forked >= 3)
    assert stats.keyframes_forked >= 3 and stats.keyframes_in_lock == 1, stats
    assert not stats.keyframes_failed and not stats.error
    assert stats.keyframe_child_cpu_s > 0 and stats.keyframe_child_bytes > 0
    recording = Recording(tmp_path / "rec")
    assert len(recording.segments) >= 2, "segments rotate at forked keyframes"
    written = [block for block in recording.blocks if block.kind is BlockKind.KEYFRAME]
    assert len(written) == stats.keyframes == stats.keyframes_forked + 1
    for block in written[1:]:  # the first: the recorder's, under the lock before the first pass
        assert recording.read(block) == captured[block.entry.t_first]
    replay = Replay(recording)
    times = {block.entry.t_first for block in written}
    for index, (now, live) in enumerate(said):
        if now in times or index % 3 == 0:
            assert _said(replay.at(now).model, now) == live


@pytest.mark.processes
def test_a_child_that_dies_is_counted_and_the_next_keyframe_is_captured_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children killed by a signal write nothing: counted, the recorder carries on, the keyframe after each
    is taken under the lock, and the replay is exact at every pass."""
    monkeypatch.setattr(forked, "capture", lambda model: os.kill(os.getpid(), signal.SIGKILL))
    stats, said, _ = _record(tmp_path / "rec", lambda stats: stats.keyframes_failed >= 2)
    assert stats.keyframes_failed == stats.keyframes_forked >= 2, stats
    assert stats.keyframes == stats.keyframes_in_lock >= 2 and not stats.error
    replay = Replay(tmp_path / "rec")
    for now, live in said[::4] + said[-1:]:
        assert _said(replay.at(now).model, now) == live


def test_without_fork_keyframes_are_captured_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fork() refused (no memory, too many processes): every keyframe is captured under the lock."""

    def refuse() -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    stats, said, _ = _record(tmp_path / "rec", lambda stats: stats.keyframes >= 2)
    assert stats.keyframes_forked == 0 and stats.keyframes == stats.keyframes_in_lock >= 2, stats
    assert _said(Replay(tmp_path / "rec").at(said[-1][0]).model, said[-1][0]) == said[-1][1]


@pytest.mark.processes
def test_a_child_that_outlasts_its_time_is_killed_and_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child still at work after the timeout: KeyframeFailed saying so, and no child is left behind."""
    monkeypatch.setattr(forked, "capture", lambda model: threading.Event().wait())  # never done
    child = forked.fork_capture(ClusterModel(), 1.0)
    started = time.monotonic()
    with pytest.raises(forked.KeyframeFailed, match=r"took over 0\.2 s \(killed\)"):
        forked.collect(child, timeout_s=0.2)
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)
