"""The built-in load driver: a router that draws rooms and drives real transfers.

Like a PD router, it draws a random 63-bit bootstrap room per request, a prompt
length (so a KV size) from a log-normal distribution, a prefill and a decode
instance (among those under their share of `max_inflight`, so one instance
that stops answering holds only its share), and submits the room to every rank
of both instances. A room ends
when every rank reported a result; its outcome is the decode side's. A room
that a rank refuses counts as refused at once, but still holds a place under
`max_inflight` until the ranks that accepted it report (they hold its pages
till then); one that no decode rank reported (a rank died, or the results
never came) ends as lost. A supervisor tells the
router when a rank exits (`rank_lost`: its rooms stop waiting for it, its
instance gets no new rooms) and when it is back (`rank_back`).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq

from transport.bootstrap import BootstrapClient
from transport.config import Role
from transport.curve import CurveKeys
from transport.harness.control import ControlClient
from transport.kvpoll import KVPoll
from transport.wire import AgentInfo, RoomResult

_ROOM_BITS = 63


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Request rate, KV sizes and concurrency."""

    rate: float = 20.0
    """Rooms started per second."""
    median_pages: int = 64
    sigma: float = 0.8
    """Spread of the log-normal page count."""
    max_pages: int = 512
    max_inflight: int = 64
    result_timeout_s: float = 30.0
    """A room without every rank's result after this long ends without them (lost if no decode rank answered)."""
    seed: int | None = None


@dataclass
class WorkloadStats:
    """What the router saw, cumulative."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    refused: int = 0
    lost: int = 0
    rank_exits: int = 0
    """Ranks the supervisor reported gone (`Router.rank_lost`)."""
    ranks_down: int = 0
    """Of those, how many are not back."""
    dropped: int = 0
    """Arrivals no pair of instances took (a role with none up, or every instance at its share of max_inflight)."""
    unserved: str = ""
    """The roles with no instance whose every rank is up (`prefill`, `decode`, or both, comma-separated): no room
    starts until one is back ("" while both have one)."""
    bytes_moved: int = 0
    failures_by_class: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    """Per room that succeeded, end to end: the slowest decode rank's seconds from taking it to its instance's
    agreed answer (a rank's transfer alone, what `kvtop status` times, is shorter)."""

    @property
    def inflight(self) -> int:
        return self.started - self.succeeded - self.failed - self.refused - self.lost


@dataclass(eq=False)
class _Pending:
    room: int
    started: float
    waiting_for: set[str]
    decode_ranks: int
    instances: tuple[str, str]
    """Its prefill and decode instance."""
    refused: bool = False
    """A rank refused it: counted already, waiting only for the ranks that accepted it."""
    submits: dict[str, int] = field(default_factory=dict)
    """The req id of this room's Submit per rank label (to match a refusal)."""
    results: list[tuple[AgentInfo, RoomResult]] = field(default_factory=list)


class Router:
    """Submits rooms to agents found through the bootstrap service; call `step()` in a loop."""

    def __init__(self, bootstrap: str, spec: WorkloadSpec | None = None, curve: CurveKeys | None = None) -> None:
        """`curve`: the cluster's CURVE keys, to reach its bootstrap service and agents (None: plain TCP)."""
        self.spec = spec or WorkloadSpec()
        self._curve = curve
        self.stats = WorkloadStats()
        self._rng = random.Random(self.spec.seed)
        self._zmq = zmq.Context()
        with BootstrapClient(bootstrap, context=self._zmq, curve=curve) as client:
            agents = client.list_agents()
        self._instances: dict[Role, dict[str, list[AgentInfo]]] = {Role.PREFILL: {}, Role.DECODE: {}}
        for agent in sorted(agents, key=lambda a: (a.instance, a.rank)):
            self._instances[Role(agent.role)].setdefault(agent.instance, []).append(agent)
        if not self._instances[Role.PREFILL] or not self._instances[Role.DECODE]:
            raise ValueError(f"bootstrap {bootstrap} lists no complete prefill/decode pair ({len(agents)} agents)")
        self._clients = {a.label: (a, ControlClient(a.control_endpoint, self._zmq, curve)) for a in agents}
        self._pending: dict[int, _Pending] = {}
        self._inflight: Counter[str] = Counter()
        """Rooms in flight per instance."""
        self._by_submit: dict[tuple[str, int], int] = {}
        """(rank label, req id) of each pending room's Submits -> room."""
        self._down: set[str] = set()
        self._next_start = time.monotonic()

    def close(self) -> None:
        for _, client in self._clients.values():
            client.close()
        self._zmq.term()

    def rank_lost(self, label: str) -> None:
        """A rank exited: its instance gets no new rooms, and no room waits for its result any longer."""
        self._down.add(label)
        self.stats.rank_exits += 1
        self.stats.ranks_down = len(self._down)
        self._count_unserved()
        for pending in list(self._pending.values()):
            if label in pending.waiting_for:
                pending.waiting_for.discard(label)
                if not pending.waiting_for:
                    self._finish(pending)

    def rank_back(self, agent: AgentInfo) -> None:
        """A rank registered again (a new process): talk to its new control socket, give it rooms again."""
        old, client = self._clients[agent.label]
        client.close()
        self._clients[agent.label] = (agent, ControlClient(agent.control_endpoint, self._zmq, self._curve))
        ranks = self._instances[Role(agent.role)][agent.instance]
        ranks[ranks.index(old)] = agent
        self._down.discard(agent.label)
        self.stats.ranks_down = len(self._down)
        self._count_unserved()

    def _count_unserved(self) -> None:
        self.stats.unserved = ", ".join(str(role) for role in (Role.PREFILL, Role.DECODE) if not self._up(role))

    def step(self, now: float | None = None) -> None:
        """Start the rooms that are due, collect results; never blocks for long."""
        now = time.monotonic() if now is None else now
        while self._next_start <= now and len(self._pending) < self.spec.max_inflight:
            self._start_room(now)
            self._next_start += self._rng.expovariate(self.spec.rate)
        self._next_start = max(self._next_start, now - 1.0)
        for agent, client in list(self._clients.values()):
            for result in client.results():
                self._on_result(agent, result)
            for refusal in client.refusals:
                self._on_refusal(agent, refusal.req_id)
            client.refusals.clear()
        self._expire(now)

    def _draw_pages(self) -> int:
        pages = self._rng.lognormvariate(math.log(self.spec.median_pages), self.spec.sigma)
        return max(1, min(self.spec.max_pages, round(pages)))

    def _up(self, role: Role) -> list[str]:
        """The instances of `role` whose every rank is up."""
        return [name for name, ranks in self._instances[role].items() if not {a.label for a in ranks} & self._down]

    def _open(self, role: Role) -> list[str]:
        """The instances of `role` that are up and under their share of `max_inflight` among those up (a frozen
        instance fills its share and holds no more: the others go on)."""
        up = self._up(role)
        share = math.ceil(self.spec.max_inflight / max(1, len(up)))
        return [name for name in up if self._inflight[name] < share]

    def _start_room(self, now: float) -> None:
        prefills, decodes = self._open(Role.PREFILL), self._open(Role.DECODE)
        if not prefills or not decodes:
            self.stats.dropped += 1  # no pair to take it (a rank down, or every instance at its share): counted
            return
        room = self._rng.getrandbits(_ROOM_BITS)
        prefill = self._rng.choice(prefills)
        decode = self._rng.choice(decodes)
        pages = self._draw_pages()
        ranks = self._instances[Role.PREFILL][prefill] + self._instances[Role.DECODE][decode]
        decode_ranks = len(self._instances[Role.DECODE][decode])
        pending = self._pending[room] = _Pending(room, now, {a.label for a in ranks}, decode_ranks, (prefill, decode))
        self._inflight.update(pending.instances)
        self.stats.started += 1
        for agent in ranks:
            _, client = self._clients[agent.label]
            req_id = client.submit_nowait(room, pages, prefill if agent.role == Role.DECODE else "")
            pending.submits[agent.label] = req_id
            self._by_submit[(agent.label, req_id)] = room

    def _end(self, pending: _Pending) -> None:
        del self._pending[pending.room]
        self._inflight.subtract(pending.instances)
        for label, req_id in pending.submits.items():
            self._by_submit.pop((label, req_id), None)

    def _on_refusal(self, agent: AgentInfo, req_id: int) -> None:
        """A rank refused a room's Submit (pool full, say): the room cannot succeed; it counts as refused now."""
        room = self._by_submit.get((agent.label, req_id))
        if room is None:
            return
        pending = self._pending[room]
        if not pending.refused:
            pending.refused = True
            self.stats.refused += 1
        pending.waiting_for.discard(agent.label)
        if not pending.waiting_for:
            self._end(pending)

    def _on_result(self, agent: AgentInfo, result: RoomResult) -> None:
        pending = self._pending.get(result.room)
        if pending is None:
            return
        pending.results.append((agent, result))
        pending.waiting_for.discard(agent.label)
        if not pending.waiting_for:
            self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        """Every rank that can still answer did: the outcome is the decode side's.

        Failed when a decode rank says so; succeeded when every decode rank says so; lost otherwise.
        """
        self._end(pending)
        if pending.refused:
            return
        decode_results = [r for a, r in pending.results if a.role == Role.DECODE]
        failed = [r for r in decode_results if r.state == KVPoll.Failed]
        if not failed and len(decode_results) < pending.decode_ranks:
            self.stats.lost += 1
            return
        if not failed:
            self.stats.succeeded += 1
            self.stats.bytes_moved += sum(r.nbytes for r in decode_results)
            self.stats.latencies_s.append(max(r.seconds for r in decode_results))
            del self.stats.latencies_s[:-10_000]
            return
        self.stats.failed += 1
        origins = [r for a, r in pending.results if r.state == KVPoll.Failed and r.origin == a.label]
        for origin in origins or failed[:1]:
            self.stats.failures_by_class[origin.reason_class or "other"] += 1

    def _expire(self, now: float) -> None:
        """Rooms some rank never reported end with the results they have (lost when no decode rank answered)."""
        for pending in list(self._pending.values()):
            if now - pending.started > self.spec.result_timeout_s:
                self._finish(pending)
