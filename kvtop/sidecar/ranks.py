"""A server's ranks on the event plane: one `EventPublisher` per `instance/TPn` (`instance/PPn-TPn` of a server
with pipeline stages, `instance/DPn-TPn` of a DP replica).

A rank is published as our agents publish theirs (hello, heartbeats, batches
with sequence numbers, snapshots on request), under an `AgentInfo` of kind
`LOG_SIDECAR`: it has an event and a snapshot endpoint, no data plane (`transport.plane.registrar` keeps
it registered). With the cluster's CURVE keys, each rank's event and snapshot sockets serve CURVE (allowed
clients only).
"""

from __future__ import annotations

import os
import socket
import time

import msgspec
import zmq

from transport.curve import CurveKeys
from transport.plane.events import AgentHello, Event, Heartbeat, LogFollowed
from transport.plane.publisher import EventPublisher
from transport.registration import registration_problem
from transport.version import __version__
from transport.wire import LOG_SIDECAR, AgentInfo

BATCH_INTERVAL_S = 0.02
"""Events leave within two of these after the line was read (a log's event rate is low: its small batches wait
one more interval, the publisher's `batch_min`)."""


def sidecar_info(
    role: str, instance: str, rank: int, tp: int, incarnation: int, pp: int | None = None, dp: int | None = None
) -> AgentInfo:
    """The identity of one rank a sidecar publishes (endpoints filled in once bound; `pp`: its pipeline stage;
    `dp`: its DP replica)."""
    return AgentInfo(role, instance, rank, tp, 0, "", "", os.getpid(), socket.gethostname(), incarnation,
                     kind=LOG_SIDECAR, pp=pp, dp=dp)  # fmt: skip


def identity_problem(role: str, instance: str) -> str:
    """Why a role and instance cannot name a sidecar's ranks ("" when they can)."""
    return registration_problem(sidecar_info(role, instance, 0, 1, 1))


class RankPublisher:
    """One rank: its publisher (started, hello sent), the latest queue depths its batch lines gave."""

    def __init__(
        self, info: AgentInfo, host: str, context: zmq.Context[zmq.Socket[bytes]], curve: CurveKeys | None = None
    ) -> None:
        self.publisher = EventPublisher(info, host, context=context, batch_interval_s=BATCH_INTERVAL_S, curve=curve)
        self.batch: Heartbeat | None = None
        """The heartbeat its latest batch line stands for (queue depths as counters, rooms in flight)."""
        self.lines = 0
        """Events its server's lines gave it so far (its hello and heartbeats are the sidecar's own)."""
        self.publisher.start()
        self.emit(AgentHello(time.time(), self.info, __version__, self.publisher.endpoint,
                             self.publisher.snapshot_endpoint))  # fmt: skip

    @property
    def info(self) -> AgentInfo:
        return self.publisher.info

    def set_tp(self, tp: int) -> None:
        """The server turned out wider: the registration says so from now on."""
        if tp > self.info.tp:
            self.publisher.info = msgspec.structs.replace(self.info, tp=tp)

    def emit(self, event: Event) -> None:
        self.publisher.emit(event)

    def heartbeat(self, log: LogFollowed, cpu: float, rss: int, memory: float, registration: str = "") -> None:
        """`registration`: why the bootstrap service does not list this rank now ("" while it does)."""
        batch = self.batch
        counters = dict(batch.counters) if batch is not None else {}
        publisher = self.publisher
        self.emit(Heartbeat(time.time(), counters, batch.inflight_rooms if batch is not None else 0,
                            publisher.dropped, cpu, rss, memory, publisher.snapshot_endpoint,
                            publisher.counters.rejections(), log, registration))  # fmt: skip

    def close(self) -> None:
        self.publisher.close()
