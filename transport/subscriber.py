"""A reusable subscriber to agents' events: join late, start from a snapshot, count gaps.

For each agent incarnation the subscriber asks for a snapshot when it first
hears from it, holds that agent's batches until the snapshot arrives, then
delivers the snapshot followed by every batch with a larger seq, in order
(ZeroMQ guide's Clone pattern). After that, a seq that jumps counts the
missing batches as a gap; a new incarnation (the agent restarted) starts over
and is never counted as a gap.

Nothing an agent registers or sends can raise out of `connect()` or `poll()`:
an entry, endpoint or heartbeat-named snapshot endpoint that cannot be
connected to is counted (`bad_entries`, once per name and reason) and named
in `refused`; every undecodable frame is counted under `rejected_<reason>`.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import zmq

from transport.counters import Counters, rejection_names
from transport.events import EventBatch, Heartbeat, Snapshot, SnapshotRequest
from transport.registration import agent_problem, endpoint_problem, entry_name
from transport.sockets import LIST_FRAME, decode_waiting, decode_waiting_frames, open_socket
from transport.wire import AgentInfo, FrameDecoder, encode

SNAPSHOT_TIMEOUT_S = 2.0
REFUSED_KEPT = 64
"""Unusable entries named at most (the oldest name goes first); `bad_entries` counts them all."""


@dataclass(eq=False)
class _Stream:
    """One agent incarnation as seen by this subscriber."""

    incarnation: int
    snapshot_socket: zmq.Socket[bytes] | None
    requested_at: float
    req_id: int
    last_seq: int = 0
    synced: bool = False
    held: list[tuple[EventBatch, bytes]] = field(default_factory=list)


Delivery = Snapshot | EventBatch


@dataclass(frozen=True, slots=True)
class Delivered:
    """One item for the consumer: an agent's snapshot, or a batch to apply after it."""

    label: str
    item: Delivery
    frame: bytes = b""
    """The frame a batch came in (wire version byte + msgpack), as it came: a recorder writes it without
    encoding it again ("" for a snapshot)."""


class EventSubscriber:
    """Owns one SUB socket for discovered agents, one per endpoint given alone, and one snapshot DEALER per
    agent; `poll()` returns what is ready, in order."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]] | None = None, rcvhwm: int = 100_000) -> None:
        self._context = context or zmq.Context.instance()
        self.socket = open_socket(self._context, zmq.SUB, LIST_FRAME)
        self.socket.rcvhwm = rcvhwm
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._rcvhwm = rcvhwm
        self.agents: dict[str, AgentInfo] = {}
        self._streams: dict[str, _Stream] = {}
        self._snapshot_sockets: dict[str, zmq.Socket[bytes]] = {}
        self._snapshot_endpoints: dict[str, str] = {}
        self._endpoints: dict[str, zmq.Socket[bytes]] = {}
        """A SUB socket per endpoint given alone: what arrives on it tells which endpoint answered."""
        self.answered: dict[str, str] = {}
        """Endpoint given alone -> label of the agent heard there (absent while it never answered)."""
        self._req_ids = itertools.count(1)
        self.gaps: Counter[tuple[str, int]] = Counter()
        """Missing batches per (agent label, incarnation)."""
        self.gap_runs: deque[tuple[str, int, int]] = deque(maxlen=10_000)
        """Each gap as it was found, (label, incarnation, missing batches), for a consumer to take."""
        self.counters = Counters(("batches", "snapshots", "snapshots_missed", "stale_batches", *rejection_names()))
        self.counters = Counters(
            ("batches", "snapshots", "snapshots_missed", "stale_batches", "bad_entries", *rejection_names())
        )
        self.refused: dict[str, str] = {}
        """Entries and endpoints this subscriber could not use: name -> why."""
        self._batch_decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
        self._snapshot_decoder: FrameDecoder[Snapshot] = FrameDecoder(Snapshot)

    def connect(self, agent: AgentInfo) -> str:
        """Subscribe to an agent's events (again, at its new endpoints, when it restarted).

        Returns why the entry cannot be used ("" when it can); such an entry is counted and named, once.
        """
        problem = agent_problem(agent)
        if problem:
            self._refuse(entry_name(agent), problem)
            return problem
        known = self.agents.get(agent.label)
        if known == agent or not agent.event_endpoint:
            return ""
        if known is not None and known.event_endpoint:
            self.socket.disconnect(known.event_endpoint)
            self._close_snapshot_socket(agent.label)
        try:
            self.socket.connect(agent.event_endpoint)
        except zmq.ZMQError as error:
            self._refuse(agent.label, f"event endpoint {agent.event_endpoint!r}: {error.strerror}")
            return error.strerror
        self.refused.pop(agent.label, None)
        self.agents[agent.label] = agent
        self._streams[agent.label] = self._start_stream(agent.label, agent.incarnation)
        return ""

    def connect_endpoint(self, endpoint: str) -> str:
        """Subscribe to an agent known only by its event endpoint, on a SUB socket of its own (what arrives
        there tells which endpoint answered); its heartbeat names its snapshot socket.

        Returns why the endpoint cannot be used ("" when it can).
        """
        if endpoint in self._endpoints:
            return ""
        problem = endpoint_problem(endpoint)
        sock: zmq.Socket[bytes] | None = None
        if not problem:
            sock = open_socket(self._context, zmq.SUB, LIST_FRAME)
            sock.rcvhwm = self._rcvhwm
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as error:
                problem = error.strerror
                sock.close()
        if problem or sock is None:
            self._refuse(endpoint, problem)
            return problem
        self._endpoints[endpoint] = sock
        return ""

    def _refuse(self, name: str, problem: str) -> None:
        if self.refused.get(name) != problem:
            self.counters.add("bad_entries")
            self.refused.pop(name, None)
            self.refused[name] = problem
            if len(self.refused) > REFUSED_KEPT:
                del self.refused[next(iter(self.refused))]

    def synced(self) -> bool:
        """True once every connected agent's snapshot arrived (or its request timed out)."""
        expected = len(self.agents) + len(self._endpoints)
        return len(self._streams) >= expected and all(stream.synced for stream in self._streams.values())

    def close(self) -> None:
        self.socket.close(linger=0)
        for sock in self._endpoints.values():
            sock.close(linger=0)
        for label in list(self._snapshot_sockets):
            self._close_snapshot_socket(label)

    def poll(self, timeout_s: float) -> list[Delivered]:
        """Deliveries ready now, after waiting up to `timeout_s` for the first input."""
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        for sock in [*self._endpoints.values(), *self._snapshot_sockets.values()]:
            poller.register(sock, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout_s * 1000)))
        out: list[Delivered] = []
        if self.socket in ready:
            self._read_batches(self.socket, out)
        for endpoint, sock in self._endpoints.items():
            if sock in ready:
                self._read_batches(sock, out, endpoint)
        for label, sock in list(self._snapshot_sockets.items()):
            if sock in ready:
                self._read_snapshot(label, sock, out)
        self._expire_snapshot_requests(out)
        return out

    def _read_batches(self, sock: zmq.Socket[bytes], out: list[Delivered], endpoint: str = "") -> None:
        for frame, batch in decode_waiting_frames(sock, self._batch_decoder, self.counters, limit=10_000):
            self.counters.add("batches")
            if endpoint:
                self.answered[endpoint] = batch.label
            self._on_batch(batch, out, frame)

    def _on_batch(self, batch: EventBatch, out: list[Delivered], frame: bytes = b"") -> None:
        label = batch.label
        stream = self._streams.get(label)
        if stream is None or stream.incarnation != batch.incarnation:
            stream = self._streams[label] = self._start_stream(label, batch.incarnation)
        if not stream.synced:
            stream.held.append((batch, frame))
            if stream.snapshot_socket is None:
                self._ask_when_known(label, stream, batch)
            return
        self._deliver(label, stream, batch, out, frame)

    def _ask_when_known(self, label: str, stream: _Stream, batch: EventBatch) -> None:
        """An agent met through its event endpoint: request its snapshot once a heartbeat names the socket."""
        endpoint = next((e.snapshot_endpoint for e in batch.events if isinstance(e, Heartbeat)), "")
        problem = endpoint_problem(endpoint) if endpoint else ""
        if problem:
            self._refuse(label, f"snapshot endpoint: {problem}")
            return
        if endpoint:
            self._snapshot_endpoints[label] = endpoint
            stream.snapshot_socket = self._snapshot_socket(label)
            if stream.snapshot_socket is not None:
                stream.snapshot_socket.send(encode(SnapshotRequest(stream.req_id)))

    def _deliver(
        self, label: str, stream: _Stream, batch: EventBatch, out: list[Delivered], frame: bytes = b""
    ) -> None:
        if batch.seq <= stream.last_seq:
            self.counters.add("stale_batches")
            return
        if stream.last_seq and batch.seq != stream.last_seq + 1:
            missing = batch.seq - stream.last_seq - 1
            self.gaps[(label, stream.incarnation)] += missing
            self.gap_runs.append((label, stream.incarnation, missing))
        stream.last_seq = batch.seq
        out.append(Delivered(label, batch, frame))

    def _start_stream(self, label: str, incarnation: int) -> _Stream:
        sock = self._snapshot_socket(label)
        req_id = next(self._req_ids)
        if sock is not None:
            sock.send(encode(SnapshotRequest(req_id)))
        return _Stream(incarnation, sock, time.monotonic(), req_id)

    def _snapshot_socket(self, label: str) -> zmq.Socket[bytes] | None:
        agent = self.agents.get(label)
        endpoint = agent.snapshot_endpoint if agent is not None else self._snapshot_endpoints.get(label, "")
        if not endpoint:
            return None
        sock = self._snapshot_sockets.get(label)
        if sock is None:
            sock = open_socket(self._context, zmq.DEALER, LIST_FRAME)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as error:
                sock.close(linger=0)
                self._refuse(label, f"snapshot endpoint {endpoint!r}: {error.strerror}")
                return None
            self._snapshot_sockets[label] = sock
        return sock

    def _read_snapshot(self, label: str, sock: zmq.Socket[bytes], out: list[Delivered]) -> None:
        for snapshot in decode_waiting(sock, self._snapshot_decoder, self.counters):
            stream = self._streams.get(label)
            if stream is None or stream.synced or snapshot.req_id != stream.req_id:
                continue
            if snapshot.incarnation != stream.incarnation:
                continue  # the agent restarted meanwhile; its new batches start a new stream
            self.counters.add("snapshots")
            stream.synced = True
            stream.last_seq = snapshot.seq
            out.append(Delivered(label, snapshot))
            self._release_held(label, stream, out)

    def _release_held(self, label: str, stream: _Stream, out: list[Delivered]) -> None:
        held, stream.held = stream.held, []
        if held and stream.last_seq == 0:
            stream.last_seq = held[0][0].seq - 1
        for batch, frame in held:
            self._deliver(label, stream, batch, out, frame)

    def _expire_snapshot_requests(self, out: list[Delivered]) -> None:
        """An agent that does not answer its snapshot request in time: deliver what was held, count it."""
        now = time.monotonic()
        for label, stream in self._streams.items():
            if not stream.synced and now - stream.requested_at > SNAPSHOT_TIMEOUT_S:
                self.counters.add("snapshots_missed")
                stream.synced = True
                self._release_held(label, stream, out)

    def _close_snapshot_socket(self, label: str) -> None:
        sock = self._snapshot_sockets.pop(label, None)
        if sock is not None:
            sock.close(linger=0)
