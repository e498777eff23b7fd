"""Asynchronous lookups of instances in the bootstrap service, for the engine thread."""

from __future__ import annotations

import itertools

import zmq

from transport.counters import Counters
from transport.sockets import decode_waiting
from transport.wire import AgentInfo, BootstrapReply, FrameDecoder, Refusal, Resolve, Route, encode

RESOLVE_RETRY_S = 0.25


class RouteBook:
    """Caches each instance's registered ranks; `lookup()` asks the bootstrap service when needed."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], bootstrap: str, counters: Counters) -> None:
        self.socket: zmq.Socket[bytes] = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(bootstrap)
        self._counters = counters
        self._routes: dict[str, list[AgentInfo]] = {}
        self._asked: dict[str, float] = {}
        self._req_ids = itertools.count(1)
        self._decoder: FrameDecoder[BootstrapReply] = FrameDecoder(BootstrapReply)

    def lookup(self, instance: str, now: float) -> list[AgentInfo] | None:
        """The instance's ranks once all `tp` registered; None (and a request on its way) before."""
        ranks = self._routes.get(instance)
        if ranks and len(ranks) >= ranks[0].tp:
            return ranks
        if now - self._asked.get(instance, -1e9) >= RESOLVE_RETRY_S:
            self._asked[instance] = now
            self.socket.send(encode(Resolve(next(self._req_ids), instance)))
        return None

    def forget(self, instance: str) -> None:
        """Drop a cached route (a rank of it was lost or restarted)."""
        self._routes.pop(instance, None)

    def handle(self) -> None:
        """Read the bootstrap service's replies."""
        for reply in decode_waiting(self.socket, self._decoder, self._counters):
            if isinstance(reply, Route):
                self._routes[reply.instance] = reply.ranks
            elif not isinstance(reply, Refusal):
                self._counters.reject("unexpected")

    def close(self) -> None:
        self.socket.close(linger=0)
