"""`kvtop failures` against a live cluster, run as the installed command a person or script would run."""

from __future__ import annotations

import json

import pytest
from cluster_support import run_rooms, small_cluster
from kvtop_cli import kvtop, kvtop_here


def test_failures_json_has_one_group_per_injected_fault_with_its_echoes(make_cluster, control):
    """Every room corrupted on prefill-0/TP1 is one group: origin decode-0/TP1 (checksum), three echoes."""
    cluster = make_cluster(small_cluster({"prefill-0/TP1": "corrupt"}, prefill_tp=2, decode_tp=2))
    rooms = [101, 202]
    run_rooms(cluster, control, rooms)

    result = kvtop("failures", "--bootstrap", cluster.endpoint, "--json")

    assert result.returncode == 0, result.stderr
    groups = json.loads(result.stdout)["groups"]
    assert sorted(g["room"] for g in groups) == rooms
    for group in groups:
        assert (group["origin"]["rank"], group["origin"]["reason_class"], group["origin"]["level"]) == (
            "decode-0/TP1",
            "checksum",
            "error",
        )
        assert group["echo_count"] == 3
        assert {echo["origin"] for echo in group["echoes"]} == {"decode-0/TP1"}
        assert {echo["level"] for echo in group["echoes"]} == {"debug"}


@pytest.mark.processes
def test_failures_says_so_when_the_cluster_does_not_answer():
    """An address nobody serves is a clear one-line error and exit code 1, within the wait."""
    result = kvtop("failures", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5")

    assert result.returncode == 1
    assert "did not answer" in result.stderr


def test_failures_without_an_address_is_a_usage_error():
    """No --bootstrap (and no KVTOP_BOOTSTRAP) is bad usage: exit 2 with a message naming the option."""
    result = kvtop_here("failures")

    assert result.returncode == 2
    assert "--bootstrap" in result.stderr
