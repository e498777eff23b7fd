"""The dashboard's own recording: one recorder per folder at a time, off with --no-record, its size checked."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from kvtop.cli.model_spec import LiveModel
from kvtop.model.cluster import ClusterModel
from kvtop.record.dashboard import RecordChoice, dashboard_recording
from kvtop.record.writer import Recorder
from kvtop.tui.model_server import ModelStartError
from tests.kvtop.kvtop_cli import kvtop_here


def test_a_second_dashboard_on_the_same_folder_runs_without_recording_and_says_so(tmp_path: Path) -> None:
    """The first dashboard holds the folder's lock and records; a second one gets no recorder and a warning."""
    choice = RecordChoice(True, str(tmp_path / "ring"), 1 << 20)
    with dashboard_recording(choice) as first, dashboard_recording(choice) as second:
        assert first.recorder is not None and first.warning == ""
        assert second.recorder is None
        assert second.warning == (
            f"not recording: another kvtop (pid {os.getpid()}) records into {tmp_path / 'ring'} (--record-dir)"
        )
    with dashboard_recording(choice) as again:  # the lock went with the first
        assert again.recorder is not None


def test_no_record_keeps_nothing(tmp_path: Path) -> None:
    """--no-record: no recorder, and no folder made."""
    with dashboard_recording(RecordChoice(False, str(tmp_path / "ring"))) as recording:
        assert recording.recorder is None and recording.warning == ""
    assert not (tmp_path / "ring").exists()


def test_a_record_size_that_is_no_size_is_a_usage_error() -> None:
    """`--record-max-bytes lots` exits 2 with one line, before any source is opened."""
    done = kvtop_here("top", "--connect", "tcp://127.0.0.1:9", "--record-max-bytes", "lots")
    assert done.returncode == 2
    assert "'lots' is not a size" in done.stderr


def test_a_dashboard_on_a_folder_a_recorder_writes_runs_without_recording_and_says_so(tmp_path: Path) -> None:
    """`kvtop record`'s recorder holds the same lock: a dashboard on its folder gets no recorder."""
    recorder = Recorder(tmp_path / "rec")
    try:
        with dashboard_recording(RecordChoice(True, str(tmp_path / "rec"))) as recording:
            assert recording.recorder is None
            assert recording.warning.startswith(f"not recording: another kvtop (pid {os.getpid()}) records into")
    finally:
        recorder.close()


def test_a_ring_smaller_than_the_least_cap_is_a_usage_error() -> None:
    """`--record-max-bytes 64KiB`: exit 2 with one line naming the least size (1MiB)."""
    done = kvtop_here("top", "--connect", "tcp://127.0.0.1:9", "--record-max-bytes", "64KiB")
    assert done.returncode == 2
    assert "'64KiB' is below 1MiB" in done.stderr


def test_a_dashboard_that_never_reached_its_cluster_leaves_no_run_in_the_ring(tmp_path: Path) -> None:
    """`kvtop top --bootstrap DEAD` exited 1 and left a run of no agent at the ring's end: a replay read at the end
    then showed no agent, hiding the run before it. What it made is removed; what the ring held stays."""
    ring = tmp_path / "ring"
    before = Recorder(ring)
    before.tick(ClusterModel(), 1_000.0)
    before.close()
    held = sorted(path.name for path in ring.iterdir())
    dead = LiveModel("tcp://127.0.0.1:9", wait=0.3, record=RecordChoice(True, str(ring), 1 << 20))

    with pytest.raises(ModelStartError), contextlib.ExitStack() as stack:
        dead.open(stack)

    assert sorted(path.name for path in ring.iterdir()) == held
