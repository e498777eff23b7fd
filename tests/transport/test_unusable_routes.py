"""An engine survives routes it cannot use: a hostile bootstrap service's answers are counted, rooms fail.

The bootstrap here is a real ROUTER on loopback that registers anyone and
answers every Resolve with the route the test planted, however broken.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq

from transport import KVManager, KVPoll, KVPool, Role, Timeouts, TransferConfig
from transport.counters import Counters, rejection_names
from transport.sockets import bind_ephemeral, decode_routed
from transport.wire import AgentInfo, BootstrapRequest, FrameDecoder, Register, Registered, Resolve, Route, encode

CONFIG = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5, timeouts=Timeouts(0.5, 0.5, 0.5))
PAGES = np.arange(4, dtype=np.uint32)


class PlantedBootstrap:
    """Registers every agent and answers `Resolve(instance)` with `routes[instance]` (empty if absent)."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.routes: dict[str, list[AgentInfo]] = {}
        self._socket: zmq.Socket[bytes] = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.endpoint = bind_ephemeral(self._socket, "127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        counters = Counters(rejection_names())
        while not self._stop.is_set():
            if not self._socket.poll(10):
                continue
            routed = decode_routed(self._socket.recv_multipart(), decoder, counters)
            if routed is None:
                continue
            identity, request = routed
            if isinstance(request, Register):
                self._socket.send_multipart([identity, encode(Registered(request.req_id))])
            elif isinstance(request, Resolve):
                ranks = self.routes.get(request.instance, [])
                self._socket.send_multipart([identity, encode(Route(request.req_id, request.instance, ranks))])
        self._socket.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def planted(zmq_context) -> Iterator[tuple[PlantedBootstrap, Callable[..., KVManager]]]:
    """A planted bootstrap and a factory of started managers registered with it (closed, and checked alive)."""
    bootstrap = PlantedBootstrap(zmq_context)
    managers: list[KVManager] = []

    def make(role: Role, instance: str, *, rank: int = 0, tp: int = 1, config: TransferConfig = CONFIG) -> KVManager:
        manager = KVManager(
            role=role,
            instance=instance,
            rank=rank,
            tp=tp,
            pool=KVPool(16, 4096),
            bootstrap=bootstrap.endpoint,
            config=config,
        )
        managers.append(manager)
        return manager

    yield bootstrap, make
    dead = [m.info.label for m in managers if m.dead_thread() is not None]
    for manager in managers:
        manager.close()
    bootstrap.close()
    assert dead == [], f"threads died: {dead}"


def fake_rank(instance: str, rank: int, tp: int, endpoint: str, page_bytes: int = 4096) -> AgentInfo:
    """A registration of a rank that does not exist, reachable (or not) at `endpoint`."""
    return AgentInfo("prefill", instance, rank, tp, page_bytes, endpoint, "", os.getpid(), "test", 9, endpoint)


def test_a_prefill_rank_registered_at_an_unusable_endpoint_fails_the_room_and_is_counted(planted, wait_for):
    """Decode cannot connect to `not-an-endpoint`: the room fails as the prefill peer lost, counted malformed."""
    bootstrap, make = planted
    bootstrap.routes["prefill-0"] = [fake_rank("prefill-0", 0, 1, "not-an-endpoint")]
    decode = make(Role.DECODE, "decode-0").start()
    receiver = decode.receiver(0x3001, "prefill-0")
    receiver.init(PAGES)

    wait_for(lambda: receiver.poll() is KVPoll.Failed, what="the room fails")

    assert receiver.reason_class == "peer_lost"
    assert decode.counters()["rejected_malformed"] >= 1


@pytest.mark.parametrize(
    "ranks",
    [
        [fake_rank("prefill-0", 0, 2, "tcp://127.0.0.1:9"), fake_rank("prefill-0", 0, 2, "tcp://127.0.0.1:9")],
        [fake_rank("prefill-0", 5, 1, "tcp://127.0.0.1:9")],
        [fake_rank("prefill-0", 0, 1, "tcp://127.0.0.1:9", page_bytes=0)],
        [fake_rank("prefill-9", 0, 1, "tcp://127.0.0.1:9")],
    ],
    ids=["duplicate-rank", "rank-past-tp", "no-page-bytes", "other-instance"],
)
def test_a_route_that_cannot_describe_an_instance_is_rejected_and_the_room_times_out(planted, wait_for, ranks):
    """An inconsistent route is counted malformed and never used; the room ends in its bootstrap timeout."""
    bootstrap, make = planted
    bootstrap.routes["prefill-0"] = ranks
    decode = make(Role.DECODE, "decode-0").start()
    receiver = decode.receiver(0x3002, "prefill-0")
    receiver.init(PAGES)

    wait_for(lambda: receiver.poll() is KVPoll.Failed, what="the room times out")

    assert receiver.reason_class == "timeout_bootstrap"
    assert decode.counters()["rejected_malformed"] >= 1


def test_a_rank_of_the_instance_at_an_unusable_consensus_endpoint_is_counted_and_the_room_times_out(planted, wait_for):
    """prefill-0/TP1's consensus endpoint is `bogus`: counted once (consensus_rejected_malformed), and TP0's
    room fails after the vote timeout, waiting for every rank of prefill-0 to join."""
    bootstrap, make = planted
    patient = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5, timeouts=Timeouts(30, 30, 30))
    prefill = make(Role.PREFILL, "prefill-0", rank=0, tp=2, config=patient)
    bootstrap.routes["prefill-0"] = [prefill.info, fake_rank("prefill-0", 1, 2, "bogus")]
    prefill.start()
    sender = prefill.sender(0x3003)
    sender.send(PAGES)

    wait_for(lambda: sender.agreed() is KVPoll.Failed, what="the room fails")

    failure = sender.agreed_failure
    assert failure is not None
    assert "every rank of prefill-0 to join (1 of 2 reachable)" in failure.failure_reason
    assert ("timeout_consensus", prefill.info.label) == (sender.reason_class, failure.origin)
    assert prefill.counters()["consensus_rejected_malformed"] == 1
