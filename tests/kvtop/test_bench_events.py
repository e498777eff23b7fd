"""`kvtop bench events`: watched runs, and the failure when nobody applied anything (tiny sizes, seconds)."""

from __future__ import annotations

import json

import pytest

from kvtop.bench import BenchFailed
from kvtop.bench.transfer import run_kvtop
from kvtop.bench.watch import CollectorProcess
from tests.kvtop.kvtop_cli import kvtop

pytestmark = pytest.mark.processes


def test_events_bench_fails_when_the_collector_applied_no_events() -> None:
    """A collector watching ranks that publish nothing applies no events, and the bench refuses the run."""
    collector = CollectorProcess(rooms=4)
    run_kvtop(64 << 10, 256 << 10, 4, publish_events=False, watcher=collector)
    with pytest.raises(BenchFailed, match="applied no events"):
        collector.result()


def test_events_bench_json_shows_what_the_collector_applied() -> None:
    """The JSON names the watched run's applied events and every room seen ending on both ranks."""
    done = kvtop("bench", "events", "--chunk-bytes", "64KiB", "--room-bytes", "256KiB", "--rooms", "4",
                 "--repeats", "1", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rooms"] == 4
    assert result["rooms_seen"] == 4
    assert result["events_applied"] >= 4 * 2 * 3
    assert result["gaps"] == 0
    assert result["gbps_events_on"] > 0 and result["gbps_events_off"] > 0
    assert result["cpu_s_per_gb_events_on"] >= 0 and result["cpu_s_per_gb_events_off"] >= 0
    assert {"cost", "cpu_cost", "events_per_s", "events_dropped", "catch_up_s", "repeats"} <= result.keys()
