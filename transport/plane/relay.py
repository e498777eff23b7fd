"""The relay: one address for a whole cluster's events and snapshots, built on ZeroMQ's own proxy.

::

    agents' PUB (or an upstream relay's XPUB) -> XSUB ==zmq.proxy_steerable==> XPUB (bound) -> SUB (views)
    agents' snapshot ROUTER (or a relay's)   <- DEALERs <- SnapshotBroker -> ROUTER (bound) <- DEALER (views)

Frames: wire.py, "relay". Batches pass through untouched: the envelope (agent, incarnation, seq) is the
agent's, so a subscriber counts gaps end to end per (agent, incarnation), as it would directly. The
relay subscribes to the whole stream of every upstream itself, so what flows does not depend on who
listens downstream.

Upstreams: the agents a bootstrap lists (`bootstrap`), the relays given (`relays`, their ROUTER address:
tiers), and agents given by their event endpoints (`connect`; the relay learns their snapshot sockets from
their heartbeats, of a batch some of whose other records fail their schema too: salvage.py). Discovery runs
again every `DISCOVER_EVERY_S`: agents come, go and restart.

Threads, each owning its sockets:

- proxy: `zmq.proxy_steerable(XSUB, XPUB, None, control)`. When the upstream event endpoints change,
  the discovery thread ends the run (TERMINATE); the proxy thread connects and disconnects, then runs
  the proxy again. Messages queued in the sockets meanwhile are kept.
- broker: the ROUTER (snapshot_broker.py).
- discovery: lists the bootstrap and each upstream relay, builds the routing `Book`, registers this relay
  with the bootstrap (`register`), and reads the proxy's STATISTICS into the counters. An upstream that does
  not answer keeps its agents listed, and the listing says so (`AgentList.upstream_errors`, `kept`: its own,
  and those its upstream relays report), so that a view blames the upstream, not the ranks behind it.

The joined listing keeps the bootstrap's budget (`bootstrap.MAX_LISTING_BYTES`: half for live entries, half for
expired ones; `REFUSED_KEPT` refused lines and upstream errors), each upstream's entries taken in turn: entries
past it are left out, counted (`listing_left_out`, the latest round's) and said in `refused`, so a relay joining
full bootstraps still answers in one frame every reader takes, and no upstream pushes another's ranks out.
The ranks its upstreams list as taken (`AgentList.taken`: refused because another client holds their entry, running
on) it subscribes to, as to the listed ones, and lists as taken (the latest `REFUSED_KEPT`), so a view through it
hears them as one given the bootstrap does: a view hears each under `taken_label` (the taker publishes under its
label), and a snapshot asked by that name reaches the rank's own snapshot socket.

A thread that dies is logged with its traceback and kept in `error`; `died` turns true.

With `curve` (the cluster's keys, `transport.curve`) the relay is a CURVE client of everything upstream (its
XSUB, the finders, the broker's DEALERs, its bootstrap calls) and a CURVE server, with the allow-list, of
everything downstream (its XPUB and ROUTER): a view without an allowed key hears nothing through it.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from transport.bootstrap import LIVE_BYTES, MAX_LISTING_BYTES, REFUSED_KEPT, BootstrapClient
from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, dialing, serving, stop_authenticator
from transport.errors import BootstrapError
from transport.limits import size_context
from transport.plane.events import EventBatch, Heartbeat
from transport.plane.salvage import salvage_batch
from transport.plane.snapshot_broker import BROKER_COUNTERS, Book, Route, SnapshotBroker
from transport.registration import RELAY_ROLE, agent_problem, endpoint_problem, entry_name, taken_label
from transport.sockets import LIST_FRAME, SMALL_FRAME, SUBSCRIPTION_FRAME, bind, decode_waiting, open_socket
from transport.wire import LISTED_BY_RELAY, AgentInfo, AgentList, FrameDecoder, RefusedNote, cut_text, encode

log = logging.getLogger("transport.plane.relay")

DISCOVER_EVERY_S = 1.0
HWM = 100_000
"""Messages queued per subscriber (XPUB) before ZeroMQ drops (a gap, counted downstream)."""
UPSTREAM_HWM = 10_000
"""Messages queued per upstream (XSUB pipe), as an agent's own PUB queues: the relay's memory stays bounded
by agents x this, and the proxy drains the pipes far faster than agents fill them."""
BAD_ENTRIES_KEPT = 4096
"""Unusable entries remembered so that one listed every round is counted once (a bootstrap's entries at most; one
forgotten past them is counted again when listed again)."""
_CONTROL_TIMEOUT_MS = 5000
_STATS = ("received", "received_bytes", "subscriptions", "forwarded", "forwarded_bytes")
RELAY_COUNTERS = (
    *_STATS,
    "upstream_agents",
    "upstream_relays",
    "upstream_endpoints",
    "proxy_restarts",
    "discovery_errors",
    "bad_entries",
    "listing_left_out",
    *BROKER_COUNTERS,
    *rejection_names(),
)


def _interleaved(agents: dict[str, AgentInfo], origin: dict[str, str]) -> list[AgentInfo]:
    """`agents` one upstream's at a time in turn, so that a budget cut leaves each upstream its share: one that
    lists thousands pushes no other upstream's ranks out (those kept from an earlier round are one upstream)."""
    by_upstream: dict[str, list[AgentInfo]] = {}
    for label, agent in agents.items():
        by_upstream.setdefault(origin.get(label, ""), []).append(agent)
    turns = itertools.zip_longest(*by_upstream.values())
    return [agent for turn in turns for agent in turn if agent is not None]


def _within(entries: list[AgentInfo], budget: int) -> tuple[list[AgentInfo], int]:
    """The first `entries` whose encoding fits in `budget` bytes, and how many were left out."""
    kept: list[AgentInfo] = []
    for entry in entries:
        budget -= len(encode(entry))
        if budget < 0:
            break
        kept.append(entry)
    return kept, len(entries) - len(kept)


def _kept(lines: list[str], more: str) -> list[str]:
    """At most `REFUSED_KEPT` of `lines`, the last one saying how many more there were."""
    if len(lines) <= REFUSED_KEPT:
        return lines
    return [*lines[: REFUSED_KEPT - 1], f"and {len(lines) - REFUSED_KEPT + 1} {more}"]


def listed_by_relay(listing: AgentList) -> bool:
    """Whether `listing` is a relay's own answer, which says what of its upstreams stopped answering it; a bootstrap
    service's names the relays registered with it, not what they hear. A listing that does not say (`lister`: a
    peer older than the field) is a relay's when its counters are."""
    if listing.lister:
        return listing.lister == LISTED_BY_RELAY
    return "upstream_agents" in listing.counters


def _salvaged(frame: bytes) -> tuple[bytes, EventBatch] | None:
    """The valid events of a batch that failed whole (a heartbeat beside a record outside its schema still names
    its snapshot socket); None where its envelope fails too. Its refused records are the views' to count."""
    salvaged = salvage_batch(memoryview(frame)[1:])
    return None if salvaged is None else (b"", salvaged[0])


def _reachable(endpoint: str, advertise: str) -> str:
    """`endpoint` as others connect to it: a wildcard host (0.0.0.0, ::, *) becomes `advertise` or this host."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://[::]:", "tcp://*:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{advertise or socket.gethostname()}:{endpoint[len(wildcard) :]}"
    return endpoint


@dataclass
class _Stats:
    """The proxy's STATISTICS, summed over its runs (each run starts from zero)."""

    done: list[int] = field(default_factory=lambda: [0] * 8)
    current: list[int] = field(default_factory=lambda: [0] * 8)

    def totals(self) -> dict[str, int]:
        values = [a + b for a, b in zip(self.done, self.current, strict=True)]
        # frontend (XSUB): msgs in, bytes in, msgs out, bytes out; backend (XPUB): the same
        return dict(zip(_STATS, (values[0], values[1], values[4], values[6], values[7]), strict=True))


class Relay:
    """An XSUB/XPUB proxy and a snapshot broker; `start()`, then `close()` (from any thread)."""

    def __init__(
        self,
        bootstrap: str = "",
        relays: list[str] | None = None,
        connect: list[str] | None = None,
        listen: str = "",
        snapshot_listen: str = "",
        host: str = "127.0.0.1",
        name: str = "relay",
        register: bool = False,
        discover_every_s: float = DISCOVER_EVERY_S,
        advertise: str = "",
        curve: CurveKeys | None = None,
    ) -> None:
        """`listen`/`snapshot_listen`: the XPUB and ROUTER addresses (a free port on `host` when empty);
        `register`: list this relay with `bootstrap`, so that views given the bootstrap use the relay;
        `advertise`: the host views reach a wildcard bind at (default: this machine's host name);
        `curve`: the cluster's keys, loaded to serve (dial upstream as a client, serve downstream)."""
        self.bootstrap = bootstrap
        self.relays = relays or []
        self.connect = connect or []
        self.register = register
        self.discover_every_s = discover_every_s
        self.curve = curve
        self.counters = Counters(RELAY_COUNTERS)
        self.error = ""
        """The last discovery error ("" while every upstream answers), or why a thread died."""
        self.died = False
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        size_context(self._context)  # a snapshot DEALER per agent: more than libzmq's default 1023 sockets
        self._xsub = open_socket(self._context, zmq.XSUB, LIST_FRAME, dialing(curve))
        self._xsub.rcvhwm = UPSTREAM_HWM
        self._xpub = open_socket(self._context, zmq.XPUB, SUBSCRIPTION_FRAME, serving(curve))
        self._xpub.sndhwm = HWM
        self.endpoint = _reachable(bind(self._xpub, listen, host), advertise)
        """Where views subscribe (the XPUB)."""
        self._router = open_socket(self._context, zmq.ROUTER, SMALL_FRAME, serving(curve))
        self.address = _reachable(bind(self._router, snapshot_listen, host), advertise)
        """The relay's address (its ROUTER): where views list it and ask for snapshots (`--relay ADDR`)."""
        control = f"inproc://relay-control-{id(self)}"
        self._control = open_socket(self._context, zmq.PAIR, SMALL_FRAME)
        self._control.bind(control)
        self._proxy_control = open_socket(self._context, zmq.PAIR, SMALL_FRAME)
        self._proxy_control.connect(control)
        self.entry = AgentInfo(
            RELAY_ROLE, name, 0, 1, 1, "", self.address, os.getpid(), socket.gethostname(),
            int.from_bytes(os.urandom(8), "little") >> 1, "", self.endpoint, self.address,
        )  # fmt: skip
        """This relay's listing entry (role `relay`): what the bootstrap and its own ROUTER list."""
        self._book = Book()
        self._bad_seen: dict[str, bool] = {}
        """Unusable entries counted (`bad_entries`), `name: why`, the latest listed last."""
        self._wanted: set[str] = set()
        self._answered: set[str] = set()
        """Upstreams (the bootstrap, relays) that answered a listing: one that stops is said to, without a hint
        about CURVE keys that served before."""
        self._applied: set[str] = set()
        self._lock = threading.Lock()
        self._stats = _Stats()
        self._learned: dict[str, Route] = {}
        """Snapshot routes of agents given by their event endpoints, from their heartbeats."""
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard, args=(self._run_proxy,), name="relay-proxy", daemon=True),
            threading.Thread(target=self._guard, args=(self._run_broker,), name="relay-broker", daemon=True),
            threading.Thread(target=self._guard, args=(self._run_discovery,), name="relay-discovery", daemon=True),
        ]

    def start(self, discover_timeout_s: float = 2.0) -> Relay:
        """Discover once (raises `BootstrapError` if the bootstrap or an upstream relay does not answer), then
        serve in the background."""
        self._discover(discover_timeout_s, strict=True)
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        """Stop every thread (each within one poll interval) and close every socket."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        if self.register and self.bootstrap:
            try:
                with BootstrapClient(self.bootstrap, timeout_s=0.5, context=self._context, curve=self.curve) as client:
                    client.deregister(self.entry)
            except BootstrapError:
                pass  # the entry expires by itself
        for sock in (self._xsub, self._xpub, self._router, self._control, self._proxy_control):
            sock.close(linger=0)
        stop_authenticator(self._context)
        self._context.term()

    def book(self) -> Book:
        return self._book

    def snapshot(self) -> dict[str, int]:
        """The relay's counters, the proxy's traffic included."""
        with self._lock:
            traffic = self._stats.totals()
        return {**self.counters.snapshot(), **traffic}

    def status_line(self) -> str:
        """One line for people: upstreams, traffic, snapshots passed, errors."""
        c = self.snapshot()
        line = (
            f"upstreams {c['upstream_agents']} agents, {c['upstream_relays']} relays "
            f"({c['upstream_endpoints']} endpoints); forwarded {c['forwarded']} messages "
            f"({c['forwarded_bytes'] / 1e6:.1f} MB) of {c['received']} received; snapshots "
            f"{c['snapshots_passed']} passed of {c['snapshot_requests']} requested "
            f"({c['snapshots_unroutable']} unroutable, {c['snapshots_unanswered']} unanswered); "
            f"rejected {sum(c[name] for name in rejection_names())}, bad entries {c['bad_entries']}"
        )
        if c["listing_left_out"]:
            line += f"; {c['listing_left_out']} entries left out of its listing (past its size)"
        return f"{line}; {self.error}" if self.error else line

    # --- threads ---------------------------------------------------------------------------

    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:
            self.error = f"the relay stopped: {traceback.format_exc(limit=1).strip().splitlines()[-1]}"
            self.died = True
            log.exception("a relay thread died")
            self._stop.set()

    def _run_proxy(self) -> None:
        self._xsub.send(b"\x01")  # the whole stream of every upstream, whoever listens downstream
        while True:
            with self._lock:
                wanted = set(self._wanted)
            for endpoint in self._applied - wanted:
                self._xsub.disconnect(endpoint)
            for endpoint in wanted - self._applied:
                self._xsub.connect(endpoint)
            self._applied = wanted
            if self._stop.is_set():
                return
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._proxy_control)

    def _run_broker(self) -> None:
        broker = SnapshotBroker(
            self._router, lambda: self.entry, self.book, self.counters, self.snapshot, dialing(self.curve)
        )
        try:
            while not self._stop.is_set():
                broker.serve_once(100)
        finally:
            broker.close()

    def _run_discovery(self) -> None:
        finders = self._open_finders()
        next_round = time.monotonic() + self.discover_every_s
        try:
            while not self._stop.is_set():
                self._learn_routes(finders, timeout_ms=100)
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + self.discover_every_s
                    self._discover(1.0, strict=False)
                self._read_statistics()
        finally:
            for sock in finders:
                sock.close(linger=0)
            self._command(b"TERMINATE")

    # --- discovery -------------------------------------------------------------------------

    def _discover(self, timeout_s: float, strict: bool) -> None:
        """One round: who is upstream now; the proxy restarts when its endpoints changed."""
        routes: dict[str, Route] = dict(self._learned)
        agents: dict[str, AgentInfo] = {}
        origin: dict[str, str] = {}
        """Which upstream listed each agent (the last one that did)."""
        expired: dict[str, AgentInfo] = {}
        refused: list[str] = []
        refusals: list[RefusedNote] = []
        """The upstreams' refused registrations: a view through the relay names them as one on the bootstrap does."""
        taken: list[AgentInfo] = []
        """The ranks the upstreams list as taken (a bootstrap's subscribed to here; an upstream relay's stream carries
        those it lists)."""
        endpoints = set(self.connect)
        relays = 0
        errors: list[str] = []
        reported: list[str] = []  # upstream relays' own upstreams that did not answer
        kept: set[str] = set()
        for address in self.relays:
            listing = self._list(address, timeout_s, strict, errors, "relay")
            relays_listed = listing.relays if listing is not None else []
            relay = next((r for r in relays_listed if not agent_problem(r) and r != self.entry), None)
            if listing is None or relay is None:
                if listing is not None:
                    errors.append(f"{address} lists no relay")
                continue
            relays += 1
            endpoints.add(relay.event_endpoint)
            reported.extend(cut_text(f"via {address}: {error}") for error in listing.upstream_errors)
            kept.update(listing.kept)
            refusals.extend(listing.refusals)
            for agent in self._usable(listing.taken, refused):
                taken.append(agent)
                routes[taken_label(agent.label)] = Route(relay.snapshot_endpoint, via_relay=True)
            for agent in self._usable(listing.agents, refused):
                agents[agent.label] = agent
                origin[agent.label] = address
                routes[agent.label] = Route(relay.snapshot_endpoint, via_relay=True)
            expired.update((a.label, a) for a in listing.expired)
        if self.bootstrap:
            listing = self._list(self.bootstrap, timeout_s, strict, errors, "bootstrap")
            if listing is not None:
                refusals.extend(listing.refusals)
                for agent in self._usable(listing.taken, refused):
                    taken.append(agent)
                    endpoints.add(agent.event_endpoint)
                    if agent.snapshot_endpoint:
                        routes[taken_label(agent.label)] = Route(agent.snapshot_endpoint, via_relay=False)
                if self.register:
                    self._register(timeout_s, errors)
                for agent in self._usable(listing.agents, refused):
                    agents[agent.label] = agent
                    origin[agent.label] = self.bootstrap
                    if agent.event_endpoint:
                        endpoints.add(agent.event_endpoint)
                    if agent.snapshot_endpoint:
                        routes[agent.label] = Route(agent.snapshot_endpoint, via_relay=False)
                expired.update((a.label, a) for a in listing.expired)
        if errors:  # an upstream did not answer: keep what it gave last time
            endpoints |= self._wanted
            routes = {**self._book.routes, **routes}
            kept.update(agent.label for agent in self._book.agents if agent.label not in agents)
            agents = {agent.label: agent for agent in self._book.agents} | agents
            taken = taken or self._book.taken
        for label in agents:
            expired.pop(label, None)
        listed, left_live = _within(_interleaved(agents, origin), LIVE_BYTES)
        gone, left_expired = _within(list(expired.values()), MAX_LISTING_BYTES - LIVE_BYTES)
        self._set_counter("listing_left_out", left_live + left_expired)
        refusals = refusals[-REFUSED_KEPT:]
        refused = _kept([note.line for note in refusals] + refused, "more unusable entries")
        if left_live or left_expired:
            refused.append(
                f"{left_live} live and {left_expired} expired entries left out: the upstreams' listings joined take "
                f"more than one listing holds ({LIVE_BYTES} B of live entries, as many of expired)"
            )
        down = _kept([cut_text(error) for error in errors] + reported, "more upstream errors")
        shown = {agent.label for agent in listed}
        self._book = Book(routes, listed, gone, refused, down, sorted(label for label in kept if label in shown),
                          refusals, time.monotonic(), taken[-REFUSED_KEPT:])  # fmt: skip
        self.error = "; ".join(errors)
        self.counters.add("discovery_errors", len(errors))
        self._set_counter("upstream_agents", len(agents))
        self._set_counter("upstream_relays", relays)
        self._set_counter("upstream_endpoints", len(endpoints))
        with self._lock:
            changed = endpoints != self._wanted
            self._wanted = endpoints
        if changed and self._threads[0].is_alive():
            self._read_statistics(finished=True)
            self._command(b"TERMINATE")
            self.counters.add("proxy_restarts")

    def _list(self, address: str, timeout_s: float, strict: bool, errors: list[str], service: str) -> AgentList | None:
        """`address`'s listing (`service`: what its errors call it); None, its error in `errors`, when it does not
        answer (raised when `strict`)."""
        answered = address in self._answered
        try:
            with BootstrapClient(
                address, timeout_s=timeout_s, context=self._context, curve=self.curve, service=service,
                answered_before=answered,
            ) as client:  # fmt: skip
                listing = client.listing()
            self._answered.add(address)
            return listing
        except BootstrapError as error:
            if strict:
                raise
            errors.append(str(error))
            return None

    def _register(self, timeout_s: float, errors: list[str]) -> None:
        try:
            with BootstrapClient(
                self.bootstrap, timeout_s=timeout_s, context=self._context, curve=self.curve
            ) as client:
                client.register(self.entry)
        except BootstrapError as error:
            errors.append(str(error))

    def _usable(self, agents: list[AgentInfo], refused: list[str]) -> list[AgentInfo]:
        """`agents` a reader may dial; each other one is named in `refused` and counted once (`bad_entries`), not
        once per round that lists it."""
        usable = []
        for agent in agents:
            problem = agent_problem(agent)
            if problem:
                line = f"{entry_name(agent)}: {problem}"
                if self._bad_seen.pop(line, False) is False:
                    self.counters.add("bad_entries")
                self._bad_seen[line] = True  # the newest last: the oldest is forgotten first
                if len(self._bad_seen) > BAD_ENTRIES_KEPT:
                    del self._bad_seen[next(iter(self._bad_seen))]
                refused.append(line)
            else:
                usable.append(agent)
        return usable

    def _set_counter(self, name: str, value: int) -> None:
        self.counters.add(name, value - self.counters[name])

    # --- agents given by their event endpoints: snapshot routes from their heartbeats ----------

    def _open_finders(self) -> list[zmq.Socket[bytes]]:
        finders = []
        for endpoint in self.connect:
            sock = open_socket(self._context, zmq.SUB, LIST_FRAME, dialing(self.curve))
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            finders.append(sock)
        return finders

    def _learn_routes(self, finders: list[zmq.Socket[bytes]], timeout_ms: int) -> None:
        if not finders:
            self._stop.wait(timeout_ms / 1000)
            return
        poller = zmq.Poller()
        for sock in finders:
            poller.register(sock, zmq.POLLIN)
        decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
        for sock, _ in poller.poll(timeout_ms):
            for batch in decode_waiting(sock, decoder, self.counters, 1000, _salvaged):
                for event in batch.events:
                    endpoint = event.snapshot_endpoint if isinstance(event, Heartbeat) else ""
                    if endpoint and not endpoint_problem(endpoint):
                        self._learned[batch.label] = Route(endpoint, via_relay=False)

    # --- the proxy's control socket ----------------------------------------------------------

    def _command(self, command: bytes) -> list[bytes]:
        """Send the proxy a command and take its reply ([] when the proxy is gone)."""
        if not self._threads[0].is_alive():
            return []
        self._control.send(command)
        if not self._control.poll(_CONTROL_TIMEOUT_MS):
            if self._threads[0].is_alive():
                raise RuntimeError(f"the proxy did not answer {command.decode()} within {_CONTROL_TIMEOUT_MS} ms")
            return []
        return self._control.recv_multipart()

    def _read_statistics(self, finished: bool = False) -> None:
        frames = self._command(b"STATISTICS")
        with self._lock:
            if len(frames) == 8:
                self._stats.current = [int.from_bytes(frame, "little") for frame in frames]
            if finished:
                self._stats.done = [a + b for a, b in zip(self._stats.done, self._stats.current, strict=True)]
                self._stats.current = [0] * 8
