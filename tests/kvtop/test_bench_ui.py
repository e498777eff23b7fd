"""`kvtop bench ui`: data age beside frame time, and loud failures when frames or keys are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtop.bench.ui import data_ages, missing
from tests.kvtop.kvtop_cli import kvtop

_SMALL = ("bench", "ui", "--rooms", "1000", "--instances", "1", "--tp", "1")


def test_data_age_runs_from_the_read_of_the_model_to_the_paint_and_to_the_next_paint() -> None:
    """Each frame shows the last read before its paint; the screen's data ages until the next paint."""
    at_paint, on_screen = data_ages([1.0, 1.5, 2.0], [1.1, 1.7, 2.3])
    assert [round(a, 3) for a in at_paint] == [0.1, 0.2, 0.3]
    assert [round(a, 3) for a in on_screen] == [0.7, 0.8]


def test_a_run_without_a_views_frames_or_with_unanswered_keys_lacks_what_it_measures() -> None:
    """A watched view with no frame and keys that never showed their view are both named."""
    lacking = missing({"rooms": 3, "failures": 0}, keys=2, pressed=5, key_timeout_s=5.0)
    assert lacking == "no frame painted while watching failures; 3 of 5 keys did not show their view within 5 s"
    assert missing({"rooms": 3}, keys=5, pressed=5, key_timeout_s=5.0) == ""


@pytest.mark.processes
def test_ui_bench_exits_non_zero_when_no_key_answered(tmp_path: Path) -> None:
    """With no time allowed for a key to show its view, the bench fails with one line instead of 0.0 ms, and
    leaves no temporary folder behind."""
    done = kvtop(*_SMALL, "--seconds", "1", "--key-timeout-s", "0", "--json", env={"TMPDIR": str(tmp_path)})
    assert not list(tmp_path.glob("kvtop-bench-ui-*"))
    assert done.returncode == 1
    assert done.stdout == ""
    assert "kvtop bench ui: FAILED:" in done.stderr
    assert "keys did not show their view within 0 s" in done.stderr


@pytest.mark.processes
def test_ui_bench_json_reports_data_age_beside_frame_time(tmp_path: Path) -> None:
    """A short run reports frame, build and data-age percentiles, and every key it pressed answered; the
    dashboard recorded what it was fed, as it does live by default, in a temporary folder it removes."""
    done = kvtop(*_SMALL, "--seconds", "8", "--json", env={"TMPDIR": str(tmp_path)})  # 2 s a view: a frame each 0.5 s
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("kvtop-bench-ui-*"))  # its ring of ~18 MiB a run stayed behind in every run
    result = json.loads(done.stdout)
    assert result["frames"] > 0
    assert result["keys"] == result["keys_pressed"] > 0
    assert 0 < result["data_age_at_paint_ms_p50"] <= result["data_age_on_screen_ms_p50"]
    assert result["data_age_on_screen_ms_p99"] >= result["data_age_on_screen_ms_p50"]
    assert result["frame_ms_p99"] > 0 and result["key_to_screen_ms"] > 0
    assert set(result["frame_ms_p99_by_view"]) == {"overview", "rooms", "failures", "events"}
    assert result["recording"] is True and result["recorded_events"] > 0
