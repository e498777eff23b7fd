"""CURVE on a live cluster: agents transfer, allowed views see everything, anyone else hears nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kvtop_cli import kvtop, kvtop_here

from transport import BootstrapClient, BootstrapError, FaultSpec, KVPoll, Timeouts, TransferConfig
from transport.curve import CurveKeys, generate
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient
from transport.plane.events import Heartbeat
from transport.plane.subscriber import EventSubscriber
from transport.wire import RoomResult


@dataclass
class CurveCluster:
    cluster: LocalCluster
    keys: str
    stranger: str
    """A client key folder that knows the server's public key but is not on the allow-list."""
    results: dict[int, RoomResult]


@pytest.fixture(scope="module")
def curve_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CurveCluster]:
    """A CURVE cluster (prefill TP2, two decode instances) that moved room 1 and failed room 2 (corrupted)."""
    root = tmp_path_factory.mktemp("curve")
    keys = generate(root / "keys").folder
    stranger = generate(root / "stranger").folder
    shutil.copyfile(keys / "server.key", stranger / "server.key")
    spec = ClusterSpec(
        decode=2,
        prefill_tp=2,
        num_pages=64,
        page_bytes=16384,
        transfer=TransferConfig(chunk_bytes=16384, timeouts=Timeouts(5, 5, 3), peer_timeout_s=3),
        faults={"prefill-0": (FaultSpec.parse("corrupt:1@decode-1"),)},
        curve_keys=str(keys),
    )
    cluster = LocalCluster(spec).start()
    curve = CurveKeys.load(keys, serve=False)
    clients = {a.label: ControlClient(a.control_endpoint, curve=curve) for a in cluster.agents()}
    try:
        for room, decode in ((1, "decode-0/TP0"), (2, "decode-1/TP0")):
            for label in ("prefill-0/TP0", "prefill-0/TP1"):
                clients[label].submit(room, 4)
            clients[decode].submit(room, 4, "prefill-0")
        results = {
            room: clients[decode].wait_result(room, 15) for room, decode in ((1, "decode-0/TP0"), (2, "decode-1/TP0"))
        }
        yield CurveCluster(cluster, str(keys), str(stranger), results)
    finally:
        for client in clients.values():
            client.close()
        cluster.stop()
    assert [p.label for p in cluster.processes if p.process.poll() is None] == []


@pytest.mark.processes
def test_agents_of_a_curve_cluster_transfer_and_agree(curve_cluster: CurveCluster) -> None:
    """With CURVE on every socket, a room moves (checksummed, both prefill ranks agreeing) and a corrupted one fails."""
    moved, corrupted = curve_cluster.results[1], curve_cluster.results[2]
    assert (KVPoll(moved.state), moved.nbytes) == (KVPoll.Success, 4 * 16384)
    assert (KVPoll(corrupted.state), corrupted.reason_class) == (KVPoll.Failed, "checksum")


@pytest.mark.processes
@pytest.mark.parametrize("who", ["no key", "key not on the allow-list"])
def test_unauthorised_subscriber_gets_no_event_and_no_snapshot(
    curve_cluster: CurveCluster, who: str, wait_for: Callable[..., object]
) -> None:
    """Without an allowed key a subscriber hears nothing, while an allowed one gets every snapshot and batches."""
    cluster = curve_cluster.cluster
    agents = cluster.agents()
    outsider_keys = CurveKeys.load(curve_cluster.stranger, serve=False) if who != "no key" else None
    allowed = EventSubscriber(curve=CurveKeys.load(curve_cluster.keys, serve=False))
    outsider = EventSubscriber(curve=outsider_keys)
    heard: list[object] = []
    try:
        for agent in agents:
            allowed.connect(agent)
            outsider.connect(agent)

        def allowed_heard_everyone() -> bool:
            allowed.poll(0.05)
            heard.extend(outsider.poll(0.0))
            return allowed.counters["snapshots"] == len(agents) and allowed.counters["batches"] >= len(agents)

        # a snapshot that missed its timeout on a loaded machine is asked again 5 s later: room for two asks
        wait_for(allowed_heard_everyone, 30.0, "the allowed subscriber's snapshots and batches")
        heard.extend(outsider.poll(0.1))
        assert (heard, outsider.counters["snapshots"], outsider.counters["batches"]) == ([], 0, 0)
        if outsider_keys is not None:  # a handshake ZAP refused is counted in the agents' heartbeats
            refusing: set[str] = set()

            def every_agent_counted_a_refusal() -> bool:
                for delivered in allowed.poll(0.05):
                    for event in getattr(delivered.item, "events", ()):
                        if isinstance(event, Heartbeat) and event.rejected.get("curve", {}).get("unauthorised"):
                            refusing.add(delivered.label)
                return len(refusing) == len(agents)

            wait_for(every_agent_counted_a_refusal, 5.0, "a counted refusal in every agent's heartbeat")
    finally:
        allowed.close()
        outsider.close()
    with pytest.raises(BootstrapError), BootstrapClient(cluster.endpoint, 0.5, curve=outsider_keys) as client:
        client.list_agents()


@pytest.mark.processes
def test_allowed_views_read_the_curve_cluster_and_others_are_told_why_not(curve_cluster: CurveCluster) -> None:
    """`kvtop status/failures --json --curve-keys` see the ranks, the room and the failure; without keys, exit 1."""
    endpoint, keys = curve_cluster.cluster.endpoint, curve_cluster.keys
    status = kvtop(
        "status", "--bootstrap", endpoint, "--curve-keys", keys, "--json", "--wait", "10", "--window", "3600"
    )
    failures = kvtop("failures", "--bootstrap", endpoint, "--json", "--wait", "10", env={"KVTOP_CURVE_KEYS": keys})
    refused = kvtop("status", "--bootstrap", endpoint, "--wait", "0.5")

    assert (status.returncode, failures.returncode) == (0, 0), status.stderr + failures.stderr
    status_json = json.loads(status.stdout)
    ranks = status_json["ranks"]
    assert (ranks["total"], ranks["gone"], status_json["rooms_finished"]) == (4, 0, 2)
    assert status_json["top_origins"] == [["decode-1/TP0 checksum", 1]]
    groups = json.loads(failures.stdout)["groups"]
    assert [(g["room"], g["origin"]["reason_class"], g["echo_count"]) for g in groups] == [(2, "checksum", 2)]
    assert refused.returncode == 1 and "--curve-keys" in refused.stderr


@pytest.mark.processes
def test_binding_beyond_loopback_without_keys_needs_insecure(tmp_path: Path) -> None:
    """`cluster up --host 0.0.0.0` and an agent's `--host 0.0.0.0` exit 2 with one line naming --insecure."""
    cluster = kvtop_here("cluster", "up", "--host", "0.0.0.0", "--duration", "1")
    agent = kvtop(  # the agent's entry point takes the process over (faulthandler on its stderr)
        "agent", "--role", "prefill", "--instance", "p", "--bootstrap", "tcp://127.0.0.1:9", "--host", "0.0.0.0"
    )

    assert (cluster.returncode, agent.returncode) == (2, 2)
    assert cluster.stderr.count("\n") == 1 and "--insecure" in cluster.stderr and "0.0.0.0" in cluster.stderr
    assert "--insecure" in agent.stderr.splitlines()[-1]


def test_a_bad_key_folder_is_a_one_line_usage_error(tmp_path: Path) -> None:
    """A view or a cluster given a key folder that is missing or open to others exits 2 at once, saying which."""
    keys = generate(tmp_path / "keys").folder
    keys.chmod(0o755)
    missing = kvtop_here("status", "--bootstrap", "tcp://127.0.0.1:9", "--curve-keys", str(tmp_path / "nope"))
    open_folder = kvtop_here("cluster", "up", "--curve-keys", str(keys), "--duration", "1")

    assert (missing.returncode, open_folder.returncode) == (2, 2)
    assert "does not exist" in missing.stderr and missing.stderr.count("\n") == 1
    assert "chmod 700" in open_folder.stderr and open_folder.stderr.count("\n") == 1


@pytest.mark.processes
def test_the_embedded_cluster_runs_with_curve(tmp_path: Path, wait_for: Callable[..., object]) -> None:
    """Bare `kvtop --curve-keys`'s embedded cluster: its workload and its collector reach CURVE agents."""
    from kvtop.cluster.embedded import EmbeddedCluster
    from kvtop.cluster.local import demo_spec
    from transport.harness.workload import WorkloadSpec

    keys = generate(tmp_path / "keys").folder
    spec = replace(demo_spec(1, 1, 1, {}, str(tmp_path / "logs")), curve_keys=str(keys))
    with EmbeddedCluster(spec, WorkloadSpec(rate=50, median_pages=4, max_pages=8)) as embedded:
        collector = embedded.collector
        assert collector is not None

        def rooms_seen_finished() -> bool:
            with collector.lock:
                return len(collector.model.ranks) == 2 and len(collector.model.finished) >= 3

        wait_for(rooms_seen_finished, 15.0, "the collector seeing three rooms finish")
        assert embedded.stats.succeeded >= 1
