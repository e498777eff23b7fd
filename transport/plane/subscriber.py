"""A reusable subscriber to agents' events: join late, start from a snapshot, count gaps.

For each agent incarnation the subscriber asks for a snapshot when it first
hears from it, holds that agent's batches until the snapshot arrives, then
delivers the snapshot followed by every batch with a larger seq, in order
(ZeroMQ guide's Clone pattern). After that, a seq that jumps counts the
missing batches as a gap, and the agent's snapshot is asked again (its batches
wait for it as they did for the first), so what the gap held reaches the
consumer after all (a relay that dropped the agent for a while, a consumer that
fell behind); a new incarnation (the agent restarted) starts over and is never
counted as a gap. A snapshot that does not come within `SNAPSHOT_TIMEOUT_S` is
counted (`snapshots_missed`), the agent's batches go on meanwhile, and it is
asked again later (its batches wait as after a gap), so an agent too busy to
answer in time still reaches the consumer whole.

Through a relay (`connect_relay`) the same happens on one SUB socket and one snapshot DEALER for every
agent behind it (dialed with the subscriber's CURVE keys, like its other sockets): each snapshot request
names its agent, and the relay passes it through. The envelope is
the agent's, so gaps are counted per (agent, incarnation) as they are directly.

Memory is bounded when the consumer falls behind: each agent's connection queues at most `AGENT_RCVHWM`
batches, a relay's `RELAY_RCVHWM`; past that ZeroMQ stops reading the connection, the agent's own queue
(its SNDHWM) fills, and its PUB drops: the seq that jumps counts the lost batches as a gap.

Nothing an agent registers or sends can raise out of `connect()` or `poll()`:
an entry, endpoint or heartbeat-named snapshot endpoint that cannot be
connected to is counted (`bad_entries`, once per name and reason) and named
in `refused`; every undecodable frame is counted under `rejected_<reason>`. A batch or snapshot that fails to
decode as a whole is decoded record by record (salvage.py): its valid records are delivered, in order, and its seq
counts as any other's (a refused record is no gap); each record refused is said in its delivery (`Delivered.refused`),
counted as it is delivered (`records_rejected`) and named with why in `records_refused`, once per agent incarnation:
a snapshot that holds a record refused already (its batch's, or an earlier snapshot's, asked again after a gap or a
missed snapshot) leaves it out again unsaid.
A rank the service lists as taken (`hear_taken`: another client holds its entry, and that taker publishes under the
same label) is delivered under `registration.taken_label`, so that neither incarnation's batches start the other's
stream anew; subscribed to directly, on a socket of its own unless a listed entry names its endpoint (the agents'
socket hears it then: on both, each batch came twice), closed once the listing no longer names it taken; its taken
label's stream is forgotten then, directly or through a relay.
Nor can a cluster larger than this process's limits: without a context given, the subscriber opens its own,
sized for a socket per agent (`transport.limits`), and raises the open-file limit as agents come. Where the
hard limit is too low, a snapshot socket that would take a file its connections need is not opened; that, and
a socket it cannot open (too many open files), is counted (`sockets_unopened`) and named per agent in
`unreachable`; the socket is opened again at the agent's next `connect()` or heartbeat while it waits.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import zmq

from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, dialing
from transport.limits import cannot_open, files_for, out_of_files, raise_open_files, size_context, snapshot_room
from transport.plane.events import EventBatch, Heartbeat, Snapshot, SnapshotRequest
from transport.plane.salvage import Refusal, salvage_batch, salvage_snapshot
from transport.registration import agent_problem, endpoint_problem, entry_name, taken_label
from transport.sockets import LIST_FRAME, decode_waiting_frames, open_socket, send_now
from transport.wire import AgentInfo, FrameDecoder, encode

SNAPSHOT_TIMEOUT_S = 2.0
SNAPSHOT_RETRY_S = 5.0
"""A snapshot that timed out is asked again this long after, the wait doubling at each miss up to
`SNAPSHOT_RETRY_MAX_S` (an agent that never answers costs a request a minute, each holding its batches for at
most `SNAPSHOT_TIMEOUT_S`)."""
SNAPSHOT_RETRY_MAX_S = 60.0
AGENT_RCVHWM = 256
"""Batches one agent's connection queues here, at most: about 13 s of an agent's batches at its default
50 ms interval (a keyframe or a stalled view holds the consumer a second, not this), and with 1024 agents
of 10-event batches (~0.5 KiB) about 130 MiB in all, which bounds a collector that falls behind. Past it the
agent's SNDHWM (10k) queues, then its PUB drops: counted as a gap."""
RELAY_RCVHWM = 100_000
"""Batches a relay's one connection queues (it carries every agent behind it): ~5 s of 1024 agents'."""
REFUSED_KEPT = 64
"""Unusable entries named at most (the oldest name goes first); `bad_entries` counts them all."""
REFUSALS_REMEMBERED = 4096
"""Refused records remembered per agent incarnation, so that its snapshots, which hold them again, say them once
(more than a snapshot holds: one forgotten past them is counted again)."""


@dataclass(eq=False)
class _Stream:
    """One agent incarnation as seen by this subscriber."""

    incarnation: int
    snapshot_socket: zmq.Socket[bytes] | None = None
    requested_at: float = 0.0
    req_id: int = 0
    last_seq: int = 0
    synced: bool = False
    held: list[tuple[EventBatch, bytes, tuple[Refusal, ...]]] = field(default_factory=list)
    """Batches waiting for the snapshot, each with its frame and its refused records (`Delivered`)."""
    answered: bool = False
    """The agent answered a snapshot request of this stream: after a gap, it is asked again."""
    refusals: dict[bytes, None] = field(default_factory=dict)
    """The keys of the records refused of this incarnation, counted already (the latest `REFUSALS_REMEMBERED`)."""

    def unsaid(self, refused: tuple[Refusal, ...], snapshot: bool) -> tuple[str, ...]:
        """Why each of `refused` was refused, remembered from now on; of a snapshot, only those not said before
        (a batch's records are each delivered once: one of the same bytes as another is another record)."""
        said = self.refusals
        fresh = tuple(why for key, why in refused if not snapshot or key not in said)
        for key, _ in refused:
            said.pop(key, None)
            said[key] = None
        while len(said) > REFUSALS_REMEMBERED:
            del said[next(iter(said))]
        return fresh


Delivery = Snapshot | EventBatch


class Delivered(msgspec.Struct, frozen=True, gc=False):
    """One item for the consumer: an agent's snapshot, or a batch to apply after it (a Struct: one per
    batch, made 6 x faster than a frozen dataclass; untracked by the GC, it holds no cycle)."""

    label: str
    item: Delivery
    frame: bytes = b""
    """The frame a batch came in (wire version byte + msgpack), as it came: a recorder writes it without
    encoding it again ("" for a snapshot, and for a batch some of whose records were refused)."""
    refused: tuple[str, ...] = ()
    """Why each record of the frame was refused and left out of `item` (salvage.py), the rest kept: those of a
    snapshot refused before (of this incarnation, in a batch or snapshot delivered earlier) are left out unsaid."""


class EventSubscriber:
    """Owns one SUB socket for discovered agents, one per endpoint given alone, and one snapshot DEALER per
    agent; `poll()` returns what is ready, in order."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        rcvhwm: int = AGENT_RCVHWM,
        curve: CurveKeys | None = None,
        relay_rcvhwm: int = RELAY_RCVHWM,
    ) -> None:
        """`context`: None for one of its own, sized for a socket per agent (closed with the subscriber);
        `rcvhwm`: batches each agent's connection queues at most; `relay_rcvhwm`: a relay's;
        `curve`: connect as a CURVE client of the cluster's keys (agents serving CURVE answer nobody else)."""
        self._owns_context = context is None
        self._context = context or zmq.Context()
        if self._owns_context:
            size_context(self._context, files_for(0))  # more than libzmq's 1023 sockets, before the first one
        self._open_files = raise_open_files(files_for(0))
        """This process's soft limit of open files, as last raised."""
        self._files_for = 0
        """Agents the open-file limit was last raised for."""
        self._curve = dialing(curve)
        self.socket = open_socket(self._context, zmq.SUB, LIST_FRAME, self._curve)
        self.socket.rcvhwm = rcvhwm
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._rcvhwm = rcvhwm
        self._relay_rcvhwm = relay_rcvhwm
        self.agents: dict[str, AgentInfo] = {}
        self._streams: dict[str, _Stream] = {}
        self._unsynced: dict[str, None] = {}
        """Labels whose stream waits for its snapshot, oldest first: what `synced()` and the expiry look at,
        not every stream."""
        self._retries: dict[str, tuple[float, float]] = {}
        """Labels whose snapshot timed out -> (when to ask again (inf while it is asked), the wait before that ask)."""
        self._retry_due = math.inf
        """The earliest time in `_retries`."""
        self._poller: zmq.Poller | None = None
        """Every socket `poll()` waits on, made again only when one opens or closes (not on every poll)."""
        self._snapshot_sockets: dict[str, zmq.Socket[bytes]] = {}
        self._snapshot_endpoints: dict[str, str] = {}
        self._endpoints: dict[str, zmq.Socket[bytes]] = {}
        """A SUB socket per endpoint given alone: what arrives on it tells which endpoint answered."""
        self.answered: dict[str, str] = {}
        """Endpoint given alone -> label of the agent heard there (absent while it never answered)."""
        self._relays: dict[str, tuple[zmq.Socket[bytes], zmq.Socket[bytes]]] = {}
        """Relay event endpoint -> (its SUB socket, a DEALER to its address)."""
        self._relayed: dict[str, str] = {}
        """Label of an agent heard through a relay -> that relay's event endpoint."""
        self._relay_requests: dict[int, str] = {}
        """Snapshot request id -> label, for requests sent through a relay."""
        self._relay_expected: dict[str, float] = {}
        """Labels a relay lists, not heard yet -> since when (`synced` waits for them a while)."""
        self._relay_listed: set[str] = set()
        """Every label a relay listed (each is waited for once)."""
        self._req_ids = itertools.count(int.from_bytes(os.urandom(7), "little") + 1)
        """Drawn at random: a relay passes requests of many subscribers on with their own ids."""
        self.gaps: Counter[tuple[str, int]] = Counter()
        """Missing batches per (agent label, incarnation)."""
        self.gap_runs: deque[tuple[str, int, int]] = deque(maxlen=10_000)
        """Each gap as it was found, (label, incarnation, missing batches), for a consumer to take."""
        self.counters = Counters(
            (
                "batches",
                "snapshots",
                "snapshots_missed",
                "stale_batches",
                "bad_entries",
                "sockets_unopened",
                "records_rejected",
                *rejection_names(),
            )
        )
        self.refused: dict[str, str] = {}
        """Entries and endpoints this subscriber could not use: name -> why."""
        self.unreachable: dict[str, str] = {}
        """Agents (labels), endpoints and relays a socket could not be opened for (this process's limits, not
        the agent's fault): name -> why. Tried again at each `connect()` of the name; gone once it opens."""
        self._taken: dict[str, int] = {}
        """Labels the service lists as taken -> the incarnation listed so: its batches are delivered under
        `taken_label` (the taker publishes under the plain label)."""
        self._taken_endpoints: dict[str, None] = {}
        """Event endpoints `hear_taken` subscribed to apart: closed once the listing no longer names the rank taken,
        or once a listed entry names the endpoint (`connect`)."""
        self.records_refused: dict[str, tuple[int, str]] = {}
        """Agents (labels) some of whose records were refused -> (how many, why the latest was), the most recent
        `REFUSED_KEPT` agents; `records_rejected` counts them all."""
        self._salvaged: tuple[Refusal, ...] = ()
        """Each record of the frame salvaged last that was refused (read as that frame's message is yielded)."""
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
            if known == agent and agent.label in self.unreachable:
                self._ask_again(agent.label)
            return ""
        self._make_room()
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
        if agent.event_endpoint in self._taken_endpoints:  # heard here from now on: apart, each batch came twice
            self._leave_taken(agent.event_endpoint)
        return ""

    def connect_endpoint(self, endpoint: str) -> str:
        """Subscribe to an agent known only by its event endpoint, on a SUB socket of its own (what arrives
        there tells which endpoint answered); its heartbeat names its snapshot socket.

        Returns why the endpoint cannot be used ("" when it can).
        """
        if endpoint in self._endpoints:
            return ""
        problem = endpoint_problem(endpoint)
        if problem:
            self._refuse(endpoint, problem)
            return problem
        self._make_room()
        try:
            sock = open_socket(self._context, zmq.SUB, LIST_FRAME, self._curve)
        except zmq.ZMQError as error:
            return self._unreachable(endpoint, f"event socket: {cannot_open(error)}")
        sock.rcvhwm = self._rcvhwm
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as error:
            sock.close()
            self._refuse(endpoint, error.strerror)
            return error.strerror
        self.unreachable.pop(endpoint, None)
        self._endpoints[endpoint] = sock
        self._poller = None
        return ""

    def hear_taken(self, agents: list[AgentInfo], direct: bool) -> None:
        """The ranks the latest listing names as taken (`AgentList.taken`): each one's batches are delivered under
        `taken_label`, apart from the taker's; `direct`: subscribe to their event endpoints, each that no listed
        entry names (one that does is heard on the agents' socket already: on both, each batch came twice); through
        a relay, its stream carries them (`synced` waits for them a while, as for the ranks it lists). A rank newly
        named taken is forgotten under its label, one no longer named so (it holds its entry again, or it stopped)
        under its taken label: its batches come under the other from then on, and that stream, resumed later,
        counted those as lost."""
        taken = {agent.label: agent.incarnation for agent in agents}
        for label, incarnation in taken.items():
            stream = self._streams.get(label)
            if self._taken.get(label) != incarnation and stream is not None and stream.incarnation == incarnation:
                self._forget(label)
        for label in [label for label in self._taken if label not in taken]:
            self._forget(taken_label(label))
        self._taken = taken
        listed = {agent.event_endpoint for agent in self.agents.values()} if direct else set()
        apart = {agent.event_endpoint for agent in agents if agent.event_endpoint not in listed} if direct else set()
        for endpoint in [endpoint for endpoint in self._taken_endpoints if endpoint not in apart]:
            self._leave_taken(endpoint)
        now = time.monotonic()
        for agent in agents:
            if direct:
                endpoint = agent.event_endpoint
                if endpoint in apart and endpoint not in self._endpoints and not self.connect_endpoint(endpoint):
                    self._taken_endpoints[endpoint] = None
            elif (label := taken_label(agent.label)) not in self._streams and label not in self._relay_listed:
                self._relay_listed.add(label)
                self._relay_expected[label] = now

    def _leave_taken(self, endpoint: str) -> None:
        """A taken rank's endpoint no longer subscribed to apart (the rank left the listing's taken, or a listed
        entry names the endpoint: the agents' socket hears it)."""
        del self._taken_endpoints[endpoint]
        self._endpoints.pop(endpoint).close(linger=0)
        self.answered.pop(endpoint, None)
        self._poller = None

    def _forget(self, label: str) -> None:
        """A label whose batches come under another now (`hear_taken`): its stream, its snapshot asked (of its
        socket or through a relay) and the relay's wait for it are forgotten (heard again, it starts anew)."""
        stream = self._streams.pop(label, None)
        if stream is not None:
            self._relay_requests.pop(stream.req_id, None)
        self._unsynced.pop(label, None)
        self._retries.pop(label, None)
        self._snapshot_endpoints.pop(label, None)
        self._close_snapshot_socket(label)
        self._relayed.pop(label, None)
        self._relay_expected.pop(label, None)
        self._relay_listed.discard(label)

    def connect_relay(self, relay: AgentInfo, agents: list[str] | None = None) -> str:
        """Subscribe to every agent behind a relay (its listing entry), on a SUB socket of its own, with
        snapshots asked of the relay; `agents`: the labels it lists (`synced` waits for them a while).

        Returns why the entry cannot be used ("" when it can).
        """
        now = time.monotonic()
        for label in agents or []:
            if label not in self._streams and label not in self._relay_listed:
                self._relay_listed.add(label)
                self._relay_expected[label] = now
        if relay.event_endpoint in self._relays:
            return ""
        problem = agent_problem(relay) or ("" if relay.snapshot_endpoint else "a relay without a snapshot endpoint")
        if problem:
            self._refuse(entry_name(relay), problem)
            return problem
        sockets: list[zmq.Socket[bytes]] = []
        try:
            sockets.append(open_socket(self._context, zmq.SUB, LIST_FRAME, self._curve))
            sockets.append(open_socket(self._context, zmq.DEALER, LIST_FRAME, self._curve))
        except zmq.ZMQError as error:
            for sock in sockets:
                sock.close(linger=0)
            return self._unreachable(entry_name(relay), f"relay sockets: {cannot_open(error)}")
        sub, dealer = sockets
        sub.rcvhwm = self._relay_rcvhwm
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sub.connect(relay.event_endpoint)
            dealer.connect(relay.snapshot_endpoint)
        except zmq.ZMQError as error:
            for sock in sockets:
                sock.close(linger=0)
            self._refuse(entry_name(relay), error.strerror)
            return error.strerror
        self.unreachable.pop(entry_name(relay), None)
        self._relays[relay.event_endpoint] = (sub, dealer)
        self._poller = None
        return ""

    def _refuse(self, name: str, problem: str) -> None:
        if self.refused.get(name) != problem:
            self.counters.add("bad_entries")
            self.refused.pop(name, None)
            self.refused[name] = problem
            if len(self.refused) > REFUSED_KEPT:
                del self.refused[next(iter(self.refused))]

    def _unreachable(self, name: str, why: str) -> str:
        """A socket for `name` could not be opened, or was not (this process is out of files or sockets):
        counted, and named in `unreachable` until it opens. Returns why."""
        self.counters.add("sockets_unopened")
        self.unreachable[name] = why
        return why

    def _make_room(self) -> None:
        """Raise the open-file limit for one more agent (in steps that double: not a call per agent)."""
        agents = len(self.agents) + len(self._endpoints) + 1
        if agents > self._files_for:
            self._files_for = max(agents, 2 * self._files_for)
            self._open_files = raise_open_files(files_for(self._files_for))

    def synced(self) -> bool:
        """True when no connected agent's snapshot is awaited: each arrived or its request timed out (while a
        missed one is asked again, up to `SNAPSHOT_TIMEOUT_S`, it is awaited again)."""
        expected = len(self.agents) + len(self._endpoints)
        now = time.monotonic()
        for label in [label for label, since in self._relay_expected.items() if now - since > SNAPSHOT_TIMEOUT_S]:
            del self._relay_expected[label]  # listed by a relay, never heard: like a snapshot that timed out
        if any(label not in self._streams for label in self._relay_expected):
            return False
        return len(self._streams) >= expected and not self._unsynced

    def close(self) -> None:
        self.socket.close(linger=0)
        for sock in self._endpoints.values():
            sock.close(linger=0)
        for sub, dealer in self._relays.values():
            sub.close(linger=0)
            dealer.close(linger=0)
        for label in list(self._snapshot_sockets):
            self._close_snapshot_socket(label)
        if self._owns_context:  # every socket of it, one a Ctrl-C left half made too (`term` waited on it forever)
            self._context.destroy(linger=0)

    def poll(self, timeout_s: float) -> list[Delivered]:
        """Deliveries ready now, after waiting up to `timeout_s` for the first input."""
        poller = self._poller
        if poller is None:
            poller = self._poller = zmq.Poller()
            poller.register(self.socket, zmq.POLLIN)
            for sock in [*self._endpoints.values(), *self._snapshot_sockets.values()]:
                poller.register(sock, zmq.POLLIN)
            for sub, dealer in self._relays.values():
                poller.register(sub, zmq.POLLIN)
                poller.register(dealer, zmq.POLLIN)
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
        for relay, (sub, dealer) in self._relays.items():
            if sub in ready:
                self._read_batches(sub, out, relay=relay)
            if dealer in ready:
                self._read_relayed_snapshots(dealer, out)
        self._expire_snapshot_requests(out)
        if self._retries:
            self._ask_missed_again()
        return out

    def _read_batches(self, sock: zmq.Socket[bytes], out: list[Delivered], endpoint: str = "", relay: str = "") -> None:
        """Every batch waiting on `sock` (10k at most): a synced stream's next seq goes straight out (the
        path nearly every batch takes, kept short: one dict hit, one compare); anything else, `_on_batch`."""
        streams, relayed, taken, count = self._streams, self._relayed, self._taken, 0
        for frame, batch in decode_waiting_frames(
            sock, self._batch_decoder, self.counters, 10_000, self._salvage_batch
        ):
            count += 1
            # `batch.label`, without the property's call where no stage or replica is named (nearly every batch)
            label = f"{batch.instance}/TP{batch.rank}" if batch.pp is None and batch.dp is None else batch.label
            if taken and taken.get(label) == batch.incarnation:
                label = taken_label(label)
            if endpoint:
                self.answered[endpoint] = label
            if relay and relayed.get(label) != relay:
                relayed[label] = relay
                self._relay_expected.pop(label, None)
            stream = streams.get(label)
            if (
                frame  # "": salvaged, some records refused (`_on_batch` says which)
                and stream is not None
                and stream.synced
                and stream.incarnation == batch.incarnation
                and batch.seq == stream.last_seq + 1
            ):
                stream.last_seq = batch.seq
                out.append(Delivered(label, batch, frame))
            else:
                self._on_batch(batch, out, frame, label, () if frame else self._salvaged)
        if count:
            self.counters.add("batches", count)

    def _salvage_batch(self, frame: bytes) -> tuple[bytes, EventBatch] | None:
        """The valid events of a batch that failed whole, why the others failed in `_salvaged` (None: its envelope
        failed too, the frame is rejected whole)."""
        salvaged = salvage_batch(memoryview(frame)[1:])
        if salvaged is None:
            return None
        batch, refused = salvaged
        self._salvaged = tuple(refused)
        return b"", batch

    def _salvage_snapshot(self, frame: bytes) -> tuple[bytes, Snapshot] | None:
        """As `_salvage_batch`, for a snapshot."""
        salvaged = salvage_snapshot(memoryview(frame)[1:])
        if salvaged is None:
            return None
        snapshot, refused = salvaged
        self._salvaged = tuple(refused)
        return b"", snapshot

    def _delivered(
        self,
        label: str,
        stream: _Stream,
        item: Delivery,
        out: list[Delivered],
        frame: bytes,
        refused: tuple[Refusal, ...],
    ) -> None:
        """`item` out, the records refused of it counted (once per incarnation each: `_Stream.unsaid`)."""
        said = stream.unsaid(refused, isinstance(item, Snapshot)) if refused else ()
        out.append(Delivered(label, item, frame, said))
        if said:
            self._count_refused(label, said)

    def _count_refused(self, label: str, refused: tuple[str, ...]) -> None:
        """A delivery of `label` left records out: counted, and the latest reason kept."""
        self.counters.add("records_rejected", len(refused))
        count = self.records_refused.pop(label, (0, ""))[0] + len(refused)
        self.records_refused[label] = (count, refused[-1])
        if len(self.records_refused) > REFUSED_KEPT:
            del self.records_refused[next(iter(self.records_refused))]

    def _on_batch(
        self,
        batch: EventBatch,
        out: list[Delivered],
        frame: bytes = b"",
        label: str = "",
        refused: tuple[Refusal, ...] = (),
    ) -> None:
        label = label or batch.label
        stream = self._streams.get(label)
        if stream is None or stream.incarnation != batch.incarnation:
            if stream is not None:
                self._relay_requests.pop(stream.req_id, None)
            stream = self._streams[label] = self._start_stream(label, batch.incarnation)
        if not stream.synced:
            stream.held.append((batch, frame, refused))
            if stream.snapshot_socket is None:
                self._ask_when_known(label, stream, batch)
            return
        self._deliver(label, stream, batch, out, frame, refused)

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
                send_now(stream.snapshot_socket, encode(SnapshotRequest(stream.req_id)))

    def _deliver(
        self,
        label: str,
        stream: _Stream,
        batch: EventBatch,
        out: list[Delivered],
        frame: bytes = b"",
        refused: tuple[Refusal, ...] = (),
    ) -> None:
        if not stream.synced:  # its snapshot was asked again (a gap among held batches): wait for it too
            stream.held.append((batch, frame, refused))
            return
        if batch.seq <= stream.last_seq:
            self.counters.add("stale_batches")
            return
        if stream.last_seq and batch.seq != stream.last_seq + 1:
            missing = batch.seq - stream.last_seq - 1
            self.gaps[(label, stream.incarnation)] += missing
            self.gap_runs.append((label, stream.incarnation, missing))
            if stream.answered:  # what the gap held is in the agent's snapshot: this batch waits for it
                stream.last_seq = batch.seq - 1
                stream.held.append((batch, frame, refused))
                self._ask_snapshot(label, stream)
                return
        stream.last_seq = batch.seq
        self._delivered(label, stream, batch, out, frame, refused)

    def _start_stream(self, label: str, incarnation: int) -> _Stream:
        stream = _Stream(incarnation)
        self._retries.pop(label, None)
        self._ask_snapshot(label, stream)
        return stream

    def _ask_snapshot(self, label: str, stream: _Stream) -> None:
        """Ask for `label`'s snapshot (a new stream's, or again after a gap): the stream's batches wait until
        it arrives or `SNAPSHOT_TIMEOUT_S` passes."""
        stream.req_id = req_id = next(self._req_ids)
        stream.requested_at = time.monotonic()
        stream.synced = False
        self._unsynced[label] = None
        relay = self._relays.get(self._relayed.get(label, "")) if label not in self.agents else None
        if relay is not None:
            self._relay_requests[req_id] = label
            send_now(relay[1], encode(SnapshotRequest(req_id, label)))  # unsent: the ask times out
            stream.snapshot_socket = relay[1]
            return
        sock = stream.snapshot_socket = self._snapshot_socket(label)
        if sock is not None:
            send_now(sock, encode(SnapshotRequest(req_id)))

    def _ask_again(self, label: str) -> None:
        """An agent whose snapshot socket could not be opened: once it opens, its snapshot is asked (its
        batches wait for it, as after a gap)."""
        stream = self._streams.get(label)
        if stream is not None and not stream.answered and self._snapshot_socket(label) is not None:
            self._ask_snapshot(label, stream)

    def _snapshot_socket(self, label: str) -> zmq.Socket[bytes] | None:
        agent = self.agents.get(label)
        endpoint = agent.snapshot_endpoint if agent is not None else self._snapshot_endpoints.get(label, "")
        if not endpoint:
            return None
        sock = self._snapshot_sockets.get(label)
        if sock is None:
            agents = len(self.agents) + len(self._endpoints)
            if not snapshot_room(self._open_files, agents, len(self._snapshot_sockets)):
                self._unreachable(
                    label, f"snapshot socket: {out_of_files('no file left beside a connection per agent')}"
                )
                return None
            try:
                sock = open_socket(self._context, zmq.DEALER, LIST_FRAME, self._curve)
            except zmq.ZMQError as error:
                self._unreachable(label, f"snapshot socket: {cannot_open(error)}")
                return None
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as error:
                sock.close(linger=0)
                self._refuse(label, f"snapshot endpoint {endpoint!r}: {error.strerror}")
                return None
            self.unreachable.pop(label, None)
            self._snapshot_sockets[label] = sock
            self._poller = None
        return sock

    def _read_snapshot(self, label: str, sock: zmq.Socket[bytes], out: list[Delivered]) -> None:
        # `sock` may close as a snapshot is accepted: read it whole first
        read = [(snapshot, () if frame else self._salvaged) for frame, snapshot in self._waiting_snapshots(sock)]
        for snapshot, refused in read:
            self._accept_snapshot(label, snapshot, out, refused)

    def _read_relayed_snapshots(self, dealer: zmq.Socket[bytes], out: list[Delivered]) -> None:
        for frame, snapshot in self._waiting_snapshots(dealer):
            label = self._relay_requests.pop(snapshot.req_id, None)
            if label is not None:
                self._accept_snapshot(label, snapshot, out, () if frame else self._salvaged)

    def _waiting_snapshots(self, sock: zmq.Socket[bytes]) -> Iterator[tuple[bytes, Snapshot]]:
        """Snapshots waiting on `sock`, each with its frame ("" for one salvaged: `_salvaged` says what it lost)."""
        return decode_waiting_frames(sock, self._snapshot_decoder, self.counters, salvage=self._salvage_snapshot)

    def _accept_snapshot(
        self, label: str, snapshot: Snapshot, out: list[Delivered], refused: tuple[Refusal, ...] = ()
    ) -> None:
        stream = self._streams.get(label)
        if stream is None or stream.synced or snapshot.req_id != stream.req_id:
            return
        if snapshot.incarnation != stream.incarnation:
            return  # the agent restarted meanwhile; its new batches start a new stream
        self.counters.add("snapshots")
        self._retries.pop(label, None)
        stream.synced = stream.answered = True
        self._unsynced.pop(label, None)
        stream.last_seq = snapshot.seq
        self._done_asking(label, stream)
        self._delivered(label, stream, snapshot, out, b"", refused)
        self._release_held(label, stream, out)

    def _done_asking(self, label: str, stream: _Stream) -> None:
        """A stream synced: its own snapshot socket closes (a new incarnation opens one again), so a
        subscriber to many agents polls and holds no socket per agent once synced."""
        if stream.snapshot_socket is not None and stream.snapshot_socket is self._snapshot_sockets.get(label):
            self._close_snapshot_socket(label)
        stream.snapshot_socket = None

    def _release_held(self, label: str, stream: _Stream, out: list[Delivered]) -> None:
        held, stream.held = stream.held, []
        if held and stream.last_seq == 0:
            stream.last_seq = held[0][0].seq - 1
        for batch, frame, refused in held:
            self._deliver(label, stream, batch, out, frame, refused)

    def _expire_snapshot_requests(self, out: list[Delivered]) -> None:
        """An agent that does not answer its snapshot request in time: deliver what was held, count it."""
        if not self._unsynced:
            return
        now = time.monotonic()
        for label in [
            label for label in self._unsynced if now - self._streams[label].requested_at > SNAPSHOT_TIMEOUT_S
        ]:
            stream = self._streams[label]
            self._relay_requests.pop(stream.req_id, None)
            self.counters.add("snapshots_missed")
            wait = (
                min(2 * self._retries[label][1], SNAPSHOT_RETRY_MAX_S) if label in self._retries else SNAPSHOT_RETRY_S
            )
            self._retries[label] = (now + wait, wait)
            self._retry_due = min(self._retry_due, now + wait)
            stream.synced = True
            self._unsynced.pop(label, None)
            self._done_asking(label, stream)
            self._release_held(label, stream, out)

    def _ask_missed_again(self) -> None:
        """Ask again each snapshot that timed out, once its wait is over (`SNAPSHOT_RETRY_S`); a poll before the
        first is due looks at none of them."""
        now = time.monotonic()
        if now < self._retry_due:
            return
        for label, (due, wait) in list(self._retries.items()):
            stream = self._streams.get(label)
            if stream is None:
                del self._retries[label]
            elif now >= due and stream.synced:  # not asking already (after a gap)
                self._ask_snapshot(label, stream)
                self._retries[label] = (math.inf, wait)  # due again once this ask times out too
        self._retry_due = min((due for due, _ in self._retries.values()), default=math.inf)

    def _close_snapshot_socket(self, label: str) -> None:
        sock = self._snapshot_sockets.pop(label, None)
        if sock is not None:
            sock.close(linger=0)
            self._poller = None
