"""The collector: one thread that owns the subscriber, discovers agents and feeds the model.

No input ends the thread: a bootstrap entry it cannot use is counted and named
(`model.intake.bad_entries`), a frame it cannot decode is counted by reason, a
delivery the model cannot apply is counted and logged with its traceback. If the
thread dies anyway (a bug), that is logged with its traceback and kept in
`error` and `model.intake.error`, which the views and the dashboard show.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Refused
from kvtop.sources.recorder import CollectorRecorder
from transport.bootstrap import BootstrapClient
from transport.counters import rejection_names
from transport.curve import CurveKeys
from transport.errors import BootstrapError
from transport.plane.events import Event, Snapshot
from transport.plane.relay import listed_by_relay
from transport.plane.subscriber import Delivered, EventSubscriber
from transport.registration import agent_problem
from transport.thread_names import name_os_thread
from transport.wire import AgentInfo, AgentList

DISCOVER_EVERY_S = 2.0
PASS_S = 0.01
"""A collector pass starts at most this often: what arrives meanwhile waits in the sockets' queues and is
applied in bulk, so the pass's own work (the lock, the account, the recorder's) is spread over a pass's
worth of batches, not paid per batch (at 1024 agents, 20k batches/s). Data ages by this much at most."""
SWEEP_EVERY_S = 0.5
"""Retiring finished rooms walks every open room: not on every poll."""
GC_THRESHOLDS = (20_000, 20, 20)
"""A collecting process keeps a big long-lived heap (the model) and allocates fast while applying events (and,
the dashboard's model process, building frames): at CPython's default (700, 10, 10) a full collection (~100 ms
at 100k rooms) ran several times a minute; with these, young objects die before promotion and full collections
are rare."""

log = logging.getLogger("kvtop.collector")


@dataclass(frozen=True, slots=True)
class Heard:
    """News for an event tail: what the model accepted of one delivery (`snapshot`: an agent's memory)."""

    label: str
    events: Sequence[Event]
    snapshot: bool


@dataclass(frozen=True, slots=True)
class Lost:
    """News for an event tail: `batches` event batches of one agent incarnation never arrived."""

    label: str
    incarnation: int
    batches: int
    ts: float


News = Heard | Lost


def tune_gc() -> tuple[int, int, int]:
    """The garbage collector's thresholds for a process that collects (`GC_THRESHOLDS`); returns the old ones."""
    previous = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    return previous


class Collector:
    """Keeps `model` current from every agent the bootstrap address lists (new agents are picked up)
    and from agents given by their event endpoints.

    `bootstrap` may be a relay's address (its ROUTER answers the bootstrap's `ListAgents`): when the listing
    names a relay, the collector subscribes once, to the relay, and asks it for every agent's snapshot; the
    ranks the relay lists are registered as a bootstrap's are.
    """

    def __init__(
        self,
        bootstrap: str,
        endpoints: list[str] | None = None,
        model: ClusterModel | None = None,
        news: queue.SimpleQueue[News] | None = None,
        curve: CurveKeys | None = None,
        recorder: CollectorRecorder | None = None,
        service: str = "bootstrap",
    ) -> None:
        """`service`: what `bootstrap` was given as (`bootstrap`, `relay`), as its errors call it;
        `news`: where to put each delivery's accepted events and each gap as they happen (an event tail);
        `curve`: the cluster's CURVE keys (agents serving CURVE answer only an allowed client);
        `recorder`: told everything the collector does to the model, in order (kvtop.record), from a
        keyframe of the model as it is at `start()`."""
        self.bootstrap = bootstrap
        self.service = service
        self.endpoints = endpoints or []
        self.model = model or ClusterModel()
        self.model.correct_clocks = True  # envelopes arrive now: their send times tell each agent's clock
        self.lock = threading.Lock()
        """Held while the model changes; views take it to read a consistent model."""
        self.error = ""
        """The last discovery error ("" while the bootstrap address answers), or why the thread died."""
        self.died = False
        """True once the collecting thread ended by an error (the model is no longer kept current)."""
        self.curve = curve
        self._subscriber = EventSubscriber(curve=curve)
        self._news = news
        self.recorder = recorder
        self._deliveries_failed = 0
        self._synced = False
        self._listed = False
        """Whether the bootstrap (or relay) answered a listing: one that stops is then said to stop answering."""
        self._relays_answered: set[str] = set()
        """The relays a bootstrap lists that answered a listing of their own (`_relay_said`)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtop-collector", daemon=True)

    def start(self, discover_timeout_s: float = 2.0, stop: threading.Event | None = None) -> Collector:
        """Discover the agents once (raises `BootstrapError` if nobody answers, `CallAbandoned` once `stop` is
        set while it waits for the answer), then collect in the background."""
        if self.recorder is not None:
            with self.lock:
                self.recorder.tick(self.model, time.time())
        self._discover(discover_timeout_s, stop)
        self._thread.start()
        return self

    @property
    def thread(self) -> threading.Thread:
        """The collecting thread (a benchmark measures its CPU apart from ZeroMQ's I/O threads)."""
        return self._thread

    def synced(self) -> bool:
        """True once every discovered agent's snapshot was applied (or its request timed out)."""
        return self._synced

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until every agent's snapshot was applied (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while not self.synced() and time.monotonic() < deadline and not self.died:
            time.sleep(0.02)
        return self.synced()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._subscriber.close()

    def heard(self) -> bool:
        """True once some agent answered (a snapshot or a batch arrived, even one held for its snapshot)."""
        if self._subscriber.counters["batches"] or self._subscriber.counters["snapshots"]:
            return True
        with self.lock:
            return any(view.last_seen for view in self.model.ranks.values())

    def last_heard(self) -> float:
        """When an agent was last heard (the arrival of its latest batch or snapshot, wall time; 0.0 before any)."""
        with self.lock:
            return max((view.last_seen for view in self.model.ranks.values()), default=0.0)

    def _discover(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        for endpoint in self.endpoints:
            self._subscriber.connect_endpoint(endpoint)
        recorder, now = self.recorder, time.time()
        with self.lock:  # an endpoint is a rank (gone) until an agent answers there
            for endpoint in self.endpoints:
                if endpoint not in self._subscriber.answered:
                    self.model.expect(endpoint)
                    if recorder is not None:
                        recorder.expected(endpoint, now)
        if not self.bootstrap:
            self._synced = self._subscriber.synced()
            with self.lock:
                self._update_intake()
                if recorder is not None:
                    recorder.accounted(self.model, now)
            return
        with BootstrapClient(
            self.bootstrap, timeout_s=timeout_s, curve=self.curve, answered_before=self._listed, stop=stop,
            service=self.service,
        ) as client:  # fmt: skip
            listing = client.listing()
        self._listed = True
        relay = next((relay for relay in listing.relays if not agent_problem(relay)), None)
        if relay is not None:
            listed = [agent for agent in listing.agents if not agent_problem(agent)]
            self._subscriber.connect_relay(relay, [agent.label for agent in listed])
            self._subscriber.hear_taken([agent for agent in listing.taken if not agent_problem(agent)], direct=False)
            usable = listed
        else:
            usable = [agent for agent in listing.agents if not self._subscriber.connect(agent)]
            # running, its entry another client's: heard by its events (never dialed), apart from the taker's
            self._subscriber.hear_taken([agent for agent in listing.taken if not agent_problem(agent)], direct=True)
        where, said, unanswered = self._relay_said(relay, listing, timeout_s) if relay is not None else ("", None, "")
        gone = [agent for agent in listing.expired if not agent_problem(agent)]
        now = time.time()
        with self.lock:
            if relay is None or said is not None:
                self._upstream(where, said)
            registered = [agent for agent in gone if agent.label not in self.model.ranks]  # never connected to
            for agent in [*registered, *usable]:
                self.model.register(agent)
                if recorder is not None:
                    recorder.registered(agent, now)
            # a relay's listing counts what the relay did (its frames, its entries), not what a service refused
            self.model.intake.bootstrap_counters = {} if listed_by_relay(listing) else listing.counters
            self.model.intake.bootstrap_refused = listing.refused
            self.model.intake.bootstrap_refusals = self._refusals(listing, now)
            self.model.intake.bootstrap_replaced = listing.replaced
            self._update_intake()
            if recorder is not None:
                recorder.accounted(self.model, now)
        self._synced = self._subscriber.synced()
        if unanswered:
            raise BootstrapError(unanswered)

    def _refusals(self, listing: AgentList, now: float) -> list[Refused]:
        """The listing's refusals on this machine's clock; one listed before keeps its time (its age as each
        listing says it moves with the latency of the answer)."""
        known = {(refused.line, refused.role): refused for refused in self.model.intake.bootstrap_refusals}
        return [known.get((note.line, note.role)) or Refused(note.line, note.role, now - note.age_s)
                for note in listing.refusals]  # fmt: skip

    def _relay_said(self, relay: AgentInfo, listing: AgentList, timeout_s: float) -> tuple[str, AgentList | None, str]:
        """The address and listing of the relay this collector subscribes through, which says what of its upstreams
        stopped answering it: `listing` when the address listed is the relay's, else the relay's own, asked of it (a
        bootstrap service knows nothing of a relay's upstreams). None and why when the relay does not answer."""
        if listed_by_relay(listing):
            return self.bootstrap, listing, ""
        address = relay.snapshot_endpoint
        try:
            with BootstrapClient(address, timeout_s=timeout_s, curve=self.curve, service="relay",
                                 answered_before=address in self._relays_answered) as client:  # fmt: skip
                said = client.listing()
        except BootstrapError as error:
            return address, None, f"{error} (the relay the bootstrap {self.bootstrap} lists: its ranks are heard there)"
        self._relays_answered.add(address)
        return address, said, ""

    def _upstream(self, relay: str, said: AgentList | None) -> None:
        """What the relay at `relay` subscribed through (`said`: its listing; None: no relay) says of its upstreams
        that stopped answering it, into the model's intake (every view, and a recording, read it there)."""
        intake = self.model.intake
        errors = list(said.upstream_errors) if said is not None else []
        intake.upstream_relay = relay if errors else ""
        intake.upstream_errors = errors
        intake.upstream_kept = list(said.kept) if said is not None and errors else []

    def _update_intake(self) -> None:
        intake = self.model.intake
        intake.counters = {**self._subscriber.counters.snapshot(), "deliveries_failed": self._deliveries_failed}
        intake.bad_entries = dict(self._subscriber.refused)
        intake.unreachable = dict(self._subscriber.unreachable)
        intake.records_refused = dict(self._subscriber.records_refused)

    def _run(self) -> None:
        name_os_thread()
        try:
            self._collect()
        except Exception:
            self.error = f"the collector stopped: {traceback.format_exc(limit=1).strip().splitlines()[-1]}"
            self.died = True
            log.exception("the collector thread died; the model is no longer kept current")
            with self.lock:
                self.model.intake.error = self.error

    def _collect(self) -> None:
        next_discovery = time.monotonic() + DISCOVER_EVERY_S
        next_sweep = 0.0
        while not self._stop.is_set():
            started = time.monotonic()
            deliveries = self._subscriber.poll(0.05)
            now = time.time()
            recorder = self.recorder
            with self.lock:
                for delivered in deliveries:  # the recorder records each delivery as it is applied, in order
                    if recorder is not None:
                        recorder.delivered(
                            delivered.label, delivered.item, now, delivered.frame, len(delivered.refused)
                        )
                    self._apply(delivered, now)
                self._account(now)
                self._update_intake()
                if now >= next_sweep:
                    held = not self._synced  # the incidents wait for every agent's snapshot
                    self.model.sweep(now, hold_incidents=held)
                    next_sweep = now + SWEEP_EVERY_S
                    if recorder is not None:
                        recorder.swept(now, held)
                if recorder is not None:
                    recorder.accounted(self.model, now)
                    recorder.tick(self.model, now)
            self._synced = self._subscriber.synced()
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + DISCOVER_EVERY_S
                try:
                    self._discover(1.0)
                    self.error = ""
                except BootstrapError as error:
                    self.error = str(error)
            if deliveries:  # a busy pass: let the next pass's batches gather (an idle poll waits by itself)
                self._stop.wait(PASS_S - (time.monotonic() - started))

    def _apply(self, delivered: Delivered, now: float) -> None:
        """One delivery into the model; one it cannot apply is counted and logged, and the next one goes on. The
        records the subscriber refused of it (salvage) count as the model's rejected events."""
        self.model.rejected += len(delivered.refused)
        try:
            accepted = self.model.apply(delivered.label, delivered.item, now)
        except Exception:
            self._deliveries_failed += 1
            log.exception("a delivery from %s could not be applied (skipped)", delivered.label)
            return
        if self._news is not None:
            self._news.put(Heard(delivered.label, accepted, isinstance(delivered.item, Snapshot)))

    def _account(self, now: float) -> None:
        """What the subscriber counted, into the model: gaps (news of each), rejected frames, answered endpoints."""
        subscriber, model = self._subscriber, self.model
        for endpoint in subscriber.answered:
            if endpoint in model.ranks:
                model.forget_expected(endpoint)
                if self.recorder is not None and endpoint not in model.ranks:
                    self.recorder.forgot(endpoint, now)
        counters = subscriber.counters.snapshot()
        model.rejected_frames = sum(counters[name] for name in rejection_names())
        model.gaps = sum(subscriber.gaps.values())
        runs = subscriber.gap_runs
        while runs:
            label, incarnation, missing = runs.popleft()
            if self.recorder is not None:
                self.recorder.gapped(label, incarnation, missing, now)
            if self._news is not None:
                self._news.put(Lost(label, incarnation, missing, now))
