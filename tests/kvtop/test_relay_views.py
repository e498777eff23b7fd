"""Views through `kvtop relay` see what they see directly: one relay, two tiers, a bootstrap that lists one.

One local cluster for the module (1P1D TP2, every room corrupted on prefill-0/TP1: one origin, three
echoes per room), one relay on its bootstrap and a second relay tiered on the first.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator

import pytest
from cluster_support import small_cluster
from kvtop_cli import kvtop

from kvtop.model.cluster import ClusterModel
from kvtop.sources.live import Collector
from tests.conftest import wait_for
from transport.harness.cluster import LocalCluster
from transport.harness.control import ControlClient
from transport.plane.relay import Relay

pytestmark = pytest.mark.processes

ROOMS = (101, 202)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A cluster whose rooms all failed at prefill-0/TP1's corrupt chunks, every room settled."""
    with LocalCluster(
        small_cluster({"prefill-0/TP1": "corrupt"}, prefill_tp=2, decode_tp=2)
    ) as cluster:  # started on entry, stopped on exit
        clients = {agent.label: ControlClient(agent.control_endpoint) for agent in cluster.agents()}
        try:
            for room in ROOMS:
                for label, client in clients.items():
                    client.submit(room, 8, "prefill-0" if label.startswith("decode") else "")
            for room in ROOMS:
                for client in clients.values():
                    client.wait_result(room, 10)
        finally:
            for client in clients.values():
                client.close()
        yield cluster
        alive = [p.label for p in cluster.processes if p.process.poll() is None]
    assert not [p.label for p in cluster.processes if p.process.poll() is None], f"agents left running: {alive}"


@pytest.fixture(scope="module")
def relays(cluster: LocalCluster) -> Iterator[tuple[Relay, Relay]]:
    """A relay on the cluster's bootstrap, and a second one whose only upstream is the first."""
    first = Relay(bootstrap=cluster.endpoint).start()
    second = Relay(relays=[first.address], name="cluster-relay").start()
    yield first, second
    second.close()
    first.close()
    assert not first.died and not second.died, (first.error, second.error)


@pytest.fixture(scope="module")
def direct_failures(cluster: LocalCluster) -> list[dict[str, object]]:
    """`kvtop failures --json` on the bootstrap: the groups every relayed view must match."""
    result = kvtop("failures", "--bootstrap", cluster.endpoint, "--json")
    assert result.returncode == 0, result.stderr
    groups: list[dict[str, object]] = json.loads(result.stdout)["groups"]
    assert sorted(group["room"] for group in groups) == list(ROOMS)  # type: ignore[type-var]
    assert {group["echo_count"] for group in groups} == {3}
    return groups


@pytest.mark.parametrize("tier", [0, 1], ids=["one-relay", "two-tiers"])
def test_failures_json_through_a_relay_is_what_it_is_directly(
    relays: tuple[Relay, Relay], direct_failures: list[dict[str, object]], tier: int
):
    """Same groups, origins, echoes and raw events through one relay and through two tiers of relays."""
    relay = relays[tier]
    passed = relay.snapshot()["snapshots_passed"]

    result = kvtop("failures", "--relay", relay.address, "--json")

    assert result.returncode == 0, result.stderr
    relayed = json.loads(result.stdout)["groups"]
    assert same_incidents(relayed) == same_incidents(direct_failures)  # ids are each model's own numbers
    assert without_incident(relayed) == without_incident(direct_failures)
    assert relay.snapshot()["snapshots_passed"] - passed == 4  # one per agent: the Clone pattern, relayed


def without_incident(groups: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{key: value for key, value in group.items() if key != "incident"} for group in groups]


def same_incidents(groups: list[dict[str, object]]) -> set[frozenset[object]]:
    """The rooms each incident holds (whatever its id)."""
    rooms: dict[object, set[object]] = {}
    for group in groups:
        rooms.setdefault(group["incident"], set()).add(group["room"])
    return {frozenset(held) for held in rooms.values()}


def test_a_bootstrap_that_lists_a_relay_sends_views_through_it(
    cluster: LocalCluster, direct_failures: list[dict[str, object]]
):
    """A relay registered with the bootstrap is listed apart; a view given the bootstrap subscribes to it."""
    relay = Relay(bootstrap=cluster.endpoint, register=True, name="rack-relay").start()
    try:
        assert [entry.instance for entry in cluster.bootstrap.relays()] == ["rack-relay"]
        assert len(cluster.bootstrap.agents()) == 4  # the relay is no rank

        result = kvtop("failures", "--bootstrap", cluster.endpoint, "--json")

        assert result.returncode == 0, result.stderr
        assert without_incident(json.loads(result.stdout)["groups"]) == without_incident(direct_failures)
        assert relay.snapshot()["snapshots_passed"] == 4
    finally:
        relay.close()
    assert cluster.bootstrap.relays() == []  # deregistered on the way out


def test_the_dashboard_on_a_relay_shows_the_failures_it_shows_directly(
    relays: tuple[Relay, Relay], direct_failures: list[dict[str, object]]
):
    """The dashboard fed through two tiers of relays draws one row per direct origin, with its echoes, under
    the incidents it leads with."""
    import asyncio

    from kvtop.tui.app import KvtopApp
    from kvtop.tui.themes import load_themes
    from kvtop.tui.views.failures import FailuresView

    collector = Collector(relays[1].address, model=ClusterModel()).start()
    seen: dict[str, object] = {}
    try:
        assert collector.wait_synced(5.0)
        app = KvtopApp(collector, title="relay", themes=load_themes(), theme="kvtop-dark", refresh_s=0.2)

        async def run() -> None:
            async with app.run_test(size=(140, 40)) as pilot:
                await pilot.press("f")
                view = app.query_one(FailuresView)
                for _ in range(200):
                    view.open_incidents = {row.incident.id for row in view.rows}  # every incident expanded
                    groups = [row.group for row in view.rows if row.group is not None and row.echo is None]
                    if len(groups) >= len(direct_failures):
                        break
                    await pilot.pause(0.05)
                seen["groups"] = sorted((group.room, group.origin_label, group.echo_count) for group in groups)
                tree = app.query_one("#failure-tree")
                seen["screen"] = "\n".join(tree.render_line(y).text for y in range(tree.size.height))
                app.paused = True
                await app.workers.wait_for_complete()

        asyncio.run(run())
    finally:
        collector.close()

    expected = sorted((g["room"], g["origin"]["rank"], g["echo_count"]) for g in direct_failures)  # type: ignore[index]
    assert seen["groups"] == expected
    assert "decode-0/TP1" in str(seen["screen"])
    assert collector.model.gaps == 0


def test_kvtop_relay_prints_its_addresses_reports_its_counters_and_stops_on_sigterm(cluster: LocalCluster):
    """`kvtop relay --status`: its addresses on stdout, counter lines on stderr, exit 0 soon after SIGTERM."""
    command = [kvtop_path(), "relay", "--bootstrap", cluster.endpoint, "--status", "--interval", "0.2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        assert first.startswith("kvtop relay: events at tcp://127.0.0.1:"), first
        address = first.rsplit("--relay ", 1)[1].rstrip(")\n")
        assert kvtop("ranks", "--relay", address, "--json").returncode == 0
        status = wait_for(lambda: "upstreams 4 agents" in (line := process.stderr.readline()) and line, 10.0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(5.0) == 0
        assert "snapshots" in status
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_an_agent_restart_through_the_relay_is_a_new_incarnation_not_a_gap(
    cluster: LocalCluster, relays: tuple[Relay, Relay]
):
    """A rank killed and started again reaches a view through two relays as a new incarnation: 0 gaps."""
    collector = Collector(relays[1].address).start()
    try:
        assert collector.wait_synced(5.0)
        label = "decode-0/TP1"
        before = collector.model.ranks[label].incarnation
        snapshots = collector._subscriber.counters["snapshots"]
        cluster.kill(label)
        cluster.restart(label)

        def restarted() -> bool:
            with collector.lock:
                view = collector.model.ranks.get(label)
                return view is not None and view.incarnation != before and view.last_seen > 0

        wait_for(restarted, 15.0, "the new incarnation heard through the relays")
        wait_for(lambda: collector._subscriber.counters["snapshots"] > snapshots, 5.0, "its snapshot relayed")
        with collector.lock:
            assert collector.model.gaps == 0
        assert dict(collector._subscriber.gaps) == {}
    finally:
        collector.close()


def kvtop_path() -> str:
    import shutil
    import sys

    return shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
