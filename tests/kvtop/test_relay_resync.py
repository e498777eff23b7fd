"""A view through a relay that lost an agent's batches for a while converges to what a direct view holds.

A relay drops an agent when the bootstrap it follows stops listing it (the agent's registrations did not
reach it: a partition), and takes it back when it is listed again. The batches in between never reach the
views behind the relay: they count them as a gap, then ask the agent's snapshot again and end up with the
rooms, failures and transfers a collector subscribed to the agents directly holds, each counted once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.sources.live import Collector
from tests.conftest import wait_for
from transport import BootstrapClient, BootstrapServer, FaultSpec, KVPoll, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient
from transport.plane.relay import Relay

pytestmark = pytest.mark.processes

PARTITIONED = ("decode-0/TP0", "decode-1/TP0")
"""decode-0's rooms succeed; decode-1's fail (prefill-0 corrupts what it sends there)."""
TERMINAL = {int(KVPoll.Success), int(KVPoll.Failed)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        decode=2,
        num_pages=64,
        page_bytes=16384,
        transfer=TransferConfig(chunk_bytes=16384, timeouts=Timeouts(3, 3, 2), peer_timeout_s=2),
        faults={"prefill-0": (FaultSpec.parse("corrupt@decode-1"),)},
    )
    with LocalCluster(spec) as cluster:
        yield cluster


def run_rooms(cluster: LocalCluster, rooms: dict[int, str]) -> None:
    """Run each room (id -> decode instance) on prefill-0 and that instance, until both ranks have its result."""
    agents = {agent.instance: agent for agent in cluster.agents()}
    clients = {instance: ControlClient(agent.control_endpoint) for instance, agent in agents.items()}
    try:
        for room, decode in rooms.items():
            clients["prefill-0"].submit(room, 8)
            clients[decode].submit(room, 8, "prefill-0")
        for room, decode in rooms.items():
            for instance in ("prefill-0", decode):
                clients[instance].wait_result(room, 15)
    finally:
        for client in clients.values():
            client.close()


def held(collector: Collector) -> tuple[object, ...]:
    """What a view holds of the cluster: each room's state per rank, the failures, each rank's transfers."""
    with collector.lock:
        model: ClusterModel = collector.model
        rooms = {room.room: room.codes for room in model.rooms.values()}
        rooms |= {f.room: f.view.codes for f in model.finished.values() if f.view is not None}
        failures = sorted((f.room, f.rank, f.reason) for f in model.failures)
        transfers = {label: len(view.transfers) for label, view in model.ranks.items()}
        return rooms, failures, transfers


def ended(collector: Collector, rooms: set[int]) -> bool:
    """Each of `rooms` ended on both its ranks, in this view."""
    held_rooms = held(collector)[0]
    assert isinstance(held_rooms, dict)
    return all(len(held_rooms.get(room, {})) == 2 and set(held_rooms[room].values()) <= TERMINAL for room in rooms)


def test_a_view_through_a_relay_asks_again_for_what_a_partition_lost_and_holds_what_a_direct_view_holds(
    cluster: LocalCluster,
):
    """Two decode ranks unlisted for a while: the relayed view counts the gap, asks their snapshots again and
    ends with the same rooms, failures (each once) and transfers as the direct view."""
    listing = BootstrapServer(entry_ttl_s=3600.0).start()  # what the relay follows: the test lists and unlists
    with BootstrapClient(listing.endpoint) as client:
        for agent in cluster.agents():
            client.register(agent)
    relay = Relay(bootstrap=listing.endpoint, discover_every_s=0.1).start()
    direct, relayed = Collector(cluster.endpoint).start(), Collector(relay.address).start()
    try:
        assert direct.wait_synced(10.0) and relayed.wait_synced(10.0)
        run_rooms(cluster, {1: "decode-0", 2: "decode-1"})
        wait_for(lambda: ended(direct, {1, 2}) and held(relayed) == held(direct), 15.0, "both views hold rooms 1, 2")

        partitioned = [agent for agent in cluster.agents() if agent.label in PARTITIONED]
        with BootstrapClient(listing.endpoint) as client:
            for agent in partitioned:
                client.deregister(agent)
        wait_for(lambda: relay.snapshot()["upstream_agents"] == 1, 10.0, "the relay dropped the decode ranks")
        run_rooms(cluster, {3: "decode-0", 4: "decode-1", 5: "decode-0"})
        # published while the relay was cut off (an agent sends its batches a moment after the rooms end: listed
        # again too soon, the relay would have heard them and there would be nothing lost)
        wait_for(lambda: ended(direct, {3, 4, 5}), 15.0, "the direct view holds rooms 3, 4, 5")
        with BootstrapClient(listing.endpoint) as client:
            for agent in partitioned:
                client.register(agent)

        wait_for(lambda: held(relayed) == held(direct), 20.0, "the relayed view holds what the direct one does")
        _, failures, _ = held(relayed)
        assert len(failures) == len(set(failures)), "a failure the snapshot restated was counted twice"
        assert direct.model.gaps == 0
        assert relayed.model.gaps > 0, "the lost batches are counted, even though the snapshot made them up"
    finally:
        relayed.close()
        direct.close()
        relay.close()
        listing.close()
