"""An agent process checks every Submit where it enters: page counts and prefill instances are refused and counted."""

from __future__ import annotations

import pytest

from transport import KVPoll
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient, ControlError

POOL_PAGES = 64


def control_of(cluster: LocalCluster, control, label: str) -> ControlClient:
    agent = next(a for a in cluster.agents() if a.label == label)
    return control(agent.control_endpoint)


@pytest.mark.parametrize(
    ("label", "pages", "instance", "why", "message"),
    [
        ("decode-0/TP0", -5, "prefill-0", "pages", "num_pages -5 is outside 1..64"),
        ("prefill-0/TP0", 0, "", "pages", "num_pages 0 is outside 1..64"),
        ("prefill-0/TP0", POOL_PAGES + 1, "", "pages", "num_pages 65 is outside 1..64"),
        ("decode-0/TP0", 4, "prefill-9", "instance", "unknown prefill instance 'prefill-9'; the bootstrap service lists: prefill-0"),  # noqa: E501
        ("prefill-0/TP0", 4, "prefill-3", "instance", "prefill instance 'prefill-3' is not this rank's (prefill-0)"),
    ],
    ids=["negative-pages", "zero-pages", "too-many-pages", "unknown-instance-on-decode", "other-instance-on-prefill"],
)  # fmt: skip
def test_a_bad_submit_is_refused_with_its_reason_counted_and_the_agent_keeps_serving(
    make_cluster, control, label, pages, instance, why, message
):
    """The agent answers a Refusal naming the problem, counts it as control_refused_<why>, then runs a good room."""
    cluster = make_cluster(ClusterSpec(num_pages=POOL_PAGES))
    target = control_of(cluster, control, label)

    with pytest.raises(ControlError) as refused:
        target.submit(0xBAD, pages, prefill_instance=instance)

    assert message in str(refused.value)
    counters = target.stats()
    assert counters[f"control_refused_{why}"] == 1
    assert counters["control_refused_pages"] + counters["control_refused_instance"] == 1
    prefill, decode = control_of(cluster, control, "prefill-0/TP0"), control_of(cluster, control, "decode-0/TP0")
    prefill.submit(0x600D, 4)
    decode.submit(0x600D, 4, prefill_instance="prefill-0")
    assert KVPoll.Success == decode.wait_result(0x600D, 10.0).state
    assert KVPoll.Success == prefill.wait_result(0x600D, 10.0).state
