"""The relay's ROUTER: snapshot requests passed through to the right agent, and the relay's listing.

The Clone pattern through a broker. A downstream DEALER (a view, a downstream relay) sends
`SnapshotRequest(req_id, agent=LABEL)`; the broker looks LABEL up in the relay's routing book and sends
`SnapshotRequest(own_id)` to the agent's snapshot ROUTER (or `SnapshotRequest(own_id, agent=LABEL)` to the
upstream relay that knows LABEL), over one DEALER per upstream snapshot endpoint; the `Snapshot` that comes
back is decoded (nothing malformed passes), given the requester's `req_id` back, and sent to the requester.
`ListAgents` is answered with an `AgentList`: this relay in `relays`, the agents it knows, and the relay's
counters (its traffic included: anyone who lists a relay reads its report).

Counted: `snapshot_requests`, `snapshots_passed`, `snapshots_unroutable` (no route for the label: the
requester's own timeout ends its wait), `snapshots_unanswered` (no reply within `PENDING_TIMEOUT_S`),
`snapshots_late` (a reply after that), rejected frames by reason.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq

from transport.counters import Counters
from transport.events import Snapshot, SnapshotRequest
from transport.sockets import LIST_FRAME, decode_routed, decode_waiting, open_socket
from transport.wire import AgentInfo, AgentList, FrameDecoder, ListAgents, encode

PENDING_TIMEOUT_S = 5.0
MAX_PENDING = 65_536
"""Requests in flight at most; one beyond is counted unroutable (a flood cannot grow the broker)."""
BROKER_COUNTERS = (
    "snapshot_requests",
    "snapshots_passed",
    "snapshots_unroutable",
    "snapshots_unanswered",
    "snapshots_late",
)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a label's snapshot is asked for: the agent's snapshot ROUTER, or an upstream relay's ROUTER."""

    endpoint: str
    via_relay: bool


@dataclass(frozen=True, slots=True)
class Book:
    """What the relay knows, replaced whole by its discovery thread (readers never see a half-built one)."""

    routes: dict[str, Route] = field(default_factory=dict)
    agents: list[AgentInfo] = field(default_factory=list)
    expired: list[AgentInfo] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Pending:
    requester: bytes
    req_id: int
    endpoint: str
    asked_at: float


class SnapshotBroker:
    """Owned by one thread: `serve_once()` in a loop, `close()` from that thread at the end."""

    def __init__(
        self,
        router: zmq.Socket[bytes],
        entry: Callable[[], AgentInfo],
        book: Callable[[], Book],
        counters: Counters,
        report: Callable[[], dict[str, int]],
    ) -> None:
        """`router`: bound; `entry`: this relay's listing entry; `book`: the current routing book; `counters`:
        where the broker counts; `report`: the relay's counters, for its listing."""
        self._router = router
        self._context = router.context
        self._entry = entry
        self._book = book
        self._counters = counters
        self._report = report
        self._dealers: dict[str, zmq.Socket[bytes]] = {}
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._requests: FrameDecoder[ListAgents | SnapshotRequest] = FrameDecoder(ListAgents | SnapshotRequest)
        self._snapshots: FrameDecoder[Snapshot] = FrameDecoder(Snapshot)

    @property
    def upstream_sockets(self) -> int:
        return len(self._dealers)

    def serve_once(self, timeout_ms: int) -> None:
        """Wait up to `timeout_ms` for a request or a reply, handle what is ready, expire old requests."""
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        for dealer in self._dealers.values():
            poller.register(dealer, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        if self._router in ready:
            for _ in range(1000):
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_request(frames)
        for dealer in [d for d in self._dealers.values() if d in ready]:
            for snapshot in decode_waiting(dealer, self._snapshots, self._counters):
                self._on_snapshot(snapshot)
        self._expire(time.monotonic())

    def close(self) -> None:
        for dealer in self._dealers.values():
            dealer.close(linger=0)
        self._dealers.clear()

    def _on_request(self, frames: list[bytes]) -> None:
        routed = decode_routed(frames, self._requests, self._counters)
        if routed is None:
            return
        requester, request = routed
        if isinstance(request, ListAgents):
            book = self._book()
            listing = AgentList(
                request.req_id, book.agents, self._report(), book.refused, book.expired, [self._entry()]
            )
            self._router.send_multipart([requester, encode(listing)])
            return
        self._counters.add("snapshot_requests")
        route = self._book().routes.get(request.agent)
        dealer = self._dealer(route.endpoint) if route is not None else None
        if route is None or dealer is None or len(self._pending) >= MAX_PENDING:
            self._counters.add("snapshots_unroutable")
            return
        own_id = next(self._ids)
        self._pending[own_id] = _Pending(requester, request.req_id, route.endpoint, time.monotonic())
        dealer.send(encode(SnapshotRequest(own_id, request.agent if route.via_relay else "")))

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        pending = self._pending.pop(snapshot.req_id, None)
        if pending is None:
            self._counters.add("snapshots_late")
            return
        reply = msgspec.structs.replace(snapshot, req_id=pending.req_id)
        self._router.send_multipart([pending.requester, encode(reply)])
        self._counters.add("snapshots_passed")

    def _dealer(self, endpoint: str) -> zmq.Socket[bytes] | None:
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            dealer = open_socket(self._context, zmq.DEALER, LIST_FRAME)
            try:
                dealer.connect(endpoint)
            except zmq.ZMQError:
                dealer.close(linger=0)
                return None
            self._dealers[endpoint] = dealer
        return dealer

    def _expire(self, now: float) -> None:
        for own_id in [i for i, p in self._pending.items() if now - p.asked_at > PENDING_TIMEOUT_S]:
            del self._pending[own_id]
            self._counters.add("snapshots_unanswered")
        routed = {route.endpoint for route in self._book().routes.values()}
        waiting = {pending.endpoint for pending in self._pending.values()}
        for endpoint in [e for e in self._dealers if e not in routed and e not in waiting]:
            self._dealers.pop(endpoint).close(linger=0)
