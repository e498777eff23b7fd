"""A room one rank of each instance never took shows in kvtop as the failure it is, not as a success."""

from __future__ import annotations

import json

from kvtop_cli import kvtop

from transport import KVPoll, TransferConfig
from transport.harness.cluster import ClusterSpec
from transport.kv.reasons import consensus_timeout
from transport.sglang.reasons import reason_class


def test_a_room_its_instances_never_agreed_on_counts_as_failed_in_status_and_check(make_cluster, control):
    """Submitted to TP0 of each TP=2 instance only, the room succeeds there but never agrees: `status --json`
    counts it failed with timeout_consensus origins, and `check` says CRITICAL (exit 2)."""
    spec = ClusterSpec(
        prefill_tp=2,
        decode_tp=2,
        num_pages=64,
        page_bytes=16384,
        transfer=TransferConfig(heartbeat_s=0.2, peer_timeout_s=1.0),
    )
    cluster = make_cluster(spec)
    agents = {agent.label: control(agent.control_endpoint) for agent in cluster.agents()}
    prefill, decode = agents["prefill-0/TP0"], agents["decode-0/TP0"]
    prefill.submit(0x1203, 8)
    decode.submit(0x1203, 8, "prefill-0")
    assert [KVPoll.Failed] * 2 == [client.wait_result(0x1203, 10).state for client in (prefill, decode)]

    status = kvtop("status", "--bootstrap", cluster.endpoint, "--json")
    check = kvtop("check", "--bootstrap", cluster.endpoint)

    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert (report["rooms_finished"], report["failure_rate"]) == (1, 1.0)
    origins = {origin for origin, _ in report["top_origins"]}  # each instance's TP0 times out; whichever does first
    assert origins <= {"decode-0/TP0 timeout_consensus", "prefill-0/TP0 timeout_consensus"} and origins  # may
    # tell the other instance (decode ABORTs, prefill echoes): one origin or two
    assert check.returncode == 2, check.stdout
    assert check.stdout.startswith("KVTOP CRITICAL")


def test_an_agent_log_line_of_a_consensus_timeout_is_read_back_as_timeout_consensus():
    """The log source classes the agents' missing-vote text as the agents class it."""
    for waiting_for in ("the vote of rank prefill-0/TP1", "every rank of prefill-0 to join (1 of 2 reachable)"):
        reason = consensus_timeout(77, 5.04, waiting_for)
        assert reason_class(reason.text) == str(reason.reason_class) == "timeout_consensus"
