"""Shared fixtures: polling with a deadline, and real transport pieces that always get closed.

Every fixture that starts something (a bootstrap service, an engine thread, an
agent process, a socket) closes it at teardown, and checks on the way out that
nothing it started is still running or died behind the test's back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
import zmq

from transport import BootstrapServer, FaultInjector, KVManager, KVPool, Role, TransferConfig
from transport.cluster import ClusterSpec, LocalCluster
from transport.control import ControlClient

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
