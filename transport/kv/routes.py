"""The engine thread's DEALER to the bootstrap service: asynchronous lookups of instances, and refreshes."""

from __future__ import annotations

import itertools
import logging

import zmq

from transport.counters import Counters
from transport.curve import CurveKeys, dialing
from transport.registration import refused_as_taken, registration_problem
from transport.sockets import LIST_FRAME, decode_waiting, open_socket, send_now
from transport.wire import (
    AgentInfo,
    BootstrapReply,
    FrameDecoder,
    Refusal,
    Register,
    Registered,
    Resolve,
    Route,
    encode,
)

RESOLVE_RETRY_S = 0.25
_log = logging.getLogger(__name__)


class RouteBook:
    """Caches each instance's registered ranks; `lookup()` asks the bootstrap service when needed."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        bootstrap: str,
        counters: Counters,
        curve: CurveKeys | None = None,
    ) -> None:
        self.socket = open_socket(context, zmq.DEALER, LIST_FRAME, dialing(curve))
        self.socket.connect(bootstrap)
        self._bootstrap = bootstrap
        self._counters = counters
        self.refused = ""
        """The bootstrap's latest refusal of a refresh, `bootstrap ADDR refused: registration of NAME refused: why`
        as a sidecar's or plugin's registrar says it ("" while none was refused)."""
        self._routes: dict[str, list[AgentInfo]] = {}
        self._asked: dict[str, float] = {}
        self._req_ids = itertools.count(1)
        self._decoder: FrameDecoder[BootstrapReply] = FrameDecoder(BootstrapReply)

    def lookup(self, instance: str, now: float) -> list[AgentInfo] | None:
        """The instance's ranks 0 to `tp` - 1 (`whole`) once all registered; None (and a request on its way) before."""
        ranks = self._routes.get(instance)
        if ranks and (every := whole(ranks)) is not None:
            return every
        if now - self._asked.get(instance, -1e9) >= RESOLVE_RETRY_S:
            self._asked[instance] = now
            self._request(Resolve(next(self._req_ids), instance))
        return None

    def register(self, agent: AgentInfo) -> None:
        """Register again (the service expires entries that stop doing so); the reply needs no answer."""
        self._request(Register(next(self._req_ids), agent))

    def _request(self, request: Resolve | Register) -> None:
        """Sent now or counted (`send_failures`): lookups ask again, registrations refresh."""
        if not send_now(self.socket, encode(request)):
            self._counters.add("send_failures")

    def forget(self, instance: str) -> None:
        """Drop a cached route (a rank of it was lost or restarted)."""
        self._routes.pop(instance, None)

    def handle(self) -> None:
        """Read the bootstrap service's replies; a listed rank nobody can connect to, or of another TP size than the
        instance's rank 0, is counted (`invalid`) and left out, so the instance stays unresolved instead of the
        engine thread raising on connect or pairing with a stray rank."""
        for reply in decode_waiting(self.socket, self._decoder, self._counters):
            if isinstance(reply, Route):
                first = next((rank for rank in reply.ranks if rank.rank == 0), None)
                usable = [rank for rank in reply.ranks if not registration_problem(rank)
                          and (first is None or rank.tp == first.tp)]  # fmt: skip
                for _ in range(len(reply.ranks) - len(usable)):
                    self._counters.reject("invalid")
                self._routes[reply.instance] = usable
            elif isinstance(reply, Refusal):
                self._refused(reply.message)
            elif isinstance(reply, Registered):
                self.refused = ""
            else:
                self._counters.reject("unexpected")

    def _refused(self, message: str) -> None:
        """A refused refresh (another client holds this rank's entry): logged when the reason changes, and kept."""
        refused = f"bootstrap {self._bootstrap} refused: {message}"  # as `BootstrapClient` says it
        if refused != self.refused:
            unseen = "no peer finds this rank (new views hear it: listed as taken)"
            if not refused_as_taken(message):
                unseen = "no peer or new view finds this rank"
            _log.warning("cannot register, so %s: %s", unseen, refused)
        self.refused = refused

    def close(self) -> None:
        self.socket.close(linger=0)


def whole(ranks: list[AgentInfo]) -> list[AgentInfo] | None:
    """Ranks 0 to `tp` - 1 of the TP size rank 0 registered, in rank order; None while one is missing. Counting
    them was not enough: with rank 1 not yet registered, a stray rank 2 (of another size, or another process's)
    was taken as rank 1, and decode paired with it."""
    first = next((rank for rank in ranks if rank.rank == 0), None)
    if first is None:
        return None
    by_rank = {rank.rank: rank for rank in ranks if rank.tp == first.tp}
    if any(index not in by_rank for index in range(first.tp)):
        return None
    return [by_rank[index] for index in range(first.tp)]
