"""One SGLang scheduler process as a kvtop rank: its identity, publisher, registration and heartbeats."""

from __future__ import annotations

import os
import random
import socket
import time

import psutil
import zmq

from transport.curve import CurveKeys
from transport.plane.events import AgentHello, Event, Heartbeat, PluginHooks
from transport.plane.publisher import EventPublisher
from transport.plane.registrar import Registrar
from transport.service import ServiceThread
from transport.version import __version__
from transport.wire import SGLANG_PLUGIN, AgentInfo

HEARTBEAT_S = 1.0
BATCH_INTERVAL_S = 0.02


class PluginRank(ServiceThread):
    """Publishes one SGLang rank's events (`emit` never blocks) and beats every `HEARTBEAT_S`."""

    def __init__(
        self,
        role: str,
        instance: str,
        rank: int,
        tp: int,
        bootstrap: str,
        hooks: PluginHooks,
        curve: CurveKeys | None = None,
        host: str = "127.0.0.1",
        dp: int | None = None,
        pp: int | None = None,
    ) -> None:
        """`dp`: the DP replica the scheduler is of (`replica_of`; None: of none); `pp`: its pipeline stage past the
        first (`stage_of`; None: the first)."""
        info = AgentInfo(role, instance, rank, tp, 0, "", "", os.getpid(), socket.gethostname(),
                         random.getrandbits(63), kind=SGLANG_PLUGIN, pp=pp, dp=dp)  # fmt: skip
        super().__init__(f"kvtop-{info.label.replace('/', '-')}")
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.publisher = EventPublisher(info, host, context=self._context, batch_interval_s=BATCH_INTERVAL_S,
                                        curve=curve).start()  # fmt: skip
        self.counters: dict[str, int] = {}
        """The plugin's own counts (hook calls that raised, by hook), sent in every heartbeat."""
        self.live: set[int] = set()
        """Rooms whose last published state is not terminal (the heartbeat's rooms in flight)."""
        publisher = self.publisher
        self.emit(AgentHello(time.time(), publisher.info, __version__, publisher.endpoint,
                             publisher.snapshot_endpoint, hooks))  # fmt: skip
        self._registrar = Registrar(bootstrap, lambda: [self.publisher.info], self._context, curve, "kvtop-register",
                                    log_problems=True)  # fmt: skip
        self._registrar.start()
        self._process = psutil.Process()

    @property
    def label(self) -> str:
        return self.publisher.info.label

    def emit(self, event: Event) -> None:
        self.publisher.emit(event)

    def close(self) -> None:
        super().close()
        self._registrar.close()
        self.publisher.close()
        self._context.destroy(linger=0)

    def _serve(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()

    def _beat(self) -> None:
        publisher = self.publisher
        self.emit(Heartbeat(time.time(), dict(self.counters), len(self.live), publisher.dropped,
                            self._process.cpu_percent(), self._process.memory_info().rss,
                            psutil.virtual_memory().percent, publisher.snapshot_endpoint,
                            publisher.counters.rejections(),
                            registration=self._registrar.problems.get(self.label, "")))  # fmt: skip
