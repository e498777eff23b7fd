"""`kvtop bench ingest`: the check is timed under load and must give a verdict; `kvtop bench incidents` runs."""

from __future__ import annotations

import json

import pytest

from kvtop.bench.ingest import verdict
from tests.kvtop.kvtop_cli import kvtop


def test_a_check_that_exits_unknown_or_out_of_range_is_no_verdict() -> None:
    """UNKNOWN, an exit code past 2, or a crash's exit 1 without a status line are refused; verdicts pass."""
    assert verdict(3, "KVTOP UNKNOWN - internal error: EOFError").startswith("kvtop check said UNKNOWN")
    assert verdict(120, "").startswith("kvtop check exited 120")
    assert "without its KVTOP WARNING line" in verdict(1, "Traceback (most recent call last): ...")
    assert verdict(2, "KVTOP CRITICAL - 3/4 ranks alive, gone: decode-0/TP1 | ranks=3") == ""
    assert verdict(0, "KVTOP OK - 4/4 ranks alive | ranks=4") == ""


@pytest.mark.processes
def test_ingest_bench_times_check_under_load_and_reports_its_verdicts() -> None:
    """The JSON carries each check's exit code (all verdicts) and the rooms finished while they ran."""
    done = kvtop("bench", "ingest", "--events", "1000", "--repeats", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["check_exit_codes"]) == 2
    assert set(result["check_exit_codes"]) <= {0, 1, 2}
    assert result["check_load_rooms"] > 0
    assert 0 < result["check_wall_s"] < 60
    assert result["events_per_s"] > 0 and result["decode_only_per_s"] > 0


@pytest.mark.processes
def test_incidents_bench_reports_their_cost_and_a_bounded_memory_run() -> None:
    """Both legs took the same events, failures formed incidents, and the memory run read RSS at three marks."""
    done = kvtop("bench", "incidents", "--rooms", "2000", "--repeats", "1", "--memory-rooms", "20000", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failures"] > 0 and result["incidents"] > 0
    assert result["events_per_s_tracked"] > 0 and result["events_per_s_untracked"] > 0
    assert len(result["rss_mb"]) == 3 and result["incidents_kept"] == 8
