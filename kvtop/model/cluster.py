"""The cluster model: the one truth the views read, built from agents' snapshots and event batches.

Bounded by configuration, not run time: finished rooms and failures live in
fixed-size windows; ranks are keyed by label (a restart replaces its rank).

Ingest is one Python loop per delivery, event by event and in order (a batch
applies exactly as its events one at a time; tests/kvtop/test_model_ingest.py
holds the plain reference). Its cost per event is what `kvtop bench ingest`
measures, so the loop keeps the high-volume kinds inline, finished transfers
wait in their rings as events and are written to numpy in bulk
(`TransferRing`), and the per-room and per-failure records are msgspec Structs
the garbage collector never walks.
"""

from __future__ import annotations

import importlib
import math
from collections import deque
from collections.abc import Collection, Sequence
from itertools import chain, islice
from typing import NamedTuple

from kvtop.model.clock import corrected, corrected_snapshot
from kvtop.model.fold import ABORTED, ROOM_REUSE_S, FailureGroup, Observed
from kvtop.model.incidents import IncidentTracker
from kvtop.model.intake import Intake
from kvtop.model.live_fold import LiveFold
from kvtop.model.resync import FailureKey, failure_key, unheld
from kvtop.model.rolling import percentiles
from kvtop.model.shapes import (
    FAILED,
    STALE_S,
    SUCCEEDED,
    Coverage,
    Finished,
    LinkView,
    Liveness,
    Outcomes,
    RankView,
    Rates,
    RoomView,
)
from kvtop.model.suspects import (
    BOOTSTRAP_ERROR,
    BOOTSTRAP_TIMED_OUT,
    CRASH_KINDS,
    CRASHED,
    HANDSHAKE_BEFORE_S,
    LOCAL_FAULT_BEFORE_S,
    PREFILL_LOST,
    SESSION_TIE_S,
    SILENT_BEFORE_S,
    STARTUP_DEATH,
    THREAD_DIED,
    WAITING_TIMED_OUT,
    Crashed,
    asked_in_vain,
    bootstrap_unreachable,
    failed_session,
    handshake_fault,
    is_transport_error,
    local_fault,
    lost_a_peer,
    memory_unregistered,
    named_by_address,
    prefill_lost,
    room_peer,
    waited_in_vain,
)
from kvtop.model.taken import as_heard
from kvtop.model.timeline import ECHOES, ORIGINS, Timeline
from kvtop.model.transfer_ring import TransferRing
from transport.errors import ReasonClass
from transport.kvpoll import LOST_AFTER_S, LOST_SWEEP_EVERY_S, TERMINAL, KVPoll
from transport.plane.events import (
    MAX_PERCENT,
    MAX_SECONDS,
    MAX_TS,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    Level,
    LogContext,
    Progress,
    RoomState,
    Snapshot,
    TransferDone,
)
from transport.registration import TAKEN_SUFFIX, taken_label
from transport.wire import AgentInfo, label_parts

CRASH_EXPLAINS_S = 300.0
"""A rank's crash explains its peers' `unresponsive` failures this long after it: SGLang's bootstrap and waiting
timeouts (300 s by default) end the last rooms that waited on it."""
CRASH_AFTERMATH_S = 60.0
"""A rank's second process death this soon after its crash, nothing logged between, is the same death's aftermath;
so is another rank's of its instance this soon after, that says the peer it talked to went away (`_first_of`)."""
STUCK_AFTER_S = 10.0
"""An open room with no progress for this long is stuck, whatever state it claims (`ClusterModel.stuck`)."""
SETTLE_S = 1.0
"""A room whose ranks all finished is retired after this long without news (late ranks still count)."""
FINISHED_ROOMS_KEPT = 10_000
FAILURES_KEPT = 50_000
LINKS_NAMED_KEPT = 1024
"""A peer's line names a room's side by address (`room_peer`) only while the model holds fewer links than this: a
log of rooms each naming another address made a link apiece (a 64 KiB ring each, a series apiece exported), 1.1 GB
for 20,000 of them. Past it the side stays unnamed and is counted (`ClusterModel.peers_unlinked`)."""
LINK_BYTES_MAX = (1 << 63) - 1
"""A link's byte total stops here (every event's count is bounded; a total of years of them stays encodable)."""
TRANSFERS_KEPT = 65_536
JOURNAL_EVENTS_KEPT = 200_000
"""Recent events the dashboard keeps (whole deliveries) for its event tail and room timelines."""
SILENCES_KEPT = 8
CONTEXT_KEPT = 10_000
"""Context lines (`LogContext`) sidecars published that the model keeps for the failure groups near them."""
LOCAL_FAULTS_KEPT = 64
"""The local faults, handshake faults and sessions given up on kept per instance (`keep_transport_error`), the latest
64 to 127 of each kind: the failures taken before are folded before the oldest 64 go (a log read in one pass folds at
its end), and those that go are counted (`transport_notes_dropped`)."""


_ABORT_CAUSE, _FAULT_CAUSE = 1, 2
_REASON_CLASSES = frozenset(map(str, ReasonClass))
_LEVELS = frozenset(map(str, Level))
_CAUSES = {ABORTED: _ABORT_CAUSE, "propagated": 0}
"""What a failure's class says started its room's failure (any other class: a cluster fault; an echo: neither)."""

_CODES = {int(state): int(state) for state in KVPoll}
"""Valid KVPoll values (the per-event loop checks a state with one dict hit)."""


_NO_RUN = RoomView(-1, 0.0, 0.0)
"""Stands for the room of no run in the ingest loop (never stored, never written)."""


_SILENT = frozenset((Liveness.STALE, Liveness.GONE))
"""The states of a rank not heard from lately, which a relay's dead upstream explains (`Liveness.UNHEARD`)."""


class ClusterModel:
    """Apply snapshots and batches with `apply()`; read ranks, rooms, failures and rates."""

    def __init__(self, journal_events: int = 0, lost_after_s: float = LOST_AFTER_S, series: bool = True) -> None:
        """`journal_events`: how many recent events to keep for an event tail (the dashboard); 0 keeps none.
        Keeping them costs ingest about 15 % (they stay allocated), so headless views do not.
        `lost_after_s`: seconds without news after which an open room is retired as lost.
        `series`: keep finished transfers in the rings and histograms that rates and latencies are read from;
        a model only judged (`kvtop check`) reads none, and without them loads no numpy (0.1 CPU s of a check)."""
        self.series = series
        if series:  # loaded now, not at the first read: a view that opened a socket per rank may have no descriptor
            importlib.import_module("numpy")  # left for numpy's files then (`Too many open files` in an import)
        self.ranks: dict[str, RankView] = {}
        self.correct_clocks = False
        """Estimate each rank's clock from its envelopes and correct its times (kvtop.model.clock): set by the
        live collector, whose `now` is when an envelope arrived (files, and simulated timelines, have none)."""
        self.rooms: dict[int, RoomView] = {}
        self.finished: dict[int, Finished] = {}
        """Retired rooms by id, oldest first, at most `FINISHED_ROOMS_KEPT`."""
        self.failures: deque[Observed] = deque(maxlen=FAILURES_KEPT)
        self.fold = LiveFold()
        """The fold of `failures`, brought up to date by `refold()` (which moves the origin counts after it)."""
        self.transfers = TransferRing(TRANSFERS_KEPT, seconds=True)
        """Decode-side transfers done: (ts, bytes, seconds)."""
        self.timeline = Timeline()
        """Failures (origins, echoes) and decode-side bytes per bucket over the last minutes (fed by `transfers`)."""
        self.transfers.feed(self.timeline)
        self.links: dict[tuple[str, str], LinkView] = {}
        self._peers: dict[str, set[str]] = {}
        """`links` by each end: the ends it is linked with (`peers_of`)."""
        self._instance_peers: dict[str, set[str]] = {}
        """Those ends that are instances, not addresses (`peers_of(instances_only=True)`)."""
        self.gaps = 0
        self.intake = Intake()
        """What the collector refused on the way in (bad entries, rejected frames), and why it stopped."""
        self.rejected = 0
        """Events whose content made no sense (a state that is no KVPoll value, a time that is no time), skipped: those
        the model refused, and those the collector's decoder refused of a batch or snapshot whose other records it
        kept (`Delivered.refused`)."""
        self.rejected_frames = 0
        """Frames the collector's decoder refused (malformed, or a field out of its range), set by the collector."""
        self.lost = 0
        """Open rooms retired as lost: no rank said anything of them for `lost_after_s`."""
        self.peers_unlinked = 0
        """Failure lines of log rooms whose peer they named by address was left unnamed: the model held
        `LINKS_NAMED_KEPT` links already."""
        self.transport_notes_dropped = 0
        self._holding = False
        """The last sweep held the incidents (`sweep`'s `hold_incidents`): nothing else folds them meanwhile."""
        """Local faults, handshake faults and sessions given up on that an instance's later ones pushed out
        (`LOCAL_FAULTS_KEPT`): a room refolded after, or a session refused after, no longer reads them."""
        self.snapshot_cut = 0
        """Entries agents left out of their snapshots to fit a frame (each snapshot says how many it cut)."""
        self.retired_outcomes = {"succeeded": 0, "failed": 0, "aborted": 0}
        """Rooms ever retired (by `sweep`, or on arrival for a room a log named), by how they ended as they retired
        (a client's abort apart from a cluster fault): tallies that only grow, while `finished` keeps the newest
        few. Logs name no room that succeeded: their rooms are failed or aborted."""
        self.lost_after_s = lost_after_s
        self._lost_check_at = 0.0
        self.journal: deque[tuple[str, Sequence[Event]]] = deque()
        """Recent deliveries as (agent label, events), oldest first: the event tail reads it."""
        self.journal_total = 0
        """Deliveries ever journaled: a reader that remembers it knows which are new."""
        self._journal_kept = journal_events
        self._journal_events = 0
        self._now = 0.0
        self._open: set[int] = set()
        """Ids of the rooms in `rooms` that some rank has not ended (kept as states change)."""
        self._touched: deque[tuple[float, tuple[int, ...]]] = deque()
        """(arrival time, ids of the rooms whose state it changed) per delivery, until a sweep looks at them:
        a room only ends when a state arrives, so a sweep need not walk the rooms no delivery touched."""
        self.failures_total = 0
        """Failures ever recorded: a reader that remembers it knows which are new."""
        self._failure_keys: set[FailureKey] | None = None
        """The failures in `failures`, by `failure_key`: made when a snapshot is first asked again
        (`failure_keys`), kept from then on."""
        self.context: deque[tuple[str, LogContext]] = deque(maxlen=CONTEXT_KEPT)
        """Context lines sidecars published, with the label of the rank that published them."""
        self.transport_errors: deque[tuple[str, LogContext]] = deque(maxlen=CONTEXT_KEPT)
        """Those of them that are the transfer's own errors (`is_transport_error`), kept apart so that no other
        line pushes one out (a check's finding)."""
        self.local_faults: dict[str, deque[tuple[float, str, str]]] = {}
        """The local faults (`local_fault`) each instance's transport libraries logged, the latest few: when, what, the
        rank whose log said it."""
        self.handshakes: dict[str, deque[tuple[float, str, str]]] = {}
        """The handshake faults (`handshake_fault`) each instance's transport libraries logged, the latest few."""
        self.unregistered: dict[str, float] = {}
        """Instances whose transport libraries said they could not register memory (`memory_unregistered`): when
        first."""
        self.failed_sessions: dict[str, deque[tuple[float, str, str]]] = {}
        """The sessions each instance said failed (`failed_session`), the latest few: when, which, by which rank."""
        self.crashes: dict[str, LogContext] = {}
        """Ranks that crashed (a server log said so, read or followed by a sidecar): the latest crash of each
        (`kind` `crash`: its process died; `thread_died`: one of its KV transfer threads), kept apart from
        `context` so that no later line pushes it out."""
        self.logged_after_crash: dict[str, float] = {}
        """Crashed ranks whose log went on after the crash (their server was restarted): when it last did."""
        self.instances_at: dict[str, tuple[str, ...]] = {}
        """Bootstrap addresses that decode ranks' log lines name, each with the prefill instances whose logs may be
        at it (their bootstrap port is the address's, or they did not print one)."""
        self.tp_sizes: dict[str, int] = {}
        """The TP size of each instance whose log's `server_args` line said it (DOMAIN.md's rank mapping pairs its
        ranks with its peers' by it, whichever of its ranks the logs name)."""
        self._causes: dict[int, int] = {}
        """Per room with failures (the newest `FAILURES_KEPT`, up to an eighth more before the oldest go together):
        whether a client's abort, a cluster fault or both started them (bits of `_ABORT_CAUSE`, `_FAULT_CAUSE`),
        so aborted rooms stay out of the failure rate."""
        self._hellos: dict[str, Identity] = {}
        """Each rank's identity as its own latest hello said it: a view the bootstrap's listing replaced (another
        client's entry under its label) gets its host and pid back when that rank is heard again."""
        self.incidents = IncidentTracker()
        """Failure groups joined by suspect and kind of failure: told of each failure, folded at each sweep."""

    def apply(self, label: str, item: Snapshot | EventBatch, now: float) -> list[Event]:
        """One delivery from the subscriber, for the agent `label`; returns the events it accepted.

        An event whose values make no sense (a state that is no KVPoll value, a time or a duration that is
        not a finite number in range) is skipped and counted in `rejected`: it never reaches a view.
        A snapshot of an incarnation the model already heard from (asked again after a gap) adds only what
        the model does not hold yet (kvtop.model.resync)."""
        self._now = now
        view = self._rank(label, item)
        again = isinstance(item, Snapshot) and view.last_seen > 0 and view.incarnation == item.incarnation
        heard = view.last_seen or view.heard_before
        sent_gap = item.sent_at - view.last_sent if item.sent_at and view.last_sent else math.inf
        if heard and now - heard > STALE_S and sent_gap > STALE_S and not view.inferred:
            view.silences = [*view.silences[1 - SILENCES_KEPT :], (heard, now)]
        view.last_seen = now
        if item.sent_at:  # the latest, not the largest: one stamp from the future hides no later silence
            view.last_sent = item.sent_at
        if item.sent_at and self.correct_clocks:  # 0: a snapshot of an agent older than its stamp
            view.clock.sample(item.sent_at, now)
        correction = view.clock.correction_s
        if isinstance(item, Snapshot):
            if correction:
                item = corrected_snapshot(item, correction)
            view.history_since = _history_since(item)
            self.snapshot_cut += item.cut
            if again:
                events: list[Event] = unheld(self, view, item)
            else:
                events = [e for e in (item.hello, item.heartbeat) if e is not None]
                events += [*item.finished_rooms, *item.live_rooms, *item.progress, *item.failures, *item.transfers]
                events += item.context
        else:
            events = corrected(item.events, correction) if correction else item.events
        bad = self._apply_events(view, events)
        if bad:
            self.rejected += len(bad)
            events = [event for event in events if id(event) not in bad]
        if label in self.crashes and self.crashes[label].kind == CRASHED:
            self._note_logged_after_crash(label, events)
        if self._journal_kept:
            self._journal(label, events)
        return events

    def _aftermath(self, label: str, crash: LogContext) -> bool:
        """A process death the rank's log tells after its scheduler's crash, with nothing else logged between (the
        server's watchdog taking its other processes down): the crash it follows says why, so it is kept. SGLang's
        launcher's word that a scheduler died at start-up follows a crash of any rank of the instance so."""
        if crash.kind == CRASHED and crash.text.startswith(STARTUP_DEATH):
            instance = label.rpartition("/")[0]
            return any(self._aftermath_of(other, crash) for other in self.crashes if other.startswith(f"{instance}/"))
        return self._aftermath_of(label, crash)

    def _aftermath_of(self, label: str, crash: LogContext) -> bool:
        """Whether `crash` follows the rank's crash at `label` soon, nothing logged between."""
        first = self.crashes.get(label)
        return (
            first is not None
            and first.kind == crash.kind == CRASHED
            and 0.0 <= crash.ts - first.ts <= CRASH_AFTERMATH_S
            and self.logged_after_crash.get(label, 0.0) <= first.ts
        )

    def _note_logged_after_crash(self, label: str, events: Sequence[Event]) -> None:
        """A crashed rank's log lines from after its process died (its server runs again): any event but a hello
        and a sidecar's own beat (which goes on whatever the server does; a batch line read from a log is a beat
        too). A dead transfer thread is not undone by the lines its process goes on logging."""
        crash = self.crashes[label]
        later = [
            event.ts
            for event in events
            if event.ts > crash.ts
            and not isinstance(event, AgentHello)
            and not (isinstance(event, Heartbeat) and event.log is not None)
            and not (isinstance(event, LogContext) and event.kind in CRASH_KINDS)  # its aftermath (`_aftermath`)
        ]
        if later:
            self.logged_after_crash[label] = max(later)

    def crash_of(self, label: str, now: float) -> LogContext | None:
        """The rank's crash while it stands at `now` (None before it; for a process that died, None once the
        rank's log went on: its server was restarted)."""
        crash = self.crashes.get(label)
        if crash is None or crash.ts > now or crash.ts < self.logged_after_crash.get(label, 0.0) <= now:
            return None
        return crash

    @property
    def journaling(self) -> bool:
        return self._journal_kept > 0

    def _journal(self, label: str, events: Sequence[Event]) -> None:
        self.journal.append((label, events))
        self.journal_total += 1
        self._journal_events += len(events)
        while self._journal_events > self._journal_kept and len(self.journal) > 1:
            self._journal_events -= len(self.journal.popleft()[1])

    def register(self, agent: AgentInfo) -> None:
        """A rank the bootstrap service lists: known (and gone until it is heard from). A view of another
        incarnation heard in the last `STALE_S` stays: what it hears says who runs (an entry another client took
        made a live rank's view anew, never heard, at every discovery; a restart's own events make it anew)."""
        view = self.ranks.get(agent.label)
        if view is not None and view.last_seen and self._now - view.last_seen <= STALE_S:
            return
        if view is None or view.incarnation != agent.incarnation:
            self.ranks[agent.label] = RankView(
                agent.label,
                agent.role,
                agent.instance,
                agent.rank,
                agent.host,
                agent.pid,
                agent.incarnation,
                kind=agent.kind,
            )
            if view is not None:
                _carry_silences(view, self.ranks[agent.label])

    def expect(self, label: str) -> None:
        """A rank that must answer (an endpoint given by the operator): known, and gone until heard from."""
        if label not in self.ranks:
            self.ranks[label] = RankView(label, "", label, 0)

    def forget_expected(self, label: str) -> None:
        """The endpoint `label` answered (as the rank it named): it is no longer a rank of its own."""
        view = self.ranks.get(label)
        if view is not None and not view.last_seen and not view.role:
            del self.ranks[label]

    def log_rank(self, label: str, role: str, instance: str, rank: int) -> RankView:
        """A rank known from its server log (incarnation 0: feed it `EventBatch`es of incarnation 0)."""
        view = self.ranks.get(label)
        if view is None or not view.from_log:
            view = self.ranks[label] = RankView(label, role, instance, rank, from_log=True)
        return view

    def peer_named(self, label: str, role: str, host: str, named_by: list[str]) -> None:
        """`label` (an instance's bootstrap address) is known only from the log lines of `named_by`, which name it
        as their peer: listed as a log rank that tells nothing of itself (`RankView.named_by`). A rank known
        otherwise under that label is left as it is."""
        view = self.ranks.get(label)
        if view is None:
            self.ranks[label] = RankView(label, role, label, 0, host=host, from_log=True, named_by=named_by)
        elif view.named_by:
            view.named_by = named_by

    def forget_peer_named(self, label: str) -> None:
        """`label` is no longer known only from its peers' lines (a log that may be its own was read)."""
        view = self.ranks.get(label)
        if view is not None and view.named_by:
            del self.ranks[label]

    def liveness(self, now: float) -> dict[str, Liveness]:
        """Each rank's liveness as the views say it (`liveness_of`)."""
        states = {label: view.liveness(now) for label, view in self.ranks.items()}
        for label in self.intake.unheard_behind() & states.keys():
            if states[label] in _SILENT:
                states[label] = Liveness.UNHEARD
        return states

    def liveness_of(self, view: RankView, now: float) -> Liveness:
        """`view.liveness(now)`, but `UNHEARD` for a silent rank (stale or gone) that a relay lists from the last
        answer of an upstream that stopped answering it: that upstream's silence, not known to be the rank's."""
        state = view.liveness(now)
        intake = self.intake
        if state in _SILENT and intake.upstream_errors and view.label in intake.upstream_kept:
            return Liveness.UNHEARD
        return state

    def skewed_clocks(self) -> dict[str, float]:
        """Ranks whose clock is `SKEWED_S` or more off the collector's (their times are corrected): offsets."""
        return {label: view.clock.offset_s for label, view in sorted(self.ranks.items()) if view.clock.correction_s}

    def update_incidents(self) -> None:
        """Fold the failures taken since the last sweep into the incidents (a one-shot view does, before it reads)."""
        self.incidents.update(self)

    # What the incidents ask of the model around a failure group (kvtop.model.suspects.Surroundings):

    def link_of(self, room: int) -> tuple[str, str]:
        """(prefill instance, decode instance) of a room, open or retired ("" where unknown)."""
        view = self.rooms.get(room)
        if view is None:
            retired = self.finished.get(room)
            view = retired.view if retired is not None else None
        return view.link if view is not None else ("", "")

    def role_of(self, label: str) -> str:
        """The role of a rank, or of an instance by one of its ranks ("" when the model knows neither)."""
        view = self.ranks.get(label)
        if view is not None:
            return view.role
        return next((view.role for view in self.ranks.values() if view.instance == label), "")

    def silent_at(self, label: str, ts: float) -> tuple[float, float] | None:
        """The silence of the live rank `label` that covers `ts` or ended at most `SILENT_BEFORE_S` before it
        (since, until; `inf` while it lasts); None when there was none (or the rank is known from a log)."""
        view = self.ranks.get(label)
        if view is None or view.inferred:
            return None
        heard = view.last_seen or view.heard_before
        if heard and self._now - heard > STALE_S and ts >= heard - SETTLE_S:
            return (heard, math.inf)
        for since, until in reversed(view.silences):
            if since - SETTLE_S <= ts <= until + SILENT_BEFORE_S:
                return (since, until)
        return None

    def peers_of(self, name: str, instances_only: bool = False) -> Collection[str]:
        """The instances (or addresses: a decode rank a prefill's line named) the model saw linked with an instance
        (or an address) of the other role: a room of both failed, or transfers between them."""
        return (self._instance_peers if instances_only else self._peers).get(name, ())

    def ranks_of(self, instance: str) -> list[str]:
        """The ranks of `instance`'s layout the model knows: a rank heard as taken (`prefill-0/TP0~taken`), a second
        process claiming one of them, is none."""
        return [
            label
            for label, view in self.ranks.items()
            if view.instance == instance and not label.endswith(TAKEN_SUFFIX)
        ]

    def instances_of(self, role: str) -> list[str]:
        return list(dict.fromkeys(view.instance for view in self.ranks.values() if view.role == role and view.instance))

    def crashed_at(self, name: str, ts: float) -> Crashed | None:
        """The one rank of `name` (a rank, an instance, a bootstrap address that logs read may be at, or a role:
        every rank of it) that was crashed at `ts` (`crash_of`): at most `CRASH_EXPLAINS_S` after its process died,
        or any time after a transfer thread of it died (the rooms that thread's queue takes wait on it until they
        time out, for as long as the process runs); None when none were, or several and none of them the one
        whose crash the others followed (`_first_of`)."""
        if not self.crashes:
            return None
        if name in self.crashes:
            labels = [name]
        elif name in ("prefill", "decode"):
            labels = [label for label, view in self.ranks.items() if view.role == name]
        else:
            labels = [label for instance in self.instances_at.get(name, (name,)) for label in self.ranks_of(instance)]
        crashed = [
            (label, crash)
            for label in labels
            if (crash := self.crash_of(label, ts)) is not None
            and (ts - crash.ts <= CRASH_EXPLAINS_S or crash.kind == THREAD_DIED)
        ]
        return Crashed(*crashed[0]) if len(crashed) == 1 else _first_of(crashed)

    def keep_transport_error(self, label: str, line: LogContext, restoring: bool = False) -> None:
        """Keep what a transport error of rank `label` tells the suspects under its instance: a local fault
        (`local_fault`), a session given up on (`failed_session`), a handshake that failed (`handshake_fault`), memory
        it could not register. At twice `LOCAL_FAULTS_KEPT` of a kind the oldest half goes, once the failures taken so
        far are folded with it (unless the sweeps hold the incidents, or `restoring` a keyframe: its failures are
        folded at the sweep, as they were live)."""
        for kept, found in (
            (self.local_faults, local_fault(line.text)),
            (self.failed_sessions, failed_session(line.text)),
            (self.handshakes, handshake_fault(line.text)),
        ):
            if found:
                notes = kept.setdefault(label.rpartition("/")[0], deque())
                notes.append((line.ts, found, label))
                if len(notes) >= 2 * LOCAL_FAULTS_KEPT:  # the oldest half goes at once: one fold for 64 notes
                    if not restoring:
                        if not self._holding:
                            self.incidents.update(self, final=False)  # as a sweep would: more deliveries are coming
                        self.transport_notes_dropped += LOCAL_FAULTS_KEPT
                    for _ in range(LOCAL_FAULTS_KEPT):
                        notes.popleft()
        if memory_unregistered(line.text):
            instance = label.rpartition("/")[0]
            self.unregistered[instance] = min(line.ts, self.unregistered.get(instance, line.ts))

    def own_transport_fault(self, instance: str, ts: float) -> str:
        faults = self.local_faults.get(instance, ())
        return next((fault for at, fault, _ in faults if ts - LOCAL_FAULT_BEFORE_S <= at < ts + 1.0), "")

    def handshake_failed(self, instance: str, ts: float) -> tuple[float, str] | None:
        faults = self.handshakes.get(instance, ())
        return next(((at, what) for at, what, _ in reversed(faults) if ts - HANDSHAKE_BEFORE_S <= at < ts + 1.0), None)

    def unregistered_at(self, instance: str, ts: float) -> float | None:
        at = self.unregistered.get(instance)
        return at if at is not None and at < ts + 1.0 else None

    def session_failed_with(self, instance: str, address: str, ts: float, rank: str = "") -> str:
        host = address.rpartition(":")[0]
        near = [
            (session, by)
            for at, session, by in self.failed_sessions.get(instance, ())
            if abs(at - ts) <= SESSION_TIE_S and session.rpartition(":")[0] == host
        ]
        sessions = {session for session, by in near if by == rank} or {session for session, _ in near}
        return sessions.pop() if len(sessions) == 1 else ""

    def gave_up_on(self, instance: str, session: str, ts: float) -> float | None:
        failed = self.failed_sessions.get(instance, ())
        return next((at for at, given, _ in reversed(failed) if given == session and at < ts + 1.0), None)

    def groups(self, now: float | None = None, window_s: float | None = None) -> list[FailureGroup]:
        """Every failure group, or those that started in the last `window_s` before `now`."""
        groups = self.refold()
        if now is None or window_s is None:
            return list(groups)
        return [group for group in groups if now - group.first_ts <= window_s]

    def refold(self) -> list[FailureGroup]:
        """The fold of the failures held, brought up to date (in `fold()`'s order; not to be changed).

        A failure that names its own rank was counted as an origin when it arrived (its rank's counts and the
        timelines); where the fold made it an echo, it is counted as one from now on."""
        groups = self.fold.sync(self.failures, self.failures_total)
        for failure, to_echo in self.fold.take_moved():
            source, target = (ORIGINS, ECHOES) if to_echo else (ECHOES, ORIGINS)
            self.timeline.move(failure.ts, source, target)
            view = self.ranks.get(failure.rank)
            if view is not None:
                view.timeline.move(failure.ts, source, target)
                step = 1 if to_echo else -1
                view.origins -= step
                view.echoes += step
        return groups

    def open_rooms(self, now: float) -> list[RoomView]:
        """Rooms some live rank has not ended yet."""
        gone = self.gone(now)
        if not gone:
            return [self.rooms[room] for room in self._open]
        return [room for room in self.rooms.values() if not room.finished(gone)]

    def _ended(self, gone: set[str]) -> list[RoomView]:
        """Rooms every live rank ended that are not retired yet (the set difference is C speed)."""
        if not gone:
            return [self.rooms[room] for room in self.rooms.keys() - self._open]
        return [room for room in self.rooms.values() if room.finished(gone)]

    def stuck(self, now: float, threshold_s: float) -> list[RoomView]:
        """Open rooms with no progress for `threshold_s`, whatever state they claim."""
        return [room for room in self.open_rooms(now) if now - room.last_progress > threshold_s]

    def coverage(self, now: float, window_s: float) -> Coverage:
        """How much of the last `window_s` the finished rooms, failures and transfers cover completely.

        A late reader knows the past from each agent's snapshot, which holds its last few hundred rooms:
        before the newest start of those histories some ranks' rooms are missing. The model's own window
        of retired rooms is bounded too."""
        start = now - window_s
        snapshots = max((view.history_since for view in self.ranks.values()), default=0.0)
        kept = self.retired_kept_since()
        limit = "snapshot history" if snapshots > max(start, kept) else "rooms kept" if kept > start else ""
        since = max(start, snapshots, kept)
        return Coverage(since, max(0.0, min(window_s, now - since)), limit)

    def failure_keys(self) -> set[FailureKey]:
        """Every failure the model keeps, by `failure_key` (made at the first call, then kept up to date)."""
        if self._failure_keys is None:
            self._failure_keys = {failure_key(f.ts, f.room, f.rank, f.reason) for f in self.failures}
        return self._failure_keys

    def retired_kept_since(self) -> float:
        """When the oldest retired room the model still keeps ended, once it let older ones go (0 until then)."""
        return next(iter(self.finished.values())).ts if len(self.finished) >= FINISHED_ROOMS_KEPT else 0.0

    def rates(self, now: float, window_s: float) -> Rates:
        """Rooms/s over the covered part of the last `window_s` (`coverage()`), or since the first room heard to
        finish in it, if later; GB/s and latency over it, or since the first transfer heard, if later. Each rate
        divides by the time its own count covers (a snapshot's rooms reach further back than its transfers)."""
        covered = self.coverage(now, window_s).span_s
        rows = self.transfers.window(now - covered)
        span = max(1.0, min(covered, now - float(rows[:, 0].min()))) if len(rows) else max(1.0, covered)
        outcomes = self.outcomes(now, window_s)
        rooms_span = max(1.0, min(covered, now - outcomes.first_ts)) if outcomes.finished else max(1.0, covered)
        p50, p90, p99 = percentiles(rows[:, 2])
        gbps = float(rows[:, 1].sum()) / span / 1e9
        finished, rate = outcomes.finished, outcomes.failure_rate
        return Rates(finished / rooms_span, gbps, p50, p90, p99, rate, finished, covered, span, rooms_span)

    def failure_rate(self, now: float, window_s: float) -> tuple[float, int]:
        """Failed fraction of the rooms that finished in the covered part of the last `window_s`
        (`coverage()`; client aborts left out), and how many finished.

        Rooms known from logs only are left out: a log names a room only where it failed."""
        outcomes = self.outcomes(now, window_s)
        return outcomes.failure_rate, outcomes.finished

    def outcomes(self, now: float, window_s: float) -> Outcomes:
        """How the rooms that finished in the covered part of the last `window_s` ended (rooms known from
        logs only left out)."""
        recent = [f for f in self._finished_since(now, window_s) if not f.from_log]
        unsuccessful = [f.room for f in recent if not f.ok]
        aborted = sum(self._causes.get(room) == _ABORT_CAUSE for room in unsuccessful)
        first = min((f.ts for f in recent), default=now)
        return Outcomes(len(recent), len(unsuccessful) - aborted, aborted, first)

    def failed_rooms_by_link(self) -> dict[tuple[str, str], int]:
        """Failed rooms per (prefill, decode) link: those retired, and those failed but not yet retired.

        A link counts a room when the room retires (`sweep`); a one-shot view reads the agents' snapshots
        and answers before any of their rooms settled, so without the second part its links said 0 failed
        beside a failure rate of 16 %. Walks the open rooms: for the headless views, not for every frame."""
        counts = {pair: link.failed_rooms for pair, link in self.links.items()}
        for room in self.rooms.values():
            if all(room.link) and FAILED in room.codes.values():
                counts[room.link] = counts.get(room.link, 0) + 1
        return counts

    def rooms_failed(self, now: float, window_s: float) -> int:
        """Rooms that failed in the last `window_s` by a cluster fault (not a client's abort), those known
        from logs included."""
        return sum(not f.ok and self._causes.get(f.room) != _ABORT_CAUSE for f in self._finished_since(now, window_s))

    def _finished_since(self, now: float, window_s: float) -> list[Finished]:
        since = self.coverage(now, window_s).since
        gone = self.gone(now)
        settling = [self._outcome(room, gone) for room in self._ended(gone)]
        return [f for f in [*self.finished.values(), *settling] if f.ts >= since]

    def _rank(self, label: str, item: Snapshot | EventBatch) -> RankView:
        """The view of `label`, made anew for a new incarnation (a restart), whether a batch or a snapshot comes of
        it first: a new incarnation's batches wait for its snapshot, which kept the earlier one's view (its
        registration warning, counts and load) until the new one's first heartbeat. A rank heard under its
        `taken_label` (its entry another client's) and now under its own label holds its entry again: one view."""
        view = self.ranks.get(label)
        if view is None or view.incarnation != item.incarnation:
            taken = self.ranks.get(taken_label(label))
            if taken is not None and taken.incarnation == item.incarnation:
                del self.ranks[taken_label(label)]
        if isinstance(item, Snapshot) and view is not None and view.incarnation != item.incarnation:
            renewed = RankView(label, view.role, view.instance, view.rank, incarnation=item.incarnation)
            _carry_silences(view, renewed)  # its hello, first in the snapshot, says who it is
            view = self.ranks[label] = renewed
        elif isinstance(item, EventBatch) and (view is None or view.incarnation != item.incarnation):
            earlier = view
            view = self.ranks[label] = RankView(
                label, item.role, item.instance, item.rank, incarnation=item.incarnation
            )
            said = self._hellos.get(label)
            if said is not None and said.incarnation == item.incarnation:
                view.host, view.pid, view.kind = said.host, said.pid, said.kind
            if earlier is not None:
                _carry_silences(earlier, view)
        if view is None:
            instance, _, tp = label_parts(label.removesuffix(TAKEN_SUFFIX)) or ("", None, 0)
            view = self.ranks[label] = RankView(label, "", instance, tp)
        return view

    def _apply_events(self, view: RankView, events: list[Event]) -> set[int]:
        """Apply events in order; the high-volume kinds inline on locals (this loop sets the ingest rate).
        Returns the ids of the events rejected as nonsense (skipped).

        Consecutive states of one room (a run) look the room up once; its state for this rank and whether
        it is open are settled when the run ends, from the run's last valid state (what one event at a
        time would leave, since nothing reads the room in between)."""
        rooms, retired, label, now, codes = self.rooms, self.finished, view.label, self._now, _CODES
        settle = self._settle_run
        decode_instance = view.instance if view.role == "decode" else ""
        inferred = view.inferred
        link = ("", "")
        done: list[TransferDone] = []
        run, run_id, run_state = _NO_RUN, None, 0  # the room of the current run, its id (None: no run)
        touched: list[int] = []
        bad: set[int] = set()
        for event in events:
            if type(event) is RoomState:
                if inferred:  # a sidecar's room states restate its failure lines: the failures make the rooms
                    continue
                state = codes.get(event.state)
                if state is None or event.previous not in codes or not 0.0 <= event.ts <= MAX_TS:
                    bad.add(id(event))  # not a KVPoll value, or no time: counted, never fatal to the collector
                    continue
                if event.room != run_id:
                    if run_id is not None:  # the previous run ends: settle it
                        settle(run, run_id, label, run_state)
                    run_id = event.room
                    room = rooms.get(run_id)
                    if room is None:
                        if run_id in retired and self._late_news(event):
                            run_id = None  # no run: the next state of this id is checked again
                            continue
                        room = rooms[run_id] = RoomView(run_id, event.ts, event.ts)
                    run = room
                    run.touched_at = now
                    touched.append(run_id)
                run_state = state
                if decode_instance and event.peer:
                    if event.peer != link[0]:
                        link = (event.peer, decode_instance)
                    run.link = link
                if event.bytes_total > run.bytes_total:
                    run.bytes_total = event.bytes_total
                if event.ts > run.last_progress:
                    run.last_progress = event.ts
            elif type(event) is Progress:
                if not 0.0 <= event.ts <= MAX_TS:
                    bad.add(id(event))
                    continue
                room = run if event.room == run_id else rooms.get(event.room)
                if room is not None:
                    if event.bytes_done > room.bytes_done:
                        room.bytes_done = event.bytes_done
                    if event.ts > room.last_progress:
                        room.last_progress = event.ts
            elif type(event) is TransferDone:
                if 0.0 <= event.ts <= MAX_TS and 0.0 <= event.seconds <= MAX_SECONDS:
                    done.append(event)
                else:
                    bad.add(id(event))
            elif not _sensible(event):
                bad.add(id(event))
            elif type(event) is AgentHello:  # may change the role: apply what came before under the old one
                if done:
                    self._finished_transfers(view, done)
                    done = []
                self._apply_rare(view, event)
                decode_instance = view.instance if view.role == "decode" else ""
                inferred = view.inferred
            elif type(event) is Heartbeat:
                self._apply_rare(view, event)
                inferred = view.inferred
            else:
                self._apply_rare(view, event)
        if run_id is not None:
            settle(run, run_id, label, run_state)
        if touched:  # a tuple of ints: the GC stops tracking it (and its pair) at its first collection, so the
            # second or so each waits here never promotes it (at 20k deliveries/s, lists made full collections frequent)
            self._touched.append((now, tuple(touched)))
        if done:
            self._finished_transfers(view, done)
        return bad

    def _settle_run(self, room: RoomView, room_id: int, label: str, state: int) -> None:
        """A run of one room's states ended: its last state is this rank's, and the room is open unless
        every rank it has heard from is terminal.

        The codes dict is replaced, never changed in place: a view that holds the old one (the dashboard
        draws rooms outside the model's lock) reads a dict no other thread changes."""
        codes = room.codes
        if codes.get(label) != state:
            room.codes = codes = {**codes, label: state} if codes else {label: state}
        if state not in TERMINAL:
            self._open.add(room_id)
        elif room_id in self._open and TERMINAL.issuperset(codes.values()):  # (issuperset makes a set: once open)
            self._open.discard(room_id)

    def _late_news(self, event: RoomState) -> bool:
        """True when the state of a retired room is a late rank's news of it (applied to its outcome);
        False when the id came back long after (a new room)."""
        retired = self.finished[event.room]
        if event.ts - retired.ts > ROOM_REUSE_S:
            return False
        retired.ok = retired.ok and event.state != KVPoll.Failed
        if retired.view is not None:
            retired.view.outcome = retired.ok
        return True

    def _finished_transfers(self, view: RankView, done: list[TransferDone]) -> None:
        """A delivery's finished transfers, into its rank's ring; a decode rank's also into the model's ring and
        their link's (counts, ring, histogram); rings and histogram only when the model keeps `series`."""
        if self.series:
            view.transfers.add(done)
        if view.role != "decode":
            return
        if self.series:
            self.transfers.add(done)
        peer = done[0].peer
        for event in done:  # a loop, not a comprehension: no frame per delivery
            if event.peer != peer:  # rare: more than one prefill instance sent them
                for one in done:
                    self._link_done(self._link((one.peer, view.instance)), [one])
                return
        key = (peer, view.instance)
        self._link_done(self.links.get(key) or self._link(key), done)

    def _link_done(self, link: LinkView, done: list[TransferDone]) -> None:
        """One delivery's transfers of one link: counted, into its ring and its histogram (with `series`)."""
        link.transfers += len(done)
        nbytes = link.nbytes
        for event in done:
            nbytes += event.nbytes
        link.nbytes = min(nbytes, LINK_BYTES_MAX)
        if self.series:
            link.recent.add(done)
            link.durations.observe([event.seconds for event in done])

    def _link(self, key: tuple[str, str]) -> LinkView:
        """The link of a (prefill, decode) instance pair, made on first use (not per call: its ring is 64 KiB)."""
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = LinkView()
            self.linked(key)
        return link

    def linked(self, key: tuple[str, str]) -> None:
        """A (prefill, decode) pair of `links` is known: each end's peers (`peers_of`) hold the other."""
        for end, other in (key, key[::-1]):
            self._peers.setdefault(end, set()).add(other)
            if not named_by_address(other):
                self._instance_peers.setdefault(end, set()).add(other)

    def _apply_rare(self, view: RankView, event: Event) -> None:
        """The low-volume kinds: who the rank is, its heartbeat, failures (aborts only show in event logs)."""
        if isinstance(event, AgentHello):
            agent = event.agent
            view.role, view.host, view.pid, view.incarnation = agent.role, agent.host, agent.pid, agent.incarnation
            view.kind = agent.kind
            self._hellos[view.label] = Identity(agent.incarnation, agent.host, agent.pid, agent.kind)
        elif isinstance(event, Heartbeat):
            view.inflight, view.counters, view.rejected = event.inflight_rooms, event.counters, event.rejected
            view.cpu_percent, view.rss_bytes = event.cpu_percent, event.rss_bytes
            view.log, view.registration = event.log, event.registration
        elif isinstance(event, LogContext):
            self.context.append((view.label, event))
            if is_transport_error(event.kind, event.text):
                self.transport_errors.append((view.label, event))
                self.keep_transport_error(view.label, event)
            if event.kind in CRASH_KINDS:
                if not self._aftermath(view.label, event):
                    self.crashes[view.label] = event
            elif event.kind == BOOTSTRAP_ERROR:
                attribution = bootstrap_unreachable(view.instance, event.text, event.ts, self)
                self.incidents.add_roomless(event.ts, view.label, attribution, BOOTSTRAP_ERROR, self)
            elif event.kind == BOOTSTRAP_TIMED_OUT:
                attribution = asked_in_vain(view.instance, event.ts, self)
                self.incidents.add_roomless(event.ts, view.label, attribution, ReasonClass.TIMEOUT_BOOTSTRAP, self)
            elif event.kind == WAITING_TIMED_OUT:
                attribution = waited_in_vain(view.instance, event.ts, self)
                self.incidents.add_roomless(event.ts, view.label, attribution, ReasonClass.TIMEOUT_WAITING, self)
            elif event.kind == PREFILL_LOST:
                attribution = prefill_lost(view.instance, event.text, event.ts, self)
                self.incidents.add_roomless(event.ts, view.label, attribution, ReasonClass.PEER_LOST, self)
        elif isinstance(event, Failure):
            rank, origin, suspect = event.rank, event.origin, event.suspect
            if view.label.endswith(TAKEN_SUFFIX):  # its own failures, not the taker's (kvtop.model.taken)
                rank, origin, suspect = (as_heard(name, view.label, self.ranks) for name in (rank, origin, suspect))
            observed = Observed(event.ts, event.room, rank, view.role, event.reason, event.reason_class, origin,
                                event.level, event.is_from_another_rank, view.inferred, suspect,
                                event.origin_class)  # fmt: skip
            keys = self._failure_keys
            if keys is not None:
                if len(self.failures) == FAILURES_KEPT:
                    oldest = self.failures[0]
                    keys.discard(failure_key(oldest.ts, oldest.room, oldest.rank, oldest.reason))
                keys.add(failure_key(event.ts, event.room, rank, event.reason))
            self.failures.append(observed)
            self.failures_total += 1
            self.incidents.add(observed, self)
            cause = _CAUSES.get(event.reason_class, _FAULT_CAUSE)
            causes = self._causes
            was = causes.get(event.room)
            if cause:
                causes[event.room] = causes.pop(event.room, 0) | cause
                if len(causes) > FAILURES_KEPT + FAILURES_KEPT // 8:  # the oldest go together: the first key
                    for room in list(islice(causes, len(causes) - FAILURES_KEPT)):  # deleted one at a time walks
                        del causes[room]  # the dead slots before it each time
            column = ORIGINS if event.origin == event.rank else ECHOES
            if column == ORIGINS:
                view.origins += 1
            else:
                view.echoes += 1
            self.timeline.add_one(event.ts, column)
            view.timeline.add_one(event.ts, column)
            if view.inferred:
                self._log_room_failed(view, event, was == _ABORT_CAUSE)

    def _log_room_failed(self, view: RankView, event: Failure, was_aborted: bool) -> None:
        """A log names a room only where it failed: the failure is that rank's state in the room.

        Such a room has ended on arrival, so it is retired at once (bounded like every retired room) and counted
        in `retired_outcomes`, failed or aborted as `rooms_failed` judges it; a rank that logs it again within
        `ROOM_REUSE_S` joins it (a room a client aborted that a fault then failed is counted failed too: a tally
        never goes down), a later one starts a new room. A room agents reported (a sidecar beside our agents, open
        or retired) is theirs: the log's failure is one more rank's state in it, counted as the sweep counts it
        (one room, one finish; it was counted twice, once here and once when it retired)."""
        if self._joined_agents_room(view.label, event):
            return
        retired = self.finished.get(event.room)
        room = retired.view if retired is not None and event.ts - retired.ts <= ROOM_REUSE_S else None
        aborted = self._causes.get(event.room) == _ABORT_CAUSE
        if room is None or (was_aborted and not aborted):
            self.retired_outcomes["aborted" if aborted else "failed"] += 1
        if retired is None or room is None:  # a new room, made whole: its rank's Failed state, at `ts`
            room = RoomView(event.room, event.ts, event.ts, {view.label: FAILED}, touched_at=self._now, outcome=False,
                            from_log=True)  # fmt: skip
            retired = Finished(event.ts, event.room, False, room, from_log=True)
            self.finished.pop(event.room, None)
            self.finished[event.room] = retired
            if len(self.finished) > FINISHED_ROOMS_KEPT:
                del self.finished[next(iter(self.finished))]
        else:
            retired.ok, room.outcome = False, False
            room.codes = {**room.codes, view.label: FAILED}  # replaced, never changed in place (`RoomView.codes`)
            room.last_progress = max(room.last_progress, event.ts)
            room.touched_at = self._now
        prefill, decode = room.link
        peer = (
            "" if prefill and decode else room_peer(view.role, view.instance, event.reason, event.ts, self, view.label)
        )
        if view.role == "prefill":
            self._relink(room, self._named_by(peer, (view.instance, decode or peer), (view.instance, decode)))
        elif view.role == "decode":
            self._relink(room, self._named_by(peer, (prefill or peer, view.instance), (prefill, view.instance)))

    def _joined_agents_room(self, label: str, event: Failure) -> bool:
        """The log's failure of a room agents reported, open or retired within `ROOM_REUSE_S`, as rank `label`'s
        Failed state in it (a late one: as `_late_news`); False when no agent reported the room."""
        room = self.rooms.get(event.room)
        if room is None:
            retired = self.finished.get(event.room)
            if retired is None or retired.from_log or event.ts - retired.ts > ROOM_REUSE_S:
                return False
            retired.ok, room = False, retired.view
            if room is None:
                return True
            room.outcome = False
        room.codes = {**room.codes, label: FAILED}  # replaced, never changed in place (see `RoomView.codes`)
        return True

    def _named_by(self, peer: str, link: tuple[str, str], unnamed: tuple[str, str]) -> tuple[str, str]:
        """`link`, a side of it named by `peer`'s address, unless it is a new link past `LINKS_NAMED_KEPT`: then
        `unnamed`, the address counted in `peers_unlinked`."""
        if not peer or link == unnamed or link in self.links or len(self.links) < LINKS_NAMED_KEPT:
            return link
        self.peers_unlinked += 1
        return unnamed

    def _relink(self, room: RoomView, link: tuple[str, str]) -> None:
        """A log's room linked as its lines name it now: a failed room of its link once both sides are named (a
        side a peer's line named by address is taken over by the instance its own log names: the room moves)."""
        before = room.link
        if link == before:
            return
        room.link = link
        moved = self.links.get(before)
        if moved is not None:
            moved.failed_rooms = max(0, moved.failed_rooms - 1)
            if not (moved.failed_rooms or moved.transfers):  # no link of its own: only this room named it so
                del self.links[before]
                for end, other in (before, before[::-1]):
                    self._peers[end].discard(other)
                    self._instance_peers.get(end, set()).discard(other)
        if all(link):
            self._link(link).failed_rooms += 1

    def sweep(self, now: float, hold_incidents: bool = False) -> None:
        """Retire rooms that every reporting rank finished, once no rank has said more for `SETTLE_S`;
        every `LOST_SWEEP_EVERY_S`, retire as lost the open rooms nobody said anything of for `lost_after_s`;
        fold the failures that came since into the incidents, unless `hold_incidents` (the collector while the
        agents' snapshots come in: folded later in one go, in time order, the incidents do not depend on which
        snapshot came first; they did, so much that back-to-back one-shot views named different suspects)."""
        self._now = max(self._now, now)
        self._holding = hold_incidents
        if not hold_incidents:
            self.incidents.update(self, final=False)
        if now - self._lost_check_at >= LOST_SWEEP_EVERY_S or now < self._lost_check_at:
            self._lost_check_at = now
            self._retire_lost(now)
        gone = self.gone(now)
        settled = self._settled(now, gone)
        rooms, still_open, causes = self.rooms, self._open, self._causes
        kept_from = len(settled) - FINISHED_ROOMS_KEPT
        if kept_from >= 0:  # the rooms retired now fill the window of finished rooms alone: every older one goes
            finished: dict[int, Finished] = {}
        else:
            finished, kept_from = self.finished, 0
        succeeded = failed = aborted = 0
        for index, room in enumerate(settled):  # a room per ~5 events at fan-in: on locals
            room_id = room.room
            if gone:
                ok = room.succeeded(gone)
            else:
                for code in room.codes.values():  # `succeeded()` inlined: no set made per room
                    if code != SUCCEEDED:
                        ok = False
                        break
                else:
                    ok = True
            room.outcome = ok
            if ok:
                succeeded += 1
            else:
                if all(room.link):
                    self._link(room.link).failed_rooms += 1
                if causes.get(room_id) == _ABORT_CAUSE:
                    aborted += 1
                else:
                    failed += 1
            if index >= kept_from:  # retired as kept (a room retired and reused since goes to the end)
                finished.pop(room_id, None)
                finished[room_id] = Finished(room.last_progress, room_id, ok, room, room.from_log)
            del rooms[room_id]
            still_open.discard(room_id)
        tallies = self.retired_outcomes
        tallies["succeeded"] += succeeded
        tallies["failed"] += failed
        tallies["aborted"] += aborted
        if len(finished) > FINISHED_ROOMS_KEPT:  # the oldest go, once per sweep: deleting the first key of a dict
            # one at a time leaves a run of dead slots each next deletion walks (12 % of a 1024-agent collector)
            finished = dict(islice(finished.items(), len(finished) - FINISHED_ROOMS_KEPT, None))
        self.finished = finished

    def _retire_lost(self, now: float) -> None:
        """Open rooms with no news for `lost_after_s` (no state arrived, no progress made): their terminal news
        was lost (a gap, an event the agent dropped)."""
        cutoff = now - self.lost_after_s
        rooms = self.rooms
        lost = [i for i in self._open if rooms[i].touched_at < cutoff and rooms[i].last_progress < cutoff]
        for room_id in lost:
            del self.rooms[room_id]
            self._open.discard(room_id)
        self.lost += len(lost)

    def _settled(self, now: float, gone: set[str]) -> list[RoomView]:
        """Rooms to retire: every live rank ended them and they were last touched over `SETTLE_S` ago.

        With every rank alive, only the rooms of deliveries that old are looked at, each with one lookup in
        the open set (walking 100k rooms took ~12 ms under the model's lock). A gone rank can end a room no
        delivery touched, so then every room is walked."""
        old: list[tuple[int, ...]] = []
        waiting: deque[tuple[float, tuple[int, ...]]] = deque()
        for entry in self._touched:  # the waiting keep their pair (no new object for the GC to track)
            if now - entry[0] > SETTLE_S:
                old.append(entry[1])
            else:
                waiting.append(entry)
        self._touched = waiting
        due = dict.fromkeys(chain.from_iterable(old))  # in order, each once
        if not gone:
            rooms, still_open = self.rooms, self._open
            return [
                room
                for room_id in due
                if room_id not in still_open
                and (room := rooms.get(room_id)) is not None
                and now - room.touched_at > SETTLE_S
            ]
        settled = [r for r in self.rooms.values() if now - r.touched_at > SETTLE_S and r.finished(gone)]
        retiring = {room.room for room in settled}
        # ended on every rank, but every one of them is gone: due again as soon as one is back
        parked = tuple(i for i in due if i in self.rooms and i not in self._open and i not in retiring)
        if parked:
            self._touched.appendleft((-math.inf, parked))
        return settled

    def _outcome(self, room: RoomView, gone: set[str]) -> Finished:
        return Finished(room.last_progress, room.room, room.succeeded(gone), room, room.from_log)

    def gone(self, now: float) -> set[str]:
        """The ranks silent past `GONE_S` (or listed and never heard), whose rooms wait for them no longer: those
        unheard behind a relay's dead upstream too (the rooms settle as they would without the relay's word)."""
        return {label for label, view in self.ranks.items() if view.liveness(now) is Liveness.GONE}


def _first_of(crashed: list[tuple[str, LogContext]]) -> Crashed | None:
    """Of several ranks crashed, the one whose crash the others followed: the only process death that does not say
    its peer went away, each other one a rank of its instance that died at most `CRASH_AFTERMATH_S` after it saying
    so (sglang #30158: PP1 TP3 dies of an IndexError, PP0 TP3's send to it is reset a second later). None when no
    crash is the one (two that name no peer gone: which broke is not known)."""
    causes = [(label, crash) for label, crash in crashed if not lost_a_peer(crash.text)]
    if len(causes) != 1 or causes[0][1].kind != CRASHED:
        return None
    label, crash = causes[0]
    instance = label.rpartition("/")[0]
    after = [(other, later) for other, later in crashed if other != label]
    if all(
        later.kind == CRASHED
        and other.rpartition("/")[0] == instance
        and 0.0 <= later.ts - crash.ts <= CRASH_AFTERMATH_S
        for other, later in after
    ):
        return Crashed(label, crash, tuple(other for other, _ in after))
    return None


class Identity(NamedTuple):
    """Who a rank's hello said it is (`ClusterModel._hellos`)."""

    incarnation: int
    host: str
    pid: int
    kind: str


def identities(ranks: dict[str, RankView]) -> dict[str, Identity]:
    """The identities the ranks' views hold, of those a hello named (a keyframe's restore makes `_hellos` so)."""
    return {label: Identity(v.incarnation, v.host, v.pid, v.kind) for label, v in ranks.items() if v.pid}


def _carry_silences(earlier: RankView, view: RankView) -> None:
    """A new incarnation of a rank keeps the earlier one's silences, and when it was last heard."""
    view.silences = earlier.silences
    view.heard_before = earlier.last_seen or earlier.heard_before


def _sensible(event: Event) -> bool:
    """The low-volume kinds' numbers are numbers in range (NaN fails every bound)."""
    if not 0.0 <= event.ts <= MAX_TS:
        return False
    if isinstance(event, Heartbeat):
        return 0.0 <= event.cpu_percent <= MAX_PERCENT and 0.0 <= event.host_memory_percent <= MAX_PERCENT
    if isinstance(event, Failure):  # closed sets: every view counts and filters by them, the exporter labels them
        known = event.reason_class in _REASON_CLASSES and event.level in _LEVELS
        return known and (not event.origin_class or event.origin_class in _REASON_CLASSES)
    return True


def _history_since(snapshot: Snapshot) -> float:
    """When a snapshot's histories are complete from: what it says, but never after its oldest entry (the time of
    the oldest one kept once one was dropped, 0 with none: a snapshot saying its history starts a day on made
    every window 0 s long)."""
    times = [entry.ts for entry in snapshot.finished_rooms] + [entry.ts for entry in snapshot.failures]
    times += [entry.ts for entry in snapshot.transfers]
    return min(snapshot.history_since, min(times, default=0.0))
