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
                if not usable(reply):
                    self._counters.reject("malformed")
                    continue
                self._routes[reply.instance] = sorted(reply.ranks, key=lambda agent: agent.rank)
            elif not isinstance(reply, Refusal):
                self._counters.reject("unexpected")

    def close(self) -> None:
        self.socket.close(linger=0)


def usable(route: Route) -> bool:
    """A route the engine can act on: ranks 0..tp-1 of the named instance, agreeing on tp, with real pages.

    An incomplete route (ranks still registering) is usable; `lookup` waits for the rest.
    """
    ranks = route.ranks
    if not ranks:
        return True
    tp = ranks[0].tp
    indices = [agent.rank for agent in ranks]
    return (
        all(agent.instance == route.instance and agent.tp == tp and agent.page_bytes > 0 for agent in ranks)
        and 0 < tp <= 1 << 16
        and len(set(indices)) == len(indices)
        and all(0 <= index < tp for index in indices)
    )
