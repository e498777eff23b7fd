"""Shared fixtures: polling with a deadline, and real transport pieces that always get closed.

Every fixture that starts something (a bootstrap service, an engine thread, an
agent process, a socket, an event subscriber) closes it at teardown, and checks
on the way out that nothing it started is still running or died behind the
test's back. `subscribe` returns an `EventLog`: what an `EventSubscriber`
delivered, indexed by room and agent for assertions.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
import zmq

from transport import BootstrapServer, FaultInjector, KVManager, KVPoll, KVPool, Role, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient
from transport.plane.events import Event, EventBatch, Failure, Heartbeat, RoomState, Snapshot
from transport.plane.publisher import EventPublisher
from transport.plane.subscriber import AGENT_RCVHWM, Delivered, EventSubscriber
from transport.wire import AgentInfo

pytest_plugins = ["process_guard"]

T = TypeVar("T")

POLL_INTERVAL_S = 0.01


def wait_for(predicate: Callable[[], T], timeout: float = 5.0, what: str = "") -> T:
    """Poll `predicate` until it returns something truthy (returned) or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:.1f}s: {what or predicate}")
        time.sleep(POLL_INTERVAL_S)


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    """The `wait_for(predicate, timeout, what)` helper."""
    return wait_for


@pytest.fixture
def own_address() -> str:
    """A non-loopback IPv4 address of this machine, to register from as a remote client would (skips without one)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            address = str(probe.getsockname()[0])
    except OSError:
        address = ""
    if not address or ipaddress.ip_address(address).is_loopback:
        pytest.skip("this machine has no non-loopback IPv4 address to register from")
    return address


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    """A private ZeroMQ context for raw test sockets (terminated at teardown, so sockets must be closed)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def bootstrap() -> Iterator[BootstrapServer]:
    """A running bootstrap service on a loopback ephemeral port."""
    server = BootstrapServer(host="127.0.0.1").start()
    yield server
    server.close()


ManagerFactory = Callable[..., KVManager]


@pytest.fixture
def make_manager(bootstrap: BootstrapServer) -> Iterator[ManagerFactory]:
    """Start registered KV managers (one per rank); all are closed at teardown, and none may have crashed."""
    managers: list[KVManager] = []

    def make(
        role: Role,
        instance: str,
        *,
        rank: int = 0,
        tp: int = 1,
        num_pages: int = 128,
        page_bytes: int = 4096,
        config: TransferConfig | None = None,
        faults: FaultInjector | None = None,
    ) -> KVManager:
        manager = KVManager(
            role=role,
            instance=instance,
            rank=rank,
            tp=tp,
            pool=KVPool(num_pages, page_bytes),
            bootstrap=bootstrap.endpoint,
            config=config,
            faults=faults,
        )
        managers.append(manager)
        return manager.start()

    yield make
    crashed = [m.info.label for m in managers if not m._thread.is_alive() and not m._stop.is_set()]
    for manager in managers:
        manager.close()
    assert crashed == [], f"engine threads died during the test: {crashed}"


ClusterFactory = Callable[[ClusterSpec], LocalCluster]


@pytest.fixture
def make_cluster() -> Iterator[ClusterFactory]:
    """Start local clusters of agent processes; every process must have ended after teardown."""
    clusters: list[LocalCluster] = []

    def make(spec: ClusterSpec) -> LocalCluster:
        cluster = LocalCluster(spec)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.stop()
    alive = [p.label for c in clusters for p in c.processes if p.process.poll() is None]
    assert alive == [], f"agent processes outlived their cluster: {alive}"


@pytest.fixture
def control() -> Iterator[Callable[[str], ControlClient]]:
    """Open control clients to agents' control endpoints (closed at teardown)."""
    clients: list[ControlClient] = []

    def connect(endpoint: str) -> ControlClient:
        client = ControlClient(endpoint)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def shuffled_pages(pool: KVPool, count: int, seed: int) -> np.ndarray:
    """`count` pages of `pool` in an order with short consecutive runs and jumps (multi-frame chunks)."""
    rng = np.random.default_rng(seed)
    blocks = np.arange(pool.num_pages, dtype=np.uint32).reshape(-1, 4)
    order = rng.permutation(len(blocks))
    runs = [blocks[i][: rng.integers(1, 5)] for i in order]
    pages = np.concatenate(runs)[:count]
    assert len(pages) == count, "pool too small for the requested shuffled page list"
    return pages


@pytest.fixture(name="shuffled_pages")
def shuffled_pages_fixture() -> Callable[[KVPool, int, int], np.ndarray]:
    """The `shuffled_pages(pool, count, seed)` helper."""
    return shuffled_pages


def delivered_events(item: Snapshot | EventBatch) -> list[Event]:
    """A batch's events, or what a snapshot stands for as events (finished rooms before live ones)."""
    if isinstance(item, EventBatch):
        return item.events
    head: list[Event] = [event for event in (item.hello, item.heartbeat) if event is not None]
    return [*head, *item.finished_rooms, *item.live_rooms, *item.failures]


class EventLog:
    """Everything one `EventSubscriber` delivered, in order, indexed the way the tests ask.

    A snapshot counts as the events it holds, so a subscriber that joined late
    sees the same failures and room states as one that was there from the start.
    """

    def __init__(self, subscriber: EventSubscriber) -> None:
        self.subscriber = subscriber
        self.deliveries: list[Delivered] = []
        self._failures: dict[int, list[Failure]] = defaultdict(list)
        self._room_states: dict[str, dict[int, list[RoomState]]] = defaultdict(lambda: defaultdict(list))
        self._heartbeats: dict[str, Heartbeat] = {}

    def connect(self, agents: Iterable[AgentInfo]) -> EventLog:
        for agent in agents:
            self.subscriber.connect(agent)
        return self

    def pump(self, timeout_s: float = POLL_INTERVAL_S) -> list[Delivered]:
        """Take what the subscriber has ready (waiting up to `timeout_s` for the first delivery)."""
        delivered = self.subscriber.poll(timeout_s)
        for item in delivered:
            self.deliveries.append(item)
            for event in delivered_events(item.item):
                if isinstance(event, Failure):
                    self._failures[event.room].append(event)
                elif isinstance(event, RoomState):
                    self._room_states[item.label][event.room].append(event)
                elif isinstance(event, Heartbeat):
                    self._heartbeats[item.label] = event
        return delivered

    def wait(self, predicate: Callable[[], T], timeout: float = 5.0, what: str = "") -> T:
        """`wait_for(predicate)`, pumping deliveries in between."""

        def pumped() -> T:
            self.pump()
            return predicate()

        return wait_for(pumped, timeout, what)

    def wait_synced(self, labels: Iterable[str], timeout: float = 5.0) -> None:
        """Wait until each agent's snapshot arrived: from then on every event comes in a batch (about 1 s)."""
        pending = set(labels)
        self.wait(lambda: all(self.snapshots(label) for label in pending), timeout, f"snapshots of {sorted(pending)}")

    def wait_flushed(self, labels: Iterable[str], timeout: float = 5.0) -> None:
        """Wait for a heartbeat each agent sent after now: every event it queued before was delivered by then."""
        since = time.time()
        pending = set(labels)
        self.wait(
            lambda: all(label in self._heartbeats and self._heartbeats[label].ts > since for label in pending),
            timeout,
            f"a fresh heartbeat from each of {sorted(pending)}",
        )

    def failures(self, room: int) -> list[Failure]:
        """Every Failure event of `room`, from any agent, in delivery order."""
        return list(self._failures.get(room, []))

    def room_states(self, label: str) -> dict[int, int]:
        """The latest state of every room `label` published."""
        return {room: changes[-1].state for room, changes in self._room_states.get(label, {}).items()}

    def failed_in(self, label: str, room: int) -> KVPoll | None:
        """The state `room` was in when it failed on `label` (None if it never failed there)."""
        changes = self._room_states.get(label, {}).get(room, [])
        failed = [KVPoll(change.previous) for change in changes if change.state == KVPoll.Failed]
        return failed[-1] if failed else None

    def events(self, label: str | None = None) -> Iterator[tuple[str, Event]]:
        """(agent label, event) of everything delivered (for `label` only, if given), in order."""
        for delivered in self.deliveries:
            if label is not None and delivered.label != label:
                continue
            for event in delivered_events(delivered.item):
                yield delivered.label, event

    def heartbeat(self, label: str) -> Heartbeat | None:
        """The latest heartbeat `label` published."""
        return self._heartbeats.get(label)

    def deliveries_of(self, label: str) -> list[Snapshot | EventBatch]:
        """What was delivered for `label`, snapshots and batches, in order."""
        return [d.item for d in self.deliveries if d.label == label]

    def batches(self, label: str) -> list[EventBatch]:
        return [d.item for d in self.deliveries if d.label == label and isinstance(d.item, EventBatch)]

    def snapshots(self, label: str) -> list[Snapshot]:
        return [d.item for d in self.deliveries if d.label == label and isinstance(d.item, Snapshot)]

    def holes(self, label: str) -> list[tuple[int, int]]:
        """(seq before, seq after) wherever a batch of `label` does not follow the delivery before it (a batch
        follows a snapshot of seq S when its seq is S + 1): [] when what was delivered misses nothing."""
        holes, last = [], None
        for item in self.deliveries_of(label):
            if isinstance(item, EventBatch) and last is not None and item.seq != last + 1:
                holes.append((last, item.seq))
            last = item.seq
        return holes


EventLogFactory = Callable[..., EventLog]


@pytest.fixture
def make_publisher(zmq_context) -> Iterator[Callable[..., EventPublisher]]:
    """Start bare event publishers for a made-up agent `prefill-0/TP0` (closed at teardown)."""
    publishers: list[EventPublisher] = []

    def make(**options: object) -> EventPublisher:
        info = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "", "", os.getpid(), "test", 1)
        publisher = EventPublisher(info, context=zmq_context, **options)
        publishers.append(publisher)
        return publisher.start()

    yield make
    for publisher in publishers:
        publisher.close()


@pytest.fixture
def subscribe(zmq_context: zmq.Context[zmq.Socket[bytes]]) -> Iterator[EventLogFactory]:
    """`subscribe(agents, rcvhwm=...)`: an EventLog over a fresh EventSubscriber (closed at teardown)."""
    logs: list[EventLog] = []

    def make(agents: Iterable[AgentInfo] = (), rcvhwm: int = AGENT_RCVHWM) -> EventLog:
        log = EventLog(EventSubscriber(zmq_context, rcvhwm=rcvhwm))
        logs.append(log)
        return log.connect(agents)

    yield make
    for log in logs:
        log.subscriber.close()
