"""`kvtop check` as a probe runs it: the installed command against a live cluster, judged by exit code."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from cluster_support import QUICK_TRANSFER, run_rooms, small_cluster
from kvtop_cli import kvtop, kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.record.writer import Recorder
from kvtop.views.check import rate_above
from transport import Timeouts
from transport.harness.cluster import ClusterSpec

pytestmark = pytest.mark.processes


def test_a_healthy_cluster_is_ok(make_cluster, control):
    """Rooms that all succeed: exit 0 and a Nagios line with perfdata."""
    cluster = make_cluster(small_cluster(prefill_tp=2, decode_tp=2))
    run_rooms(cluster, control, [1, 2, 3])

    result = kvtop("check", "--bootstrap", cluster.endpoint)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("KVTOP OK - 4/4 ranks alive")
    assert "| ranks_alive=4;;4: rooms=3 failure_rate=0.0000;" in result.stdout


def test_failures_over_the_threshold_are_critical_and_name_their_origin(make_cluster, control):
    """Every room corrupted: exit 2, the failure rate and the origin (decode-0/TP1 checksum) in the text."""
    cluster = make_cluster(small_cluster({"prefill-0/TP1": "corrupt"}, prefill_tp=2, decode_tp=2))
    run_rooms(cluster, control, [11, 12])

    result = kvtop("check", "--bootstrap", cluster.endpoint, "--json")

    verdict = json.loads(result.stdout)
    assert result.returncode == 2
    assert (verdict["verdict"], verdict["failure_rate"], verdict["top_origins"]) == (
        "CRITICAL",
        1.0,
        ["decode-0/TP1 checksum"],
    )


def test_a_killed_rank_is_gone_and_critical(make_cluster, control):
    """SIGKILL one rank: check names it gone and exits 2."""
    cluster = make_cluster(small_cluster(prefill_tp=2, decode_tp=2))
    run_rooms(cluster, control, [21])
    cluster.kill("decode-0/TP1")

    result = kvtop("check", "--bootstrap", cluster.endpoint, "--wait", "3")

    assert result.returncode == 2
    assert "ranks gone: decode-0/TP1" in result.stdout


def test_a_cluster_whose_decode_ranks_all_left_is_critical_though_every_listed_rank_is_alive(make_cluster, wait_for):
    """The decode rank stopped cleanly (SIGTERM: it deregistered, as a scaled-down instance does, and a restarted
    bootstrap service or one past its 10 minutes would list it no more): the prefill rank alone is alive and
    listed, and moves no KV. The check said OK 1/1 before."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    decode = cluster.process("decode-0/TP0").process
    decode.terminate()
    decode.wait(10)
    wait_for(lambda: [agent.role for agent in cluster.bootstrap.agents()] == ["prefill"], 10, "decode to deregister")

    result = kvtop("check", "--bootstrap", cluster.endpoint, "--json")

    verdict = json.loads(result.stdout)
    assert result.returncode == 2, result.stdout
    assert (verdict["ranks_alive"], verdict["ranks_total"]) == (1, 1)
    assert "no decode rank alive" in verdict["problems"]


def test_a_stalled_room_is_stuck_before_any_failure_event(make_cluster, control, wait_for):
    """A room that stops moving is CRITICAL as stuck while no rank has reported a failure yet."""
    cluster = make_cluster(
        small_cluster(
            {"prefill-0/TP0": "stall"},
            prefill_tp=2,
            decode_tp=2,
            transfer=replace(QUICK_TRANSFER, timeouts=Timeouts(3, 3, 60)),
        )
    )
    run_rooms(cluster, control, [31], wait_s=None)
    verdicts: list[dict[str, object]] = []

    def stuck_reported() -> bool:
        result = kvtop("check", "--bootstrap", cluster.endpoint, "--stuck-after", "0.5", "--json")
        verdicts.append({**json.loads(result.stdout), "returncode": result.returncode})
        return verdicts[-1]["stuck"] == 1

    wait_for(stuck_reported, timeout=10, what="check reports the stalled room as stuck")
    assert (verdicts[-1]["returncode"], verdicts[-1]["top_origins"]) == (2, [])


def test_an_unreachable_cluster_is_critical():
    """Nobody at the address: CRITICAL (2) with a one-line reason, within the wait."""
    result = kvtop("check", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5")

    assert result.returncode == 2
    assert result.stdout.startswith("KVTOP CRITICAL - cluster unreachable at tcp://127.0.0.1:9")


def test_an_unreachable_cluster_has_no_rates_and_names_its_problem():
    """A cluster never reached gave `failure_rate=0.0000` (graphs drew 0 % failed through an outage) and an empty
    `problems` list beside its CRITICAL verdict: its rates are unknown (`U`, null), its problem is said."""
    text = kvtop("check", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5")
    data = json.loads(kvtop("check", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5", "--json").stdout)

    assert "failure_rate=U;" in text.stdout and "abort_rate=U" in text.stdout
    assert (data["failure_rate"], data["abort_rate"]) == (None, None)
    assert data["problems"] == [data["summary"]]


def test_bad_arguments_are_unknown():
    """Unknown options and impossible thresholds exit 3 (UNKNOWN), as monitoring systems expect."""
    assert kvtop("check", "--bootstrap", "tcp://127.0.0.1:9", "--no-such-option").returncode == 3
    assert kvtop("check", "--bootstrap", "tcp://127.0.0.1:9", "--max-failure-rate", "2").returncode == 3
    assert kvtop("check").returncode == 3
    assert kvtop("check", "--bootstrap", "not-an-address").returncode == 3


@pytest.mark.parametrize(
    "args",
    [
        ("--bootstrap", "tcp://127.0.0.1:9", "--no-such-option"),
        ("--bootstrap", "tcp://127.0.0.1:9", "--max-failure-rate", "2"),
        ("--sglang-log", "/nonexistent/prefill.log"),
    ],
)
def test_bad_arguments_say_unknown_on_stdout_where_monitoring_reads(args: tuple[str, ...]):
    """Nagios and Icinga read a plugin's stdout: a usage error there said nothing ("(No output on stdout)"),
    only Click's usage on stderr. Now stdout holds the UNKNOWN line naming the error, or with --json its JSON."""
    line = kvtop_here("check", *args)
    as_json = kvtop_here("check", *args, "--json")

    assert line.returncode == as_json.returncode == 3
    assert line.stdout.startswith("KVTOP UNKNOWN - bad arguments: ") and "|" not in line.stdout, line.stdout
    verdict = json.loads(as_json.stdout)
    assert (verdict["verdict"], verdict["exit_code"]) == ("UNKNOWN", 3)
    assert verdict["summary"] == line.stdout.strip().removeprefix("KVTOP UNKNOWN - ")


def test_a_recording_that_cannot_be_read_is_unknown_on_stdout(tmp_path):
    """A damaged recording said why on stderr only; a check's verdict and its reason now go to stdout (a Nagios
    line without perfdata, nothing was measured; or JSON), exit 3."""
    (tmp_path / "000001.kvr").write_bytes(b"not a recording" * 100)

    line = kvtop_here("check", "--replay", str(tmp_path))
    as_json = kvtop_here("check", "--replay", str(tmp_path), "--json")

    assert line.returncode == as_json.returncode == 3
    assert line.stdout.startswith(f"KVTOP UNKNOWN - cannot read the recording: {tmp_path}"), line.stdout
    assert "|" not in line.stdout
    verdict = json.loads(as_json.stdout)
    assert verdict["verdict"] == "UNKNOWN" and verdict["failure_rate"] is None
    assert verdict["summary"] == line.stdout.strip().removeprefix("KVTOP UNKNOWN - ")


DEAD = "tcp://127.0.0.1:1"
"""An endpoint nobody listens on (port 1 is never an agent's)."""


def test_an_endpoint_that_never_answers_is_a_gone_rank_and_critical():
    """`--connect` to a dead endpoint: CRITICAL (2), the endpoint named as a rank that gave no answer."""
    result = kvtop("check", "--connect", DEAD, "--wait", "0.5")

    assert result.returncode == 2
    assert result.stdout.startswith(f"KVTOP CRITICAL - ranks gone: {DEAD} (no answer in 0.5s)")
    assert "0/1 ranks alive" in result.stdout


def test_one_live_and_one_dead_endpoint_is_critical_naming_the_dead_one(make_cluster):
    """A live agent beside a dead endpoint: CRITICAL, 1/2 alive, the dead endpoint named, the JSON says which."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    live = next(agent for agent in cluster.agents() if agent.role == "prefill")

    text = kvtop("check", "--connect", live.event_endpoint, "--connect", DEAD, "--wait", "3")
    data = json.loads(kvtop("check", "--connect", live.event_endpoint, "--connect", DEAD, "--json").stdout)

    assert text.returncode == 2, text.stdout + text.stderr
    assert f"ranks gone: {DEAD} (no answer in 3s)" in text.stdout
    assert "1/2 ranks alive" in text.stdout
    assert (data["ranks_alive"], data["ranks_total"], data["ranks_gone"], data["ranks_unanswered"]) == (
        1,
        2,
        [DEAD],
        [DEAD],
    )


def test_min_ranks_defaults_to_every_listed_endpoint(make_cluster):
    """With every listed endpoint answering the check is OK, and its perfdata asks for all of them."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    connect = [arg for agent in cluster.agents() for arg in ("--connect", agent.event_endpoint)]

    result = kvtop("check", *connect, "--wait", "5")

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("KVTOP OK - 2/2 ranks alive")
    assert "ranks_alive=2;;2:" in result.stdout


def test_a_recording_that_named_no_rank_is_unknown_without_words_about_logs(tmp_path):
    """A recording of no agent (a keyframe of an empty model) was judged `0 ranks from logs (no liveness in logs)`."""
    recording = tmp_path / "rec"
    recorder = Recorder(recording, flush_s=3600.0)
    recorder.tick(ClusterModel(), time.time())
    recorder.close()

    check = kvtop_here("check", "--replay", str(recording))

    assert check.returncode == 3, check.stdout
    assert "the recording holds no agent" in check.stdout and "from logs" not in check.stdout


def test_a_rate_just_over_its_limit_is_said_with_the_digits_that_tell_them_apart():
    """0.0502 against 0.05 read `failure rate 5.0% > 5.0%`."""
    assert rate_above(0.0502, 0.05) == "5.02% > 5.00%"
    assert rate_above(0.099, 0.05) == "9.9% > 5.0%"


def test_no_room_finished_is_no_failure_rate_not_a_rate_of_zero():
    """A dead endpoint: nothing finished, so the perfdata's rates are U and the JSON's null (it said 0.0000)."""
    result = kvtop("check", "--connect", DEAD, "--wait", "0.5")
    verdict = json.loads(kvtop("check", "--json", "--connect", DEAD, "--wait", "0.5").stdout)

    assert "0 rooms in 60s, no failure rate (no room finished)" in result.stdout
    assert " failure_rate=U;" in result.stdout and result.stdout.rstrip().endswith("abort_rate=U")
    assert (verdict["failure_rate"], verdict["abort_rate"]) == (None, None)
