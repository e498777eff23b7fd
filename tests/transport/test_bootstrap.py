"""The bootstrap service is a border post and forgets: bad registrations are refused, dead agents expire."""

from __future__ import annotations

import os
import time

import msgspec
import pytest

from transport import BootstrapClient, BootstrapServer
from transport.cluster import ClusterSpec
from transport.errors import BootstrapError
from transport.registration import endpoint_problem
from transport.wire import AgentInfo

GOOD = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://127.0.0.1:5000", "", os.getpid(), "host", 7)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5555", "tcp://node-7.example.com:1", "tcp://[::1]:65535", "ipc:///tmp/kvtop/agent-0"],
)
def test_endpoint_syntax_accepts_tcp_host_port_and_ipc_paths(endpoint):
    """A connectable tcp or ipc endpoint has no problem."""
    assert endpoint_problem(endpoint) == ""


@pytest.mark.parametrize(
    "endpoint",
    [
        "not-an-endpoint",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:12ab",
        "tcp://*:5555",
        "tcp://:5555",
        "udp://127.0.0.1:5555",
        "ipc://",
        "ipc:///" + "x" * 200,
    ],
)
def test_endpoint_syntax_names_what_is_wrong(endpoint):
    """An endpoint libzmq would refuse (or one nobody can reach) is a problem, with a reason."""
    assert endpoint_problem(endpoint)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"event_endpoint": "not-an-endpoint"}, "event_endpoint"),
        ({"data_endpoint": "tcp://127.0.0.1:99999"}, "data_endpoint"),
        ({"data_endpoint": ""}, "data endpoint"),
        ({"role": "router"}, "role"),
        ({"instance": "prefill/0"}, "instance"),
        ({"instance": ""}, "instance"),
        ({"rank": 2, "tp": 2}, "rank"),
        ({"tp": 0}, "rank"),
        ({"page_bytes": -1}, "page size"),
        ({"host": "h" * 300}, "host"),
    ],
)
def test_bootstrap_refuses_an_invalid_registration_counts_and_names_it(bootstrap, changes, why):
    """A registration with a bad endpoint, role, name, rank or size is refused, counted and named; the rest work."""
    bad = msgspec.structs.replace(GOOD, **changes)
    with BootstrapClient(bootstrap.endpoint) as client:
        with pytest.raises(BootstrapError, match=why):
            client.register(bad)
        client.register(GOOD)
        listing = client.listing()

    assert listing.agents == [GOOD]
    assert listing.counters["rejected_invalid"] == 1
    assert len(listing.refused) == 1 and why in listing.refused[0]


def listed(server: BootstrapServer) -> set[str]:
    with BootstrapClient(server.endpoint) as client:
        return {agent.label for agent in client.list_agents()}


def test_a_killed_agents_entry_expires_and_a_live_one_stays(make_cluster, wait_for):
    """SIGKILL leaves no goodbye: the entry expires within its TTL, while a live agent's refreshes keep its own."""
    cluster = make_cluster(ClusterSpec())
    cluster.bootstrap.entry_ttl_s = 2.0
    cluster.kill("decode-0/TP0")
    killed_at = time.monotonic()

    wait_for(lambda: listed(cluster.bootstrap) == {"prefill-0/TP0"}, timeout=10.0, what="the killed entry expires")
    assert time.monotonic() - killed_at < 2.0 + 3.0
    deadline = time.monotonic() + 2 * cluster.bootstrap.entry_ttl_s
    while time.monotonic() < deadline:
        assert "prefill-0/TP0" in listed(cluster.bootstrap), "a live agent's entry expired"
        time.sleep(0.2)
    assert cluster.bootstrap.counters["expired"] == 1


def test_an_agent_that_exits_cleanly_deregisters_at_once(make_cluster, wait_for):
    """SIGTERM: the agent takes its entry out on the way down, long before any TTL would."""
    cluster = make_cluster(ClusterSpec())
    cluster.bootstrap.entry_ttl_s = 300.0
    process = cluster.process("decode-0/TP0").process
    process.terminate()
    assert process.wait(10) == 0

    assert {"prefill-0/TP0"} == listed(cluster.bootstrap)
    assert cluster.bootstrap.counters["deregistered"] == 1
    assert cluster.bootstrap.counters["expired"] == 0
