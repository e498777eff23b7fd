"""The relay's ROUTER: snapshot requests passed through to the right agent, and the relay's listing.

The Clone pattern through a broker. A downstream DEALER (a view, a downstream relay) sends
`SnapshotRequest(req_id, agent=LABEL)`; the broker looks LABEL up in the relay's routing book and sends the
same `req_id` on to the agent's snapshot ROUTER (or, with `agent=LABEL`, to the upstream relay that knows
LABEL), over a DEALER per upstream snapshot endpoint, open while a request waits on it. The `Snapshot`
frame that comes back goes to the requester untouched, as event batches do: the broker reads its head
(`req_id`) only, and the requester, which checks everything it decodes, is the border post. Subscribers
draw their request ids at random (subscriber.py), so ids of different requesters do not meet; if two did,
each would also get the other's snapshot and drop it (its incarnation is not the one asked for).

`ListAgents` is answered with an `AgentList`: this relay in `relays`, the agents it knows, the relay's
counters (its traffic included: anyone who lists a relay reads its report), and its upstreams that did not
answer its latest discovery round with the agents it keeps from their last answer.

Counted: `snapshot_requests`, `snapshots_passed`, `snapshots_unroutable` (no route for the label: the
requester's own timeout ends its wait), `snapshots_unanswered` (no reply within `PENDING_TIMEOUT_S`),
`snapshots_late` (a reply after that), rejected frames by reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq

from transport.counters import Counters
from transport.curve import CurveSide
from transport.errors import FrameRejected
from transport.plane.events import SnapshotRequest
from transport.sockets import LIST_FRAME, decode_routed, open_socket, send_now
from transport.wire import LISTED_BY_RELAY, AgentInfo, AgentList, FrameDecoder, ListAgents, RefusedNote, encode

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


class _SnapshotHead(msgspec.Struct, tag="snapshot", array_like=True):
    """The first field of a `Snapshot` frame (msgspec skips the rest of the array)."""

    req_id: int


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
    upstream_errors: list[str] = field(default_factory=list)
    """Upstreams that did not answer the latest round (`AgentList.upstream_errors`)."""
    kept: list[str] = field(default_factory=list)
    """Agents listed from the last answer of an upstream that did not answer (`AgentList.kept`)."""
    refusals: list[RefusedNote] = field(default_factory=list)
    """The registrations the upstream bootstrap (and relays) refused, with their role and age as listed."""
    listed_at: float = 0.0
    """When the round that made this book listed its upstreams (monotonic): the refusals' ages grow from it."""
    taken: list[AgentInfo] = field(default_factory=list)
    """The ranks its upstreams list as taken (`AgentList.taken`), subscribed to and listed so (each
    routed by its `taken_label`: its label routes to the taker's entry)."""


@dataclass(slots=True)
class _Pending:
    requesters: list[bytes]
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
        dial: CurveSide | None = None,
    ) -> None:
        """`router`: bound; `entry`: this relay's listing entry; `book`: the current routing book; `counters`:
        where the broker counts; `report`: the relay's counters, for its listing; `dial`: the CURVE side of the
        DEALERs it opens upstream (None: plain TCP)."""
        self._router = router
        self._context = router.context
        self._entry = entry
        self._book = book
        self._counters = counters
        self._report = report
        self._dial = dial
        self._dealers: dict[str, zmq.Socket[bytes]] = {}
        self._pending: dict[tuple[str, int], _Pending] = {}
        """(upstream endpoint, req_id) -> who waits for that snapshot."""
        self._waiting: dict[str, int] = {}
        """Requests in flight per upstream endpoint (its DEALER closes at 0)."""
        self._next_expiry = 0.0
        self._requests: FrameDecoder[ListAgents | SnapshotRequest] = FrameDecoder(ListAgents | SnapshotRequest)
        self._heads: FrameDecoder[_SnapshotHead] = FrameDecoder(_SnapshotHead)

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
        for endpoint, dealer in [(e, d) for e, d in self._dealers.items() if d in ready]:
            self._on_replies(endpoint, dealer)
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
            since = max(0.0, time.monotonic() - book.listed_at)
            refusals = [msgspec.structs.replace(note, age_s=min(note.age_s + since, 1e9)) for note in book.refusals]
            listing = AgentList(
                request.req_id, book.agents, self._report(), book.refused, book.expired, [self._entry()],
                book.upstream_errors, book.kept, LISTED_BY_RELAY, refusals=refusals, taken=book.taken,
            )  # fmt: skip
            self._router.send_multipart([requester, encode(listing)])
            return
        self._counters.add("snapshot_requests")
        route = self._book().routes.get(request.agent)
        key = (route.endpoint if route is not None else "", request.req_id)
        if key in self._pending:  # the same request again (or another requester's with the same id)
            self._pending[key].requesters.append(requester)
            return
        full = len(self._pending) >= MAX_PENDING
        dealer = self._dealer(route.endpoint) if route is not None and not full else None
        if route is None or dealer is None:
            self._counters.add("snapshots_unroutable")
            return
        if not send_now(dealer, encode(SnapshotRequest(request.req_id, request.agent if route.via_relay else ""))):
            self._counters.add("snapshots_unroutable")  # its connection refused (a CURVE key): none to wait on
            return
        self._pending[key] = _Pending([requester], time.monotonic())
        self._waiting[route.endpoint] = self._waiting.get(route.endpoint, 0) + 1

    def _on_replies(self, endpoint: str, dealer: zmq.Socket[bytes]) -> None:
        frames: list[bytes] = []
        for _ in range(1000):
            try:
                frames.append(dealer.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        for frame in frames:  # read whole first: the last reply closes the DEALER
            try:
                head = self._heads.decode(frame)
            except FrameRejected as rejected:
                self._counters.reject(rejected.reason)
                continue
            pending = self._forget((endpoint, head.req_id))
            if pending is None:
                self._counters.add("snapshots_late")
                continue
            for requester in pending.requesters:
                self._router.send_multipart([requester, frame], copy=False)
            self._counters.add("snapshots_passed", len(pending.requesters))

    def _dealer(self, endpoint: str) -> zmq.Socket[bytes] | None:
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            dealer = open_socket(self._context, zmq.DEALER, LIST_FRAME, self._dial)
            try:
                dealer.connect(endpoint)
            except zmq.ZMQError:
                dealer.close(linger=0)
                return None
            self._dealers[endpoint] = dealer
        return dealer

    def _expire(self, now: float) -> None:
        if now < self._next_expiry:
            return
        self._next_expiry = now + 0.5
        for key in [key for key, pending in self._pending.items() if now - pending.asked_at > PENDING_TIMEOUT_S]:
            self._forget(key)
            self._counters.add("snapshots_unanswered")

    def _forget(self, key: tuple[str, int]) -> _Pending | None:
        """Drop a request in flight; its DEALER closes when no other request waits on it (a snapshot is asked
        once per agent incarnation: the broker holds sockets only for requests in flight)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            endpoint = key[0]
            waiting = self._waiting[endpoint] = self._waiting[endpoint] - 1
            if waiting <= 0:
                del self._waiting[endpoint]
                self._dealers.pop(endpoint).close(linger=0)
        return pending
