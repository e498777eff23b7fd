"""Every headless view on SGLang logs, run as the installed `kvtop` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang" / "old-era"
LOGS = ("--sglang-log", str(FIXTURES / "prefill.log"), "--sglang-log", f"decode={FIXTURES / 'decode.log'}")


def test_failures_json_from_logs_has_each_origin_with_its_echoes_and_context():
    """Room 1111: origin prefill-0/TP1 send_failed, three echoes of unknown origin, the glog line as likely cause."""
    result = kvtop("failures", "--json", *LOGS)

    assert result.returncode == 0, result.stderr
    group = next(g for g in json.loads(result.stdout) if g["room"] == 1111)
    assert (group["origin_label"], group["origin"]["reason_class"], group["origin"]["level"], group["echo_count"]) == (
        "prefill-0/TP1",
        "send_failed",
        "warning",
        3,
    )
    assert {echo["origin"] for echo in group["echoes"]} == {""}
    assert [line["kind"] for line in group["context"] if line["likely_cause"]] == ["glog"]
    assert "3 garbled (skipped)" in result.stderr


def test_failures_text_from_logs_shows_likely_causes_and_unknown_origins():
    """The table names each origin once, shows the transport-library line under it, and "origin unknown"."""
    result = kvtop("failures", *LOGS)

    assert result.returncode == 0, result.stderr
    assert "likely cause" in result.stdout
    assert "origin unknown" in result.stdout


def test_check_on_logs_is_ok_and_counts_log_ranks_apart():
    """Log ranks are neither alive nor gone: the verdict stands on failures, and they are counted as log ranks."""
    result = kvtop("check", "--json", *LOGS)

    verdict = json.loads(result.stdout)
    assert (result.returncode, verdict["verdict"], verdict["ranks_log"], verdict["ranks_gone"]) == (0, "OK", 4, [])


def test_status_ranks_rooms_and_events_read_logs():
    """status shows log ranks and the parse counts; ranks says `log`; rooms lists the failed rooms; events has the
    echoes at debug."""
    status = json.loads(kvtop("status", "--json", "--window", "600", *LOGS).stdout)
    ranks = json.loads(kvtop("ranks", "--json", *LOGS).stdout)
    rooms = json.loads(kvtop("rooms", "--json", *LOGS).stdout)
    events = [json.loads(line) for line in kvtop("events", "--jsonl", "--level", "debug", *LOGS).stdout.splitlines()]

    assert (status["ranks"]["log"], status["logs"]["garbled"], status["logs"]["failures"]) == (4, 3, 23)
    assert {rank["state"] for rank in ranks} == {"log"}
    failures = [e for e in events if e["kind"] == "failure"]
    assert sorted(room["room"] for room in rooms) == sorted({e["room"] for e in failures})
    assert (len(failures), sum(e["level"] == "debug" for e in failures)) == (23, 9)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_a_log_that_is_not_there_is_a_usage_error():
    """A missing file: exit 2 naming the option (UNKNOWN, 3, for check)."""
    failures = kvtop("failures", "--sglang-log", "/nonexistent/prefill.log")
    check = kvtop("check", "--sglang-log", "/nonexistent/prefill.log")

    assert (failures.returncode, check.returncode) == (2, 3)
    assert "--sglang-log" in failures.stderr
