"""The bootstrap service: where agents register and find each other.

One address lists every agent of the cluster, so one address is enough for
kvtop to discover it. Agents register their `AgentInfo` (a newer incarnation
of the same instance rank replaces the older one); decode ranks resolve a
prefill instance to its ranks; anyone may list all agents.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import TypeVar

import zmq

from transport.counters import Counters, rejection_names
from transport.errors import BootstrapError, FrameRejected
from transport.sockets import bind, decode_routed
from transport.wire import (
    AgentInfo,
    AgentList,
    BootstrapReply,
    BootstrapRequest,
    FrameDecoder,
    ListAgents,
    Refusal,
    Register,
    Registered,
    Resolve,
    Route,
    encode,
)

_POLL_MS = 100
_R = TypeVar("_R", Registered, Route, AgentList)


class BootstrapServer:
    """A ROUTER socket served by one thread until `close()`."""

    def __init__(
        self, endpoint: str = "", host: str = "127.0.0.1", context: zmq.Context[zmq.Socket[bytes]] | None = None
    ) -> None:
        self._context = context or zmq.Context.instance()
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.endpoint = bind(self._socket, endpoint, host)
        self.counters = Counters(("requests", *rejection_names()))
        self._agents: dict[tuple[str, int], AgentInfo] = {}
        self._decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="bootstrap", daemon=True)

    def start(self) -> BootstrapServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the socket (returns within one poll interval)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._socket.close(linger=0)

    def agents(self) -> list[AgentInfo]:
        """Every registered agent (a copy)."""
        return list(self._agents.values())

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if self._socket.poll(_POLL_MS):
                    self._handle(self._socket.recv_multipart())
        finally:
            self._socket.close(linger=0)

    def _handle(self, frames: list[bytes]) -> None:
        routed = decode_routed(frames, self._decoder, self.counters)
        if routed is None:
            return
        identity, request = routed
        self.counters.add("requests")
        self._socket.send_multipart([identity, encode(self._answer(request))])

    def _answer(self, request: BootstrapRequest) -> BootstrapReply:
        if isinstance(request, Register):
            agent = request.agent
            self._agents[(agent.instance, agent.rank)] = agent
            return Registered(request.req_id)
        if isinstance(request, Resolve):
            ranks = sorted((a for a in self._agents.values() if a.instance == request.instance), key=lambda a: a.rank)
            return Route(request.req_id, request.instance, ranks)
        return AgentList(request.req_id, self.agents())


class BootstrapClient:
    """Blocking request/reply to a bootstrap service, with a deadline per call."""

    def __init__(
        self, endpoint: str, timeout_s: float = 5.0, context: zmq.Context[zmq.Socket[bytes]] | None = None
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._socket: zmq.Socket[bytes] = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.linger = 0
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as error:
            self._socket.close(linger=0)
            raise BootstrapError(
                f"bad bootstrap address {endpoint!r} ({error.strerror}); expected tcp://HOST:PORT"
            ) from None
        self._ids = itertools.count(1)
        self._decoder: FrameDecoder[BootstrapReply] = FrameDecoder(BootstrapReply)

    def close(self) -> None:
        self._socket.close(linger=0)

    def __enter__(self) -> BootstrapClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def register(self, agent: AgentInfo) -> None:
        self._call(Register(next(self._ids), agent), Registered)

    def resolve(self, instance: str) -> list[AgentInfo]:
        return self._call(Resolve(next(self._ids), instance), Route).ranks

    def list_agents(self) -> list[AgentInfo]:
        return self._call(ListAgents(next(self._ids)), AgentList).agents

    def _call(self, request: Register | Resolve | ListAgents, expected: type[_R]) -> _R:
        self._socket.send(encode(request))
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self._socket.poll(int(left * 1000) + 1):
                break
            try:
                reply = self._decoder.decode(self._socket.recv())
            except FrameRejected as rejected:
                raise BootstrapError(f"bootstrap {self.endpoint} sent a bad reply: {rejected}") from None
            if isinstance(reply, Refusal):
                raise BootstrapError(f"bootstrap {self.endpoint} refused: {reply.message}")
            if reply.req_id == request.req_id and isinstance(reply, expected):
                return reply
        raise BootstrapError(f"bootstrap {self.endpoint} did not answer within {self.timeout_s:.1f}s")
