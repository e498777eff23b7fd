"""The bootstrap service: where agents register and find each other.

One address lists every agent of the cluster, so one address is enough for
kvtop to discover it. Agents register their `AgentInfo` (a newer incarnation
of the same instance rank replaces the older one); decode ranks resolve a
prefill instance to its ranks; anyone may list all agents.

The service is a border post and forgets: a registration that fails
`registration.registration_problem` (a bad endpoint, role, rank or size) is refused
and counted (`rejected_invalid`, its name and reason kept in `refused`); an
agent re-registers every `REFRESH_S`, and an entry not refreshed for
`ENTRY_TTL_S` expires (the agent died); an agent leaving cleanly deregisters.
An expired entry is still listed apart (`AgentList.expired`) for `EXPIRED_KEPT_S`, so that
`kvtop check` run a minute after a crash still reports the rank gone instead of forgetting it.

No client fills the service: a client is the address its registrations come from (TCP: the peer's IP;
ZeroMQ tells the service, the client cannot choose it), and it holds at most `max_per_client` entries,
live or expired; past that its registrations are refused (`refused_client_limit`), so a client that
registers names by the thousand locks out no rank registering from elsewhere. Its entries expire as any
other and give its share back. Each refusal names the client (`AgentList.refused`: the latest refusal
of each of the last `REFUSED_KEPT` clients refused, with how many of theirs were).
A listing must reach its readers in one frame (`MAX_CONTROL_FRAME`): the entries it holds, encoded, take at most
`MAX_LISTING_BYTES`, half for live entries (a client its `max_per_client` share of that half) and half for expired
ones (the oldest go first); a registration past the live half is refused the same way.
A live entry belongs to the client that registered it: a registration of the same rank from another client
(whatever incarnation it claims) is refused (`refused_takeover`) until that entry expires, and so is a
deregistration from another client, so nobody who reaches an insecure service redirects decode ranks' data to
an endpoint of theirs; a rank restarted on the same host replaces its entry at once. Every new incarnation that
takes an entry (live, or expired and registered from another client) is counted (`replaced`) and named
(`AgentList.replaced`, the latest `REFUSED_KEPT`). A rank refused so that goes on refreshing is listed apart
(`AgentList.taken`, the latest `REFUSED_KEPT`, each until it stops refreshing for `ENTRY_TTL_S`): a view started
after the takeover still hears it. An endpoint must name the client's own address (an IP
literal; see `registration.foreign_endpoint`) unless it is in the service's `endpoint_networks`; link-local
and metadata addresses never (`rejected_invalid`). CURVE is what authenticates a client: without it, the
client's address is all the service knows of it.
A relay (role `relay`) registers, refreshes and expires the same way, under a key of its own (its name
never clashes with a rank's), and is listed apart (`AgentList.relays`); an expired relay is just dropped.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

import zmq

from transport.config import Role
from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, dialing, serving
from transport.errors import BootstrapError, CallAbandoned, FrameRejected, RegistrationRefused
from transport.limits import cannot_open
from transport.reach import why_silent
from transport.registration import RELAY_ROLE, TAKEN_LIVE, Network, entry_name, registration_problem
from transport.service import ServiceThread
from transport.sockets import LIST_FRAME, SMALL_FRAME, bind, decode_routed, open_socket, send_now
from transport.wire import (
    LISTED_BY_BOOTSTRAP,
    MAX_CONTROL_FRAME,
    AgentInfo,
    AgentList,
    BootstrapReply,
    BootstrapRequest,
    Deregister,
    FrameDecoder,
    ListAgents,
    Refusal,
    RefusedNote,
    Register,
    Registered,
    Resolve,
    Route,
    cut_text,
    encode,
)

_POLL_MS = 100
_STOP_POLL_S = 0.1
"""How often a client call waiting for its answer looks at its `stop` event."""
_RELAY_RANK = -1
"""The rank of a relay's key: no rank's key is a relay's."""
_Key = tuple[str, int, int | None, int | None]
"""An entry's key: its instance, its rank (`_RELAY_RANK` for a relay), its pipeline stage past the first (None for
the first, sent as 0 or None, and for a server without stages: two stages' TP3 are two entries, one label one) and
its DP replica (None: of none; two replicas' TP0 are two entries)."""
_R = TypeVar("_R", Registered, Route, AgentList)
REFRESH_S = 1.0
"""How often an agent registers again, so that the service knows it is still there."""
ENTRY_TTL_S = 5.0
"""An entry not refreshed for this long expires."""
MAX_ENTRIES = 4096
"""Registrations beyond this many entries are refused (a flood of names cannot grow the service)."""
MAX_PER_CLIENT = MAX_ENTRIES // 4
"""Entries one client may hold (live, and expired ones apart): a flood from one address takes a quarter of
the service at most."""
REFUSED_KEPT = 16
"""Clients (and roles) whose latest refusal is kept (the oldest goes first)."""
OUSTED_KEPT = 4
"""Incarnations an entry's holder replaced that are kept, to refuse if they register again."""
EXPIRED_KEPT_S = 600.0
"""How long an expired entry is still listed as gone (until its rank registers again)."""
MAX_LISTING_BYTES = MAX_CONTROL_FRAME - (256 << 10)
"""The encoded entries a listing holds, at most (the rest of the frame: counters, refusals). Entries of 1.7 KB
each (the longest fields allowed) made a listing of 4096 of them 6.4 MB, which every reader dropped unread:
a cluster no view could list."""
LIVE_BYTES = MAX_LISTING_BYTES // 2
"""Of those, the live entries' (the expired ones take the other half)."""


class BootstrapServer(ServiceThread):
    """A ROUTER socket served by one thread until `close()`."""

    def __init__(
        self,
        endpoint: str = "",
        host: str = "127.0.0.1",
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        entry_ttl_s: float = ENTRY_TTL_S,
        curve: CurveKeys | None = None,
        max_per_client: int = MAX_PER_CLIENT,
        endpoint_networks: Sequence[Network] = (),
    ) -> None:
        """`curve`: serve with CURVE (only clients on the keys' allow-list are answered); `max_per_client`:
        entries one client address may hold (a bench whose agents all run on one host gives more);
        `endpoint_networks`: where endpoints may be besides the registering client's own address (hosts whose
        data network is not the one they reach the service on)."""
        super().__init__("bootstrap")
        self._context = context or zmq.Context.instance()
        self._socket = open_socket(self._context, zmq.ROUTER, SMALL_FRAME, serving(curve))
        self.endpoint = bind(self._socket, endpoint, host)
        self.entry_ttl_s = entry_ttl_s
        self.max_per_client = max_per_client
        self.endpoint_networks = tuple(endpoint_networks)
        self.counters = Counters(
            ("requests", "expired", "deregistered", "replaced", "refused_client_limit", "refused_takeover",
             *rejection_names())
        )  # fmt: skip
        self._replacements: dict[_Key, str] = {}
        """The latest new incarnations that took an entry (`_replaced`'s lines), the newest last."""
        self._refusals: dict[tuple[str, str], tuple[int, str, float]] = {}
        """(client, role) -> (its registrations refused, the latest one's `name: why`, when: monotonic), the newest
        last: a host's refused decode rank is not hidden by its refused prefill rank."""
        self._agents: dict[_Key, AgentInfo] = {}
        self._refreshed: dict[_Key, float] = {}
        self._owners: dict[_Key, str] = {}
        """The client each entry was registered from (the latest registration's)."""
        self._held: Counter[str] = Counter()
        """Live entries per client."""
        self._sizes: dict[_Key, int] = {}
        """Each live entry's encoded size."""
        self._bytes: Counter[str] = Counter()
        """Live entries' encoded bytes per client."""
        self._live_bytes = 0
        self._expired_bytes = 0
        self._client_bytes = LIVE_BYTES * max_per_client // MAX_ENTRIES
        """The live entries' bytes one client may hold: its share of `LIVE_BYTES` as of the entries."""
        self._expired: dict[_Key, tuple[float, AgentInfo, str]] = {}
        """Entries that expired: when, who, and from which client (oldest first)."""
        self._expired_held: Counter[str] = Counter()
        """Expired entries per client."""
        self._ousted: dict[_Key, tuple[int, ...]] = {}
        """The incarnations a live entry's holder replaced (the latest `OUSTED_KEPT`), dropped with the entry: one
        that registers again is a second live process claiming the rank, not a restart, and is refused (two sidecars
        whose logs name no instance each took `prefill-0/TP0` from the other every refresh, a view of it alternating
        between two servers' failures)."""
        self._taken: dict[_Key, tuple[float, AgentInfo]] = {}
        """Ranks refused because another client holds their entry: when last refused, the registration (oldest
        first)."""
        self._decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)

    def close(self) -> None:
        """Stop serving and close the socket (returns within one poll interval)."""
        super().close()
        self._socket.close(linger=0)

    def agents(self) -> list[AgentInfo]:
        """Every registered agent (a copy), relays apart."""
        return [agent for key, agent in self._agents.items() if key[1] != _RELAY_RANK]

    def relays(self) -> list[AgentInfo]:
        """Every registered relay."""
        return [agent for key, agent in self._agents.items() if key[1] == _RELAY_RANK]

    @property
    def refused(self) -> list[str]:
        """The latest refused registration of each client (and role) refused lately, `name: why (from CLIENT...)`."""
        return [note.line for note in self.refusals()]

    def refusals(self) -> list[RefusedNote]:
        """`refused`'s lines, each with its rank's role and how long ago it was refused."""
        now = time.monotonic()
        return [
            RefusedNote(cut_text(f"{line} (from {client}" + (f", {count} of its {role + ' ' if role else ''}"
                                                          f"registrations refused)" if count > 1 else ")")),
                        role, max(0.0, now - at))
            for (client, role), (count, line, at) in self._refusals.items()
        ]  # fmt: skip

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._socket.poll(_POLL_MS):
                self._handle(self._socket.recv_multipart(copy=False))
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        for key in [key for key, at in self._refreshed.items() if now - at > self.entry_ttl_s]:
            self._forget_expired(key)
            if key[1] != _RELAY_RANK:
                self._keep_expired(key, now)
            self._forget(key)
            self.counters.add("expired")
        while self._expired and (
            now - next(iter(self._expired.values()))[0] > EXPIRED_KEPT_S or len(self._expired) > MAX_ENTRIES
        ):
            self._forget_expired(next(iter(self._expired)))
        for key in [key for key, (at, _) in self._taken.items() if now - at > ENTRY_TTL_S]:
            del self._taken[key]

    def _keep_expired(self, key: _Key, now: float) -> None:
        """List an entry that expired as gone; a client past its share of them loses its oldest first."""
        client = self._owners[key]
        self._expired[key] = (now, self._agents[key], client)
        self._expired_held[client] += 1
        self._expired_bytes += self._sizes[key]
        if self._expired_held[client] > self.max_per_client:
            self._forget_expired(next(k for k, (_, _, owner) in self._expired.items() if owner == client))
        while self._expired_bytes > MAX_LISTING_BYTES - LIVE_BYTES:
            self._forget_expired(next(iter(self._expired)))

    def _forget_expired(self, key: _Key) -> None:
        expired = self._expired.pop(key, None)
        if expired is not None:
            self._expired_bytes -= _size(expired[1])
            self._expired_held[expired[2]] -= 1
            if not self._expired_held[expired[2]]:
                del self._expired_held[expired[2]]

    def _forget(self, key: _Key) -> None:
        self._agents.pop(key, None)
        self._ousted.pop(key, None)
        self._refreshed.pop(key, None)
        owner = self._owners.pop(key, None)
        size = self._sizes.pop(key, 0)
        self._live_bytes -= size
        if owner is not None:
            _take(self._bytes, owner, size)
            _take(self._held, owner, 1)

    def _handle(self, frames: list[zmq.Frame]) -> None:
        routed = decode_routed([frame.bytes for frame in frames], self._decoder, self.counters)
        if routed is None:
            return
        identity, request = routed
        self.counters.add("requests")
        self._socket.send_multipart([identity, encode(self._answer(request, _client(frames[0])))])

    def _answer(self, request: BootstrapRequest, client: str) -> BootstrapReply:
        if isinstance(request, Register):
            return self._register(request, client)
        if isinstance(request, Deregister):
            for key in (
                (request.instance, request.rank, request.pp or None, request.dp),
                (request.instance, _RELAY_RANK, None, None),
            ):
                known, owner = self._agents.get(key), self._owners.get(key)
                if known is None or known.incarnation != request.incarnation:
                    continue
                if owner != client:
                    problem = f"{entry_name(known)}: deregistered from {client}, {_owned(known, owner)}"
                    self.counters.add("refused_takeover")
                    self._refusal(client, known.role, problem)
                    return Refusal(request.req_id, f"deregistration refused: {problem}")
                self._forget(key)
                self.counters.add("deregistered")
            return Registered(request.req_id)
        if isinstance(request, Resolve):
            named = (a for a in self.agents() if a.instance == request.instance and not a.events_only)
            ranks = sorted(named, key=lambda a: a.rank)  # a log sidecar moves no KV: never a route
            return Route(request.req_id, request.instance, ranks)
        expired = [agent for _, agent, _ in self._expired.values()]
        refusals = self.refusals()
        return AgentList(request.req_id, self.agents(), self.counters.snapshot(), [note.line for note in refusals],
                         expired, self.relays(), lister=LISTED_BY_BOOTSTRAP,
                         replaced=list(self._replacements.values()), refusals=refusals,
                         taken=[agent for _, agent in self._taken.values()])  # fmt: skip

    def _register(self, request: Register, client: str) -> Registered | Refusal:
        agent = request.agent
        key = (
            (agent.instance, _RELAY_RANK, None, None)
            if agent.role == RELAY_ROLE
            else (agent.instance, agent.rank, agent.pp or None, agent.dp)
        )
        owner, known = self._owners.get(key), self._agents.get(key)
        size, old = _size(agent), self._sizes.get(key, 0)
        if problem := registration_problem(agent, client, self.endpoint_networks):
            self.counters.reject("invalid")
        elif known is not None and owner != client:
            problem = f"registered from {client}, {_owned(known, owner)}; {TAKEN_LIVE}"
            self.counters.add("refused_takeover")
            self._keep_taken(key, agent)
        elif known is not None and agent.incarnation in self._ousted.get(key, ()):
            problem = (
                f"incarnation {known.incarnation} ({known.data_endpoint or known.event_endpoint}) took it from this "
                f"one, which still runs: two processes claim the rank (sidecars following two servers' logs need an "
                f"--instance each); {TAKEN_LIVE}"
            )
            self.counters.add("refused_takeover")
            self._keep_taken(key, agent)
        elif owner != client and self._held[client] >= self.max_per_client:
            problem = f"the client holds {self.max_per_client} entries already, the most one client may"
            self.counters.add("refused_client_limit")
        elif self._bytes[client] - (old if owner == client else 0) + size > self._client_bytes:
            problem = f"the client's entries take {self._bytes[client]} B already, of {self._client_bytes} B it may"
            self.counters.add("refused_client_limit")
        elif key not in self._agents and len(self._agents) >= MAX_ENTRIES:
            problem = f"the service already lists {MAX_ENTRIES} agents"
            self.counters.reject("invalid")
        elif self._live_bytes - old + size > LIVE_BYTES:
            problem = f"the service's entries take {self._live_bytes} B already, of {LIVE_BYTES} B a listing holds"
            self.counters.reject("invalid")
        if problem:
            self._refusal(client, agent.role, f"{entry_name(agent)}: {problem}")
            return Refusal(request.req_id, f"registration of {entry_name(agent)} refused: {problem}")
        if owner is not None:
            _take(self._bytes, owner, old)
        if owner != client:
            if owner is not None:
                _take(self._held, owner, 1)
            self._held[client] += 1
            self._owners[key] = client
        self._bytes[client] += size
        self._live_bytes += size - old
        self._sizes[key] = size
        self._agents[key] = agent
        self._refreshed[key] = time.monotonic()
        self._replaced(key, agent, client, known)
        self._forget_expired(key)
        taken = self._taken.get(key)
        if taken is not None and taken[1].incarnation == agent.incarnation:  # it holds its entry again
            del self._taken[key]
        return Registered(request.req_id)

    def _keep_taken(self, key: _Key, agent: AgentInfo) -> None:
        """List a rank refused because another client holds its entry, while it goes on refreshing."""
        if agent.role == RELAY_ROLE:
            return
        self._taken.pop(key, None)
        self._taken[key] = (time.monotonic(), agent)
        if len(self._taken) > REFUSED_KEPT:
            del self._taken[next(iter(self._taken))]

    def _replaced(self, key: _Key, agent: AgentInfo, client: str, known: AgentInfo | None) -> None:
        """Count and name a new incarnation taking a live entry, or an expired one registered from elsewhere."""
        expired = self._expired.get(key)
        if known is not None and known.incarnation != agent.incarnation:
            how = f"incarnation {known.incarnation} replaced by {agent.incarnation} (from {client})"
            self._ousted[key] = (*self._ousted.get(key, ())[1 - OUSTED_KEPT :], known.incarnation)
        elif known is None and expired is not None and expired[2] != client:
            how = (
                f"expired incarnation {expired[1].incarnation} from {expired[2]} replaced by "
                f"{agent.incarnation} from {client}"
            )
        else:
            return
        self.counters.add("replaced")
        self._replacements.pop(key, None)
        self._replacements[key] = f"{entry_name(agent)}: {how}"
        if len(self._replacements) > REFUSED_KEPT:
            del self._replacements[next(iter(self._replacements))]

    def _refusal(self, client: str, role: str, line: str) -> None:
        """Keep `client`'s latest refusal of a rank of `role` (and count them), the newest last."""
        key = (client, role if role in (*Role, RELAY_ROLE) else "")
        count, _, _ = self._refusals.pop(key, (0, "", 0.0))
        self._refusals[key] = (count + 1, line, time.monotonic())
        if len(self._refusals) > REFUSED_KEPT:
            del self._refusals[next(iter(self._refusals))]


def _size(agent: AgentInfo) -> int:
    """What `agent` takes in a listing, encoded."""
    return len(encode(agent))


def _owned(known: AgentInfo, owner: str | None) -> str:
    """Whose a live entry is, for a refusal: its incarnation, data endpoint and client."""
    endpoint = known.data_endpoint or known.event_endpoint
    return f"but incarnation {known.incarnation} ({endpoint}) from {owner} holds it live"


def _take(counter: Counter[str], client: str, count: int) -> None:
    """`count` less for `client`, which is dropped at none (a client gone costs nothing)."""
    counter[client] -= count
    if counter[client] <= 0:
        del counter[client]


def _client(frame: zmq.Frame) -> str:
    """Who sent `frame`: the peer's address as ZeroMQ saw it (for TCP, its IP; for IPC, its process)."""
    try:
        return str(frame.get("Peer-Address"))
    except zmq.ZMQError:
        return "this process"  # inproc: no address


class BootstrapClient:
    """Blocking request/reply to a bootstrap service, with a deadline per call.

    A reply that breaks the wire format is counted in `counters` (`rejected_<reason>`) and skipped, like
    a reply to another request: only a refusal or the deadline ends a call with `BootstrapError`.
    """

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 5.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        counters: Counters | None = None,
        curve: CurveKeys | None = None,
        service: str = "bootstrap",
        answered_before: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """`service`: what the errors call the other end (a relay answers listings too); `answered_before`: it
        answered this caller with these keys before, so a call it leaves unanswered says it stopped answering,
        with no hint about CURVE keys; `stop`: once set, a call waiting for its answer gives up within
        `_STOP_POLL_S` (`CallAbandoned`)."""
        self._stop = stop
        self.endpoint = endpoint
        self.service = service
        self.timeout_s = timeout_s
        self._answered_before = answered_before
        self.counters = counters or Counters(rejection_names())
        self._curve = curve is not None
        try:
            self._socket = open_socket(context or zmq.Context.instance(), zmq.DEALER, LIST_FRAME, dialing(curve))
        except zmq.ZMQError as error:  # this process is out of files or sockets: a failed call, not a crash
            raise BootstrapError(f"cannot open a socket to the {service} {endpoint}: {cannot_open(error)}") from None
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as error:
            self._socket.close(linger=0)
            raise BootstrapError(
                f"bad {service} address {endpoint!r} ({error.strerror}); expected tcp://HOST:PORT"
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

    def deregister(self, agent: AgentInfo) -> None:
        """Drop `agent`'s entry (a newer incarnation's entry stays)."""
        deregister = Deregister(next(self._ids), agent.instance, agent.rank, agent.incarnation, agent.pp, agent.dp)
        self._call(deregister, Registered)

    def resolve(self, instance: str) -> list[AgentInfo]:
        return self._call(Resolve(next(self._ids), instance), Route).ranks

    def list_agents(self) -> list[AgentInfo]:
        return self.listing().agents

    def listing(self) -> AgentList:
        """Every agent, with the service's counters and its latest refused registrations."""
        return self._call(ListAgents(next(self._ids)), AgentList)

    def _call(self, request: BootstrapRequest, expected: type[_R]) -> _R:
        if not send_now(self._socket, encode(request)):
            raise BootstrapError(f"{self.service} {self.endpoint} takes no request (no connection){self._hint()}")
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self._stop is not None and self._stop.is_set():
                raise CallAbandoned(f"{self.service} {self.endpoint}: call abandoned, this process is stopping")
            if not self._socket.poll(int((left if self._stop is None else min(left, _STOP_POLL_S)) * 1000) + 1):
                continue
            try:
                reply = self._decoder.decode(self._socket.recv())
            except FrameRejected as rejected:
                self.counters.reject(rejected.reason)
                continue
            if isinstance(reply, Refusal):
                raise RegistrationRefused(f"{self.service} {self.endpoint} refused: {reply.message}")
            if reply.req_id == request.req_id and isinstance(reply, expected):
                return reply
        if self._answered_before:
            raise BootstrapError(
                f"{self.service} {self.endpoint} stopped answering (none within {self.timeout_s:.1f}s)"
            )
        raise BootstrapError(
            f"{self.service} {self.endpoint} did not answer within {self.timeout_s:.1f}s{self._hint()}"
        )

    def _hint(self) -> str:
        """Why a service may not answer at all (`reach.why_silent`: no address, nothing listening, no connection),
        else, as it takes connections, its CURVE keys (not when it answered these keys before)."""
        if self._answered_before:
            return ""
        if why := why_silent(self.endpoint):
            return f" ({why})"
        return (
            " (with CURVE: does it serve these keys?)"
            if self._curve
            else " (if it serves CURVE, pass its --curve-keys)"
        )
