"""Incidents: one cause seen across rooms (DOMAIN.md, "Origins, suspects and incidents").

An incident is the failure groups of one suspect and one kind of failure (`suspects.attribute`), close in
time: a group joins the latest incident of its (kind, suspect) unless it lies more than `quiet_gap_s` from
it, which starts a new one. One dead decode instance is one incident of 26 rooms, not 26 origins.

A vaguer group joins the one rank's `unresponsive` incident under way that explains it (`_explains`): an
instance or the unnamed side of one that stopped answering (of an instance that rank could have served), a pool
that filled and refused rooms (a symptom),
a group whose origin's own record never came while that origin was the suspect, or was noticing failures, of
an incident. A rank's new `unresponsive` incident takes in the vaguer ones under way that it explains. So a
rank stopped under load is one incident, not one per class of failure its peers and its pool showed.

A multi-node decode instance's incident (its rooms named decode sessions on several hosts) remembers the sessions
they named: a room that names sessions on one host only, suspecting one of those, joins it when it would join an
incident of that session (in time, or a standing refusal), unless that session's own incident started later (the
session failed afresh); such an incident of one of its sessions under way as it starts it takes in. So one dead
decode instance is one incident whichever of its hosts a room names, first or later.

Sessions of one decode host that start failing within `quiet_gap_s` of one another are one incident of that host
(`_of_host`: a decode of TP or DP attention on one node, dead, names a session per rank), which remembers them as a
multi-node decode's incident does; a session of it that starts failing later is a new death, its own incident.
So are the ranks of an instance (by label) when every rank of it (every rank seen, and, where its log stated its TP
size, each of that many) fails the same way within `quiet_gap_s` (`_of_instance`: an instance stalled, corrupting its
sends, refusing, whole): one incident of the instance, which remembers its ranks as a host's does its sessions; a rank
failing alone stays that rank's.

Computed incrementally: the model hands each failure to `add()` (a list append on the ingest path) and
`update()` (from the model's sweep) folds only the rooms those failures touched. A room's groups can change
as its failures arrive (an echo first, its origin later): the room's earlier parts are taken back out of
their incidents and its new groups put in, so an incident that only an early echo made is gone again
(nothing counts it). Memory is bounded by configuration, whatever the run time:

- the rooms whose groups may still change keep their failures: those that failed within `ROOM_REUSE_S` of
  the newest failure (a room's ranks report it within seconds), at most `rooms_tracked`; an older room's parts
  stay in their incidents as they are;
- which incident each of the newest `LEADS_KEPT` failure groups is in (`incident_of`: the views' tree);
- each incident lists its rooms; once more than `rooms_listed` rooms are listed over every incident, a room
  that leaves the tracked ones leaves the lists too (counted in `room_count`, `rooms_complete` False);
- at most `incidents_kept` incidents, the oldest dropped first; their starts stay counted (`started`).

Time is linear in the groups: a group looks only at the incidents indexed as ones that may take it (by suspect
name, instance, side, session, host, noticing rank; an unnamed side's group at the ranks' `unresponsive` incidents of
that side's role, a full pool's at the ranks' alone, never at every key), and an incident taken in hands on only
its own rooms and group leads, so one `update` of a log whose every room names another peer (an incident each,
the bound kept at its end) does not walk every incident made so far per group. A side's or a pool's group walks
those ranks' incidents whose latest failure is at most a quiet gap before it (`TimedKeys`), not the ones ended
before (thousands of one role's ranks failing over hours, in one update), until two explain it.

An incident that takes in another starts at the earlier of their starts, with its class; `started` counts them
once, under the start it counted first (so a scrape between the two sees no count go down), but an incident made of
others' (an instance's of its ranks', a host's or a multi-node decode's of its sessions') under its own: the kind it is
shown with (the exporter keeps what a scrape read before).

`update()` is deterministic in the order of `add()` calls and its own calls, so a replay that applies the
recorded deliveries and sweeps builds the incidents the live model had.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TypeVar

import msgspec

from kvtop.model.fold import ABORTED, ROOM_REUSE_S, FailureGroup, Observed, fold_room
from kvtop.model.suspects import (
    BOOTSTRAP_UNANSWERED,
    CARRIED_BOTH,
    NOT_ALL_REGISTERED,
    UNREGISTERED_RANKS,
    Attribution,
    Kind,
    Surroundings,
    Suspect,
    attribute,
    carrying_echo,
    could_serve,
    session_host,
)
from kvtop.model.timed import TimedKeys
from transport.registration import TAKEN_SUFFIX

QUIET_GAP_S = 120.0
"""An incident with no new failure group for this long has ended; a later group of its kind and suspect
starts a new one. Long enough for timeouts that trickle in as the requests that hit a dead peer time out."""
INCIDENTS_KEPT = 256
ROOMS_TRACKED = 20_000
ROOMS_LISTED = 100_000
FAILURES_PER_ROOM = 256
"""A room id that collects more failures than this (a hostile agent's) is folded afresh from there on."""
LABELS_KEPT = 16
"""Distinct classes, evidence lines and noticing ranks an incident tallies (the rest count as "other")."""
SESSIONS_KEPT = 64
"""Decode sessions a multi-node decode's (or a host's) incident remembers (one per rank: eight nodes of eight GPUs)."""
HOST_LOOKS = 16
"""The newest incidents of a host's sessions a session that starts failing looks at for one it failed with: those
near it in time (a log of rooms each naming a new port of one host, hours long, keeps `incidents_kept` incidents of
that host; a group looks at a few, not at each of them)."""
SESSIONS_SHOWN = 8
"""The sessions a host's evidence names (the rest counted: `... and 3 more`)."""
DRAIN_S = 10.0
"""A group whose origin never came joins an incident it was noticing failures of until this long after it."""
BEFORE_S = 10.0
"""A vaguer failure (a timeout, a full pool) this long before a rank's incident started is still its doing: the
rank went silent before its peers could tell."""
LEADS_KEPT = 50_000
"""Groups whose incident is remembered, as many as the model keeps failures."""
PENDING_MAX = 50_000
"""Failures `add()` holds before it folds them itself (a source that never sweeps stays bounded)."""

IncidentKey = tuple[str, str, str]
"""(kind, suspect kind, suspect name)."""
Tag = tuple[str, str]
"""What a lookup asks of an incident (`IncidentTracker._tagged`): ("name", its suspect's), ("instance", name) of an
instance's `unresponsive` one, ("side", role), ("symptom", ""), ("rank", "") of a rank's `unresponsive` one,
("session", one it remembers), ("host", the host of its decode session, or its host), ("of", the instance of a rank
by label), ("noticed", a rank it tallies as noticing)."""
_At = TypeVar("_At", str, tuple[str, str])
LeadKey = tuple[float, int, str]
"""(ts, room, rank) of a group's lead: which group it is, across refolds that keep its lead."""


class Incident(msgspec.Struct, gc=False):
    """One cause across rooms: its suspect, the kind of failure, when, how many rooms, origins and echoes."""

    id: int
    kind: str
    suspect: Suspect
    first_seen: float
    last_seen: float
    reason_class: str
    """The class of its earliest failure (what first showed the cause; `classes` has them all; `title_class` is
    the one it is shown by)."""
    origins: int = 0
    """Failure groups (one failure of one room, however many ranks saw it)."""
    echoes: int = 0
    room_count: int = 0
    classes: dict[str, int] = {}
    """Failure groups per origin reason class."""
    evidence: dict[str, int] = {}
    """Why the suspect, in a few words, with how many groups say so."""
    noticed_by: dict[str, int] = {}
    """Failure groups per origin rank (who noticed)."""
    rooms: dict[int, int] = {}
    """The rooms listed, with how many of the incident's groups each holds."""
    roomless: int = 0
    """Failures that named no room (a bootstrap server a rank could not reach), among `origins`."""
    rooms_complete: bool = True
    """Every room of the incident is in `rooms` (False once the listing bound dropped some)."""
    symptom_of: str = ""
    """Set on an incident of a capacity symptom (the instance whose pool filled): a rank's `unresponsive`
    incident under way beside it takes it in."""
    sessions: list[str] = []
    """The decode sessions (`host:port`) its rooms named on several hosts (a multi-node decode instance's), or on one
    host (a host's: the sessions that failed together), or the ranks of an instance that failed together (by label),
    at most `SESSIONS_KEPT`: a later room that names one of them joins it (`Attribution.session`, a rank's label)."""
    counted: tuple[int, str, str] = (0, "", "")
    """(id, kind, suspect kind) of the start `started` counts for it: its own, or that of the incident counted first
    that it took in (one cause counted once, where it was counted first), unless it is made of those it took in
    (`IncidentTracker._absorb`'s `formed`)."""

    @property
    def key(self) -> IncidentKey:
        return (self.kind, self.suspect.kind, self.suspect.name)

    @property
    def duration_s(self) -> float:
        return self.last_seen - self.first_seen

    @property
    def rooms_per_min(self) -> float:
        """Rooms per minute over its span (a minute at least, so one burst does not read as a huge rate)."""
        return self.room_count * 60.0 / max(60.0, self.duration_s)

    @property
    def client(self) -> bool:
        """Client aborts: counted and shown, never a cluster incident."""
        return self.suspect.kind == "client"

    def ongoing(self, now: float, quiet_gap_s: float = QUIET_GAP_S) -> bool:
        """Whether a group came in the last `quiet_gap_s` (the incident has not ended)."""
        return now - self.last_seen <= quiet_gap_s

    @property
    def title_class(self) -> str:
        """The class of most of its failure groups, a tie going to the class it started with, then to the class
        seen first: what it is shown and judged by (its start's class alone named a rank's 28 timeouts `refused`,
        a full pool's one refusal that came first)."""
        classes, first = self.classes, self.reason_class
        return max(classes, key=lambda name: (classes[name], name == first)) if classes else first

    @property
    def suspect_text(self) -> str:
        """Its suspect in words, a host with the count of its sessions that failed (`decode at 10.0.0.7 (4
        sessions)`)."""
        if self.suspect.kind != "host":
            return self.suspect.text
        more = "+" if len(self.sessions) >= SESSIONS_KEPT else ""
        return f"{self.suspect.text} ({len(self.sessions)}{more} sessions)"

    def headline(self) -> str:
        """`prefill-0/TP1 sends corrupt KV (checksum)`."""
        return f"{self.suspect_text} {Kind(self.kind).verb} ({self.title_class})"

    def evidence_lines(self) -> list[str]:
        """Why the suspect, the most said first; a host's names its sessions that failed first, an instance's the
        ranks of it that failed together."""
        lines = [text for text, _ in sorted(self.evidence.items(), key=lambda item: -item[1])]
        ranks = _of_ranks(self)
        if (self.suspect.kind == "host" or ranks) and self.sessions:
            more = len(self.sessions) - SESSIONS_SHOWN
            named = ", ".join(self.sessions[:SESSIONS_SHOWN]) + (f" and {more} more" if more > 0 else "")
            lines.insert(0, f"its {'ranks' if ranks else 'sessions'} {named} failed together")
        return lines


class Part(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What one failure group put into its incident (taken back out when its room is folded again)."""

    incident: int
    room: int
    echoes: int
    reason_class: str
    evidence: str
    noticed_by: str
    lead: LeadKey
    """The group's lead: a view finds a group's incident by it."""


@dataclass
class _Tracked:
    failures: list[Observed] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    last_ts: float = 0.0
    """The latest time of its failures."""


class IncidentTracker:
    """Incidents kept current from the failures the model takes: `add()` each, `update()` now and then."""

    def __init__(
        self,
        quiet_gap_s: float = QUIET_GAP_S,
        incidents_kept: int = INCIDENTS_KEPT,
        rooms_tracked: int = ROOMS_TRACKED,
        rooms_listed: int = ROOMS_LISTED,
    ) -> None:
        self.quiet_gap_s = quiet_gap_s
        self.incidents_kept = incidents_kept
        self.rooms_tracked = rooms_tracked
        self.rooms_listed = rooms_listed
        self.incidents: dict[int, Incident] = {}
        """By id, oldest first."""
        self.next_id = 1
        self.started: dict[tuple[str, str], int] = {}
        """Incidents ever started, by (kind, suspect kind): what a Prometheus counter reads."""
        self.pending: list[Observed] = []
        self.held: set[int] = set()
        """Rooms whose echoes wait one update for their origin (see `update`)."""
        self.by_lead: dict[LeadKey, int] = {}
        """The incident of each of the newest `LEADS_KEPT` groups, by the group's lead, oldest first."""
        self.newest = 0.0
        """The latest time of a failure taken in (a room this much older than it no longer changes)."""
        self.listed = 0
        """Rooms listed over every incident."""
        self._tracked: dict[int, _Tracked] = {}
        """The rooms whose groups may still change, the least recently failed first."""
        self._latest: dict[IncidentKey, int] = {}
        """The newest incident of each key (the one a new group of that key may join)."""
        self._tagged: dict[Tag, dict[int, None]] = {}
        """The incidents kept by what a group's lookups ask of them (`_tags`, and the sessions they remember and the
        ranks they tally as noticing), so a group looks at the few that may take it, not at every one kept."""
        self._causes: dict[tuple[str, str], TimedKeys[IncidentKey]] = {}
        """The keys of `_latest` of a rank's `unresponsive` incident, by the rank's (instance, role), placed by the
        incident's latest failure (`_explaining` walks those a quiet gap before a group's time or later)."""
        self._causes_of_role: dict[str, TimedKeys[IncidentKey]] = {}
        """Those keys by the rank's role alone (a side, a pool of any instance: `_explaining`)."""
        self._leads: dict[int, dict[LeadKey, None]] = {}
        """`by_lead` the other way: the leads of each incident kept (an incident taken in hands its own on)."""

    def add(self, failure: Observed, around: Surroundings) -> None:
        """A failure the model took (folded at the next `update`, or now when too many wait)."""
        self.pending.append(failure)
        if len(self.pending) >= PENDING_MAX:
            self.update(around, final=False)  # as a sweep would: more deliveries are coming

    def add_roomless(
        self, ts: float, rank: str, attribution: Attribution, reason_class: str, around: Surroundings
    ) -> None:
        """A failure that names no room (DOMAIN.md: an incident of its address, never a made-up room): it joins,
        or starts, its incident now and stays there (no room's fold takes it back out)."""
        if attribution.registration_of and (registration := self._registration_of(attribution, ts)) is not None:
            registration.echoes += 1  # a decode's 503 for the prefill's missing ranks: their failure, seen from there
            registration.last_seen = max(registration.last_seen, ts)
            return
        registering = attribution.evidence == UNREGISTERED_RANKS
        asked = self._asked_before(attribution, _instance(rank), ts, around) if registering else []
        for before in asked:  # read after it, they would have been its echoes: no incident of their own
            self._drop(before, started=False)
        incident = self._joinable(attribution, ts, reason_class, around)
        incident.origins += 1
        incident.roomless += 1
        _started_by(incident, ts, reason_class)
        self._seen(incident, ts)
        _count(incident.classes, reason_class)
        _count(incident.evidence, attribution.evidence)
        self._notice(incident, rank)
        for before in asked:
            incident.echoes += before.origins + before.echoes
        self._keep_bound()

    def _asked_before(
        self, registration: Attribution, instance: str, ts: float, around: Surroundings
    ) -> list[Incident]:
        """The incidents of decodes' bootstrap errors alone, made within a quiet gap before `ts`, that can only mean
        the prefill `instance` whose ranks could not register then (`registration`): the decode asked while its ranks
        still tried. Of the address it registers at (or one logs of it may be at), or, for a 503 that names none,
        of the prefill side of a decode while `instance` is the one prefill known."""
        only = [instance] == around.instances_of("prefill")
        address = registration.suspect.name
        addresses = [address, *(other for other, at in around.instances_at.items() if instance in at)]

        def meant(other: Incident) -> bool:
            suspect = other.suspect
            if suspect.kind == "side":
                return only and suspect.role == "prefill" and set(other.evidence) == {NOT_ALL_REGISTERED}
            return (
                suspect.kind == "instance" and suspect.role == "prefill" and suspect.name in addresses
                and set(other.evidence) <= {NOT_ALL_REGISTERED, BOOTSTRAP_UNANSWERED}
            )  # fmt: skip

        return [
            other
            for other in self._with(("side", "prefill"), *(("name", name) for name in addresses))
            if other.kind == registration.kind and other.roomless == other.origins
            and ts - self.quiet_gap_s <= other.first_seen <= ts and meant(other)
        ]  # fmt: skip

    def update(self, around: Surroundings, final: bool = True) -> None:
        """Fold the rooms the pending failures touched; their groups join (or start) incidents.

        Not `final` (a sweep, with more deliveries to come): a room new to the tracker whose failures are all
        echoes naming an origin not seen yet waits for the next update, once (the origin's own record is
        usually in another agent's next batch), so no incident is made of the echoes' guess in between."""
        if not self.pending:
            return
        by_room: dict[int, list[Observed]] = {}
        for failure in self.pending:
            by_room.setdefault(failure.room, []).append(failure)
        self.pending = []
        held, self.held = self.held, set()
        if not final:
            for room, new in list(by_room.items()):
                for failure in new:
                    if not failure.origin or failure.origin == failure.rank:  # an origin, or an echo of no name
                        break
                else:
                    if room not in held and room not in self._tracked:
                        self.pending += by_room.pop(room)
                        self.held.add(room)
        emptied: set[int] = set()
        for room, new in sorted(by_room.items(), key=lambda item: item[1][0].ts):  # in time order, about
            tracked = self._tracked.pop(room, None)
            if tracked is None or len(tracked.failures) + len(new) > FAILURES_PER_ROOM:
                if tracked is not None:
                    self._untrack(room, tracked)
                tracked = _Tracked()
            else:
                for part in tracked.parts:
                    self._take_out(part, emptied)
            tracked.failures += new
            for failure in new:  # a loop: no generator per room
                if failure.ts > tracked.last_ts:
                    tracked.last_ts = failure.ts
            self.newest = max(self.newest, tracked.last_ts)
            tracked.parts = [self._put_in(group, around) for group in room_groups(room, tracked.failures)]
            self._tracked[room] = tracked
        for incident_id in emptied:
            incident = self.incidents.get(incident_id)
            if incident is not None and incident.origins <= 0:
                self._drop(incident, started=False)
        self._let_go()
        for lead in list(islice(self.by_lead, max(0, len(self.by_lead) - LEADS_KEPT))):
            self._unlead(lead)
        self._keep_bound()

    def _keep_bound(self) -> None:
        """Drop the oldest incidents past `incidents_kept`, in one pass (as `_let_go`: one at a time, each would walk
        the dead slots before it); nothing to build under the bound (a roomless failure asks at each one)."""
        past = len(self.incidents) - self.incidents_kept
        if past > 0:
            for incident in list(islice(self.incidents.values(), past)):
                self._drop(incident, started=True)

    def _let_go(self) -> None:
        """Stop tracking the least recently failed rooms past `rooms_tracked` or `ROOM_REUSE_S` older than the
        newest, in one pass (deleting the first key of a dict one at a time walks the dead slots before it)."""
        leaving: list[int] = []
        for room, tracked in self._tracked.items():
            if (
                len(self._tracked) - len(leaving) <= self.rooms_tracked
                and tracked.last_ts >= self.newest - ROOM_REUSE_S
            ):
                break
            leaving.append(room)
        for room in leaving:
            self._untrack(room, self._tracked.pop(room))

    @property
    def tracking(self) -> int:
        """Rooms whose groups may still change, held now (at most `rooms_tracked`)."""
        return len(self._tracked)

    def incident_of(self, group: FailureGroup) -> Incident | None:
        """The incident a group of a tracked room is in (None for an older group, or one not folded yet)."""
        incident_id = self.by_lead.get(_lead_key(group.lead))
        return self.incidents.get(incident_id) if incident_id is not None else None

    def in_order(self, now: float) -> list[Incident]:
        """Every incident kept, in the order every view lists them (docs/incidents.md, "Order"): the ongoing first,
        the cluster's before the client's aborts, each by start, the earliest on top (a new one joins below them);
        then the ended, the latest to end on top. A new failure moves no row; an incident moves when it ends."""

        def place(incident: Incident) -> tuple[int, float, int]:
            if incident.ongoing(now, self.quiet_gap_s):
                return (int(incident.client), incident.first_seen, incident.id)
            return (2, -incident.last_seen, -incident.id)

        return sorted(self.incidents.values(), key=place)

    def state(self) -> TrackerState:
        """Everything the tracker holds, for a keyframe."""
        return TrackerState(
            self.quiet_gap_s, self.incidents_kept, self.rooms_tracked, self.rooms_listed,
            list(self.incidents.values()), self.next_id, [(*key, n) for key, n in self.started.items()],
            list(self.pending), sorted(self.held), [(room, t.failures, t.parts) for room, t in self._tracked.items()],
            [(*key, incident_id) for key, incident_id in self._latest.items()], self.listed,
            [(*lead, incident_id) for lead, incident_id in self.by_lead.items()], self.newest,
        )  # fmt: skip

    @classmethod
    def restored(cls, state: TrackerState) -> IncidentTracker:
        """The tracker a keyframe's `state()` holds."""
        tracker = cls(state.quiet_gap_s, state.incidents_kept, state.rooms_tracked, state.rooms_listed)
        tracker.incidents = {incident.id: incident for incident in state.incidents}
        for incident in state.incidents:
            tracker._index(incident)
        tracker.next_id, tracker.listed, tracker.pending = state.next_id, state.listed, state.pending
        tracker.held = set(state.held)
        tracker.started = {(kind, suspect): n for kind, suspect, n in state.started}
        for kind, suspect, name, incident_id in state.latest:
            tracker._set_latest((kind, suspect, name), incident_id)
        for room, failures, parts in state.tracked:
            tracker._tracked[room] = _Tracked(failures, parts, max(failure.ts for failure in failures))
        tracker.by_lead = {(ts, room, rank): incident_id for ts, room, rank, incident_id in state.leads}
        for lead, incident_id in tracker.by_lead.items():
            if incident_id in tracker.incidents:  # not one the bound dropped since
                tracker._leads.setdefault(incident_id, {})[lead] = None
        tracker.newest = state.newest
        return tracker

    def _put_in(self, group: FailureGroup, around: Surroundings) -> Part:
        attribution = attribute(group, around)
        ts, origin, lead = group.first_ts, group.origin, group.lead
        reason_class = origin.reason_class if origin is not None else _unseen_class(group)
        incident = self._joinable(attribution, ts, reason_class, around)
        noticed_by = origin.rank if origin is not None else group.origin_label or lead.rank  # its echoes name it
        part = Part(incident.id, group.room, len(group.echoes), reason_class, attribution.evidence, noticed_by,
                    _lead_key(lead))  # fmt: skip
        incident.origins += 1
        incident.echoes += part.echoes
        _started_by(incident, ts, reason_class)
        self._seen(incident, ts)
        _count(incident.classes, part.reason_class)
        _count(incident.evidence, part.evidence)
        self._notice(incident, part.noticed_by)
        held = incident.rooms.get(part.room)
        if held is None:
            incident.room_count += 1
            self.listed += 1
        incident.rooms[part.room] = (held or 0) + 1
        if part.lead in self.by_lead:  # a group whose room was folded afresh (`FAILURES_PER_ROOM`)
            self._lead(part.lead, incident.id)
        else:  # `_lead`, inline: the path of every new group
            self.by_lead[part.lead] = incident.id
            leads = self._leads.get(incident.id)
            if leads is None:
                self._leads[incident.id] = {part.lead: None}
            else:
                leads[part.lead] = None
        if attribution.sessions and self._remember(incident, attribution.sessions):  # an incident of one it did not
            gap = self.quiet_gap_s  # remember yet may be under way (its incidents of those it did, it took in then)
            named = self._with(*(("name", session) for session in incident.sessions))
            if incident.suspect.kind == "instance":  # and a host's incident of the sessions it named
                named += self._with(*(("session", session) for session in attribution.sessions))
            for single in [other for other in named if _one_of_its_sessions(other, incident, gap)]:
                self._absorb(incident, single, formed=True)
        elif attribution.session and incident.suspect.kind == "host":
            self._remember(incident, (attribution.session,))
        return part

    def _joinable(self, attribution: Attribution, ts: float, reason_class: str, around: Surroundings) -> Incident:
        """The incident a group of this attribution at `ts` joins: a rank's `unresponsive` incident under way that
        explains it (see `_explains`), else a multi-node decode's (or a host's) that named its session (`_of_session`)
        unless the session's own started later, else the latest of its own key unless a quiet gap lies between them,
        else, for a decode session or host, the host's incident that started in the same seconds (`_of_host`), else a
        new one (which takes in the vaguer incidents it explains; a host's, the incidents of its sessions that started
        in the same seconds)."""
        suspect = attribution.suspect
        if attribution.echoed and (named := self._of_suspect(suspect, ts)) is not None:
            return named
        vague = attribution.kind is Kind.UNRESPONSIVE and suspect.kind in ("instance", "side")
        if vague or attribution.symptom_of or attribution.unseen_origin:
            cause = self._explaining(attribution, ts, around)
            if cause is not None:
                return cause
        key = (str(attribution.kind), suspect.kind, suspect.name)
        latest = self._latest.get(key)
        incident = self.incidents.get(latest) if latest is not None else None
        own = incident if incident is not None and self._takes(incident, ts, attribution.standing) else None
        sessions = (attribution.session,) * bool(attribution.session)  # one session, or a host's several
        sessions = attribution.sessions if suspect.kind == "host" else sessions
        sessions = (suspect.name,) if not sessions and _instance(suspect.name) and suspect.kind == "rank" else sessions
        instance = self._of_session(attribution, sessions, ts) if sessions else None
        if instance is not None and (own is None or instance.first_seen >= own.first_seen):
            return instance  # a multi-node decode's (or a host's) session, unless it failed afresh since
        if own is not None:
            return own
        host = session_host(suspect) if sessions and attribution.kind is Kind.UNRESPONSIVE else ""
        together = self._of_host(host, suspect, ts) if host else []
        if together and together[0].suspect.kind == "host":
            return together[0]  # another session of its host started failing in the same seconds
        if together and suspect.kind == "rank":  # one incident each of other sessions of its host: the host's
            suspect, key = Suspect("host", host, "decode"), (str(attribution.kind), "host", host)
            latest = self._latest.get(key)
        rank = suspect.name if suspect.kind == "rank" and not host else ""
        if rank and (together := self._of_instance(rank, attribution.kind, ts, around)):
            suspect = Suspect("instance", _instance(rank), suspect.role)  # every rank of it failed: the instance's
            key = (str(attribution.kind), "instance", suspect.name)
            latest = self._latest.get(key)
        earlier = latest is not None and latest in self.incidents and ts < self.incidents[latest].first_seen
        incident = Incident(
            self.next_id, str(attribution.kind), suspect, ts, ts, reason_class, symptom_of=attribution.symptom_of
        )
        self.next_id += 1
        self.incidents[incident.id] = incident
        self._index(incident)
        if not earlier:  # not a late group from before the latest one
            self._set_latest(key, incident.id)
        started = (incident.kind, suspect.kind)
        self.started[started] = self.started.get(started, 0) + 1
        if rank and together:  # its ranks' incidents, its ranks remembered as a host's sessions: a cause as a rank's
            for single in together:
                self._absorb(incident, single, formed=True)
            self._remember(incident, (rank,))
            self._index(incident)
            if _a_cause(incident) and self._latest.get(key) == incident.id:
                self._place_cause(key, incident)
        if _a_cause(incident):
            beside = self._with(("instance", _end_of(suspect)), ("side", suspect.role), ("symptom", ""))
            explained = [other for other in beside if _explains(incident, other, self.quiet_gap_s, around)]
            for vaguer in [other for other in explained if self._alone_explains(incident, other, around)]:
                self._absorb(incident, vaguer)
            for own in [other for other in self._with(("name", suspect.name)) if _its_own_unseen(incident, other)]:
                self._absorb(incident, own)
        for single in together if suspect.kind == "host" else ():  # the sessions of its host that failed with it
            self._absorb(incident, single, formed=True)
        return incident

    def _takes(self, incident: Incident, ts: float, standing: bool) -> bool:
        """Whether a group at `ts` joins an incident it may join: no quiet gap lies between them, or it is a sender's
        standing refusal of a peer it gave up on, at or after the incident's start (no quiet gap ends that)."""
        gap = self.quiet_gap_s
        return incident.first_seen - gap <= ts <= incident.last_seen + gap or (standing and ts >= incident.first_seen)

    def _of_session(self, attribution: Attribution, sessions: Iterable[str], ts: float) -> Incident | None:
        """The incident of its kind (of any, for a sender's standing refusal: the link's whose rooms it refused while
        their decode answered), of a multi-node decode instance (or of a host) whose rooms named a session a group
        suspects, that takes the group at `ts` (`_takes`), the latest to start of several."""
        named = [
            incident
            for incident in self._with(*(("session", session) for session in sessions))
            if (incident.kind == attribution.kind or attribution.standing)
            and self._takes(incident, ts, attribution.standing)
        ]
        return max(named, key=lambda incident: incident.first_seen, default=None)

    def _of_host(self, host: str, suspect: Suspect, ts: float) -> list[Incident]:
        """The `unresponsive` incidents of other decode sessions of `host`, or of the host, that started failing
        within a quiet gap of `ts` (the same seconds: one death of the host's decode side, not a later one): the
        host's first when there is one (the latest to start), else those of single sessions."""
        tagged = self._tagged.get(("host", host))
        if not tagged:  # the common case: no other session of its host failed
            return []
        gap = self.quiet_gap_s
        newest = islice(reversed(tagged), HOST_LOOKS)  # the newest: the ones near `ts`
        near = [
            incident
            for incident in (self.incidents[incident_id] for incident_id in sorted(newest))
            if incident.kind == Kind.UNRESPONSIVE and incident.suspect != suspect
            and abs(incident.first_seen - ts) <= gap
        ]  # fmt: skip
        hosts = [incident for incident in near if incident.suspect.kind == "host"]
        return [max(hosts, key=lambda incident: incident.first_seen)] if hosts else near

    def _of_instance(self, rank: str, kind: Kind, ts: float, around: Surroundings) -> list[Incident]:
        """The incidents of `kind` of the other ranks of `rank`'s instance that take a group at `ts` (`_takes`), when
        with `rank` they are every rank of it (`_whole`: the instance stalled, corrupted its sends, refused, whole);
        else none (a rank failing alone, or some of its ranks, stay their own). A rank heard as taken
        (`kvtop.model.taken`) is no rank of the instance here: its failures stay its own."""
        if rank.endswith(TAKEN_SUFFIX):  # a second process claiming a rank of it, not a rank of its layout
            return []
        instance = _instance(rank)
        others = [
            incident
            for incident in self._with(("of", instance))
            if incident.kind == kind and incident.suspect.name != rank and self._takes(incident, ts, False)
            and not incident.suspect.name.endswith(TAKEN_SUFFIX)
        ]  # fmt: skip
        if not others:
            return []
        failing = {rank, *(incident.suspect.name for incident in others)}
        return others if _whole(failing, around.ranks_of(instance), around.tp_sizes.get(instance, 0)) else []

    def _explaining(self, attribution: Attribution, ts: float, around: Surroundings) -> Incident | None:
        """The one rank's `unresponsive` incident under way at `ts` that explains a vaguer attribution (an
        instance or a side that stopped answering, a pool that filled), if exactly one does; for a group whose
        origin's record never arrived, the incident under way that its origin is the suspect of, else the one
        it noticed most failures of then."""
        if attribution.unseen_origin:
            return self._of_origin(attribution.unseen_origin, ts)
        if not self._causes:  # no rank's `unresponsive` incident is kept (most logs' groups): none explains it
            return None
        vague = Incident(0, str(attribution.kind), attribution.suspect, ts, ts, "", symptom_of=attribution.symptom_of)

        since = ts - self.quiet_gap_s  # an incident whose latest failure was longer ago explains nothing at `ts`

        def causes(keys: Iterable[IncidentKey]) -> list[Incident]:
            """Up to two of the rank's `unresponsive` incidents of these keys (of `_causes`) that explain it: which
            two is of no matter, only whether one alone does."""
            explaining = (
                incident
                for key in keys
                if (incident := self.incidents.get(self._latest[key])) is not None
                and _explains(incident, vague, self.quiet_gap_s, around)
            )
            return list(islice(explaining, 2))

        suspect = attribution.suspect
        if attribution.symptom_of:  # a rank of its own instance first, else of any
            found = causes(self._causes_of(since, attribution.symptom_of)) or causes(self._causes_of(since))
        elif suspect.kind == "side":  # a rank of its role: of no instance first (an address's), else of any
            role = suspect.role
            found = causes(self._causes_of(since, "", role)) or causes(self._causes_of(since, role=role))
        elif suspect.kind == "instance":  # a rank of that instance
            found = causes(self._causes_of(since, suspect.name))
        else:
            return None
        return found[0] if len(found) == 1 else None

    def _alone_explains(self, cause: Incident, vague: Incident, around: Surroundings) -> bool:
        """Whether a new rank incident takes in a vaguer one it explains: always, but for a pool that filled of
        another instance than the rank's while another rank's incident under way explains it too (as `_explaining`
        asks of a new group: a killed decode rank's incident took in the refusals of a prefill instance whose two
        stalled ranks filled its pool)."""
        if not vague.symptom_of or _end_of(cause.suspect) == vague.symptom_of:
            return True
        return not any(
            other is not cause and _explains(other, vague, self.quiet_gap_s, around)
            for other in self._with(("rank", ""))
        )

    def _registration_of(self, attribution: Attribution, ts: float) -> Incident | None:
        """The latest incident of a prefill's ranks that could not register with its bootstrap server
        (`UNREGISTERED_RANKS`), by its address or its ranks (`Attribution.registration_of`), that started by `ts`:
        however long before, for the decode's answer says its ranks are missing still."""
        names = attribution.registration_of
        found = [
            incident
            for incident in self._with(*(("name", name) for name in names), *(("noticed", name) for name in names))
            if UNREGISTERED_RANKS in incident.evidence and incident.first_seen - BEFORE_S <= ts
        ]
        return max(found, key=lambda incident: incident.first_seen, default=None)

    def _of_suspect(self, suspect: Suspect, ts: float) -> Incident | None:
        """The one incident of `suspect` under way at `ts`, whatever its kind (None: none, or several: the echo does
        not tell which kind of failure its origin recorded, and kvtop does not guess)."""
        under_way = [
            incident
            for incident in self._with(("name", suspect.name), ("session", suspect.name))  # its instance's, of ranks
            if (incident.suspect == suspect or _of_ranks(incident))
            and incident.first_seen - BEFORE_S <= ts <= incident.last_seen + DRAIN_S
        ]
        return under_way[0] if len(under_way) == 1 else None

    def _of_origin(self, origin: str, ts: float) -> Incident | None:
        def under_way(incident: Incident) -> bool:
            return incident.first_seen - BEFORE_S <= ts <= incident.last_seen + DRAIN_S and not incident.client

        named = [incident for incident in self._with(("name", origin)) if under_way(incident)]
        if named:
            return max(named, key=lambda incident: incident.origins)
        noticed = [incident for incident in self._with(("noticed", origin)) if under_way(incident)]
        return max(noticed, key=lambda incident: incident.noticed_by[origin]) if noticed else None

    def _with(self, *tags: Tag) -> list[Incident]:
        """The incidents kept of any of these tags (`_tagged`), by id: the order of `incidents`."""
        found = {incident_id for tag in tags for incident_id in self._tagged.get(tag, ())}
        return [self.incidents[incident_id] for incident_id in sorted(found)]

    def _tag(self, incident: Incident, *tags: Tag) -> None:
        for tag in tags:
            self._tagged.setdefault(tag, {})[incident.id] = None

    def _untag(self, incident: Incident, *tags: Tag) -> None:
        for tag in tags:
            tagged = self._tagged.get(tag)
            if tagged is not None:
                tagged.pop(incident.id, None)
                if not tagged:
                    del self._tagged[tag]

    def _index(self, incident: Incident) -> None:
        """Tag a new (or restored) incident with all a lookup asks of it."""
        self._tag(incident, *_tags(incident), *(("session", session) for session in incident.sessions))
        self._tag(incident, *(("noticed", rank) for rank in incident.noticed_by))

    def _notice(self, incident: Incident, rank: str, count: int = 1) -> None:
        """Tally a rank that noticed the incident's failures (`_of_origin` asks which incidents a rank noticed)."""
        tallied = incident.noticed_by
        if rank in tallied:  # the common case: a rank noticing more (tagged already)
            tallied[rank] += count
            return
        _count(tallied, rank, count)
        self._tag(incident, ("noticed", rank if rank in tallied else "other"))

    def _unnotice(self, incident: Incident, rank: str) -> None:
        tallied = rank if rank in incident.noticed_by else "other"
        _uncount(incident.noticed_by, rank)
        if tallied not in incident.noticed_by:
            self._untag(incident, ("noticed", tallied))

    def _remember(self, incident: Incident, sessions: Iterable[str]) -> bool:
        """The incident remembers these sessions too (`_of_session` asks which incidents remember one); whether it
        remembers one it did not before."""
        added = _remember(incident.sessions, sessions)
        self._tag(incident, *(("session", session) for session in added))
        return bool(added)

    def _lead(self, lead: LeadKey, incident_id: int) -> None:
        """The group of this lead is in this incident (`by_lead`; `_leads` the other way)."""
        was = self.by_lead.get(lead)
        if was is not None:
            self._leads.get(was, {}).pop(lead, None)
        self.by_lead[lead] = incident_id  # a lead given another incident keeps its place (the oldest go first)
        leads = self._leads.get(incident_id)
        if leads is None:
            self._leads[incident_id] = {lead: None}
        else:
            leads[lead] = None

    def _unlead(self, lead: LeadKey) -> None:
        """Forget a group's incident (an incident's emptied entry in `_leads` goes when it is dropped)."""
        was = self.by_lead.pop(lead, None)
        if was is not None:
            self._leads.get(was, {}).pop(lead, None)

    def _causes_of(self, since: float, instance: str | None = None, role: str | None = None) -> Iterator[IncidentKey]:
        """The keys of `_latest` of a rank's `unresponsive` incident of this instance and role (None: any) whose latest
        failure is at `since` or later (and some a little before)."""
        roles = list(self._causes_of_role) if role is None else [role]
        at = (
            [self._causes_of_role.get(of) for of in roles]
            if instance is None
            else [self._causes.get((instance, of)) for of in roles]
        )
        return chain.from_iterable(keys.since(since) for keys in at if keys is not None)

    def _set_latest(self, key: IncidentKey, incident_id: int) -> None:
        """Make `incident_id` the newest of its key (its incident looked up: a keyframe's ids come from a file)."""
        was = self.incidents.get(self._latest.get(key, 0))
        if was is not None:  # the role may differ (one address named as both roles' rank)
            self._unset_cause(key, was.suspect.role)
        self._latest[key] = incident_id
        incident = self.incidents.get(incident_id)
        if incident is not None and _a_cause(incident):
            self._place_cause(key, incident)

    def _place_cause(self, key: IncidentKey, incident: Incident) -> None:
        """Index a cause (`_a_cause`: a rank's `unresponsive` incident), the newest of its key, by its latest failure
        (again as it grows)."""
        role, width = incident.suspect.role, self.quiet_gap_s
        self._causes.setdefault((_end_of(incident.suspect), role), TimedKeys(width)).put(key, incident.last_seen)
        self._causes_of_role.setdefault(role, TimedKeys(width)).put(key, incident.last_seen)

    def _seen(self, incident: Incident, ts: float) -> None:
        """A failure at `ts` joined the incident: its latest failure moves on (and its place among the causes)."""
        if ts <= incident.last_seen:
            return
        incident.last_seen = ts
        key = incident.key
        if _a_cause(incident) and self._latest.get(key) == incident.id:
            self._place_cause(key, incident)

    def _del_latest(self, incident: Incident) -> None:
        del self._latest[incident.key]
        self._unset_cause(incident.key, incident.suspect.role)

    def _unset_cause(self, key: IncidentKey, role: str) -> None:
        _forget(self._causes, (key[2] if key[1] == "instance" else _instance(key[2]), role), key)
        _forget(self._causes_of_role, role, key)

    def _absorb(self, cause: Incident, vaguer: Incident, formed: bool = False) -> None:
        """Move an incident's groups into the incident that explains them (tracked parts follow): the earlier start
        is the incident's, with its class; of the two starts counted, the one counted first stays, but where `cause`
        is made of such parts (`formed`: an instance of its ranks' incidents, a host or a multi-node decode of its
        sessions'), its own: the cause a user of `started` reads under the suspect kind it is shown with."""
        cause.origins += vaguer.origins
        cause.echoes += vaguer.echoes
        _started_by(cause, vaguer.first_seen, vaguer.reason_class)
        kept, taken_back = (
            (_counted(cause), _counted(vaguer)) if formed else sorted((_counted(cause), _counted(vaguer)))
        )
        cause.counted = kept
        self.started[taken_back[1:]] -= 1
        self._seen(cause, vaguer.last_seen)
        for mine, theirs in ((cause.classes, vaguer.classes), (cause.evidence, vaguer.evidence)):
            for name, count in theirs.items():
                _count(mine, name, count)
        for rank, count in vaguer.noticed_by.items():
            self._notice(cause, rank, count)
        for room, count in vaguer.rooms.items():
            if room in cause.rooms:
                self.listed -= 1
                cause.room_count -= 1
            cause.rooms[room] = cause.rooms.get(room, 0) + count
        cause.room_count += vaguer.room_count
        cause.rooms_complete = cause.rooms_complete and vaguer.rooms_complete
        taken = cause.suspect.kind in ("host", "instance") and vaguer.suspect.kind == "rank"
        single = (vaguer.suspect.name,) if taken else ()
        self._remember(cause, (*single, *vaguer.sessions))  # a host's remembers the sessions of those it took in
        for room in vaguer.rooms:  # a tracked room's parts are in the rooms listed (only untracked ones leave)
            tracked = self._tracked.get(room)
            if tracked is not None and any(part.incident == vaguer.id for part in tracked.parts):
                tracked.parts = [
                    msgspec.structs.replace(part, incident=cause.id) if part.incident == vaguer.id else part
                    for part in tracked.parts
                ]
        for lead in list(self._leads.get(vaguer.id, ())):
            self._lead(lead, cause.id)
        self.listed -= len(vaguer.rooms)
        vaguer.rooms = {}
        self._drop(vaguer, started=True)

    def _take_out(self, part: Part, emptied: set[int]) -> None:
        self._unlead(part.lead)
        incident = self.incidents.get(part.incident)
        if incident is None:  # dropped by the bound meanwhile
            return
        incident.origins -= 1
        incident.echoes -= part.echoes
        _uncount(incident.classes, part.reason_class)
        _uncount(incident.evidence, part.evidence)
        self._unnotice(incident, part.noticed_by)
        held = incident.rooms.get(part.room)
        if held is not None:
            if held > 1:
                incident.rooms[part.room] = held - 1
            else:
                del incident.rooms[part.room]
                incident.room_count -= 1
                self.listed -= 1
        emptied.add(incident.id)

    def _untrack(self, room: int, tracked: _Tracked) -> None:
        """A room whose groups no longer change: its parts stay; past the listing bound it leaves the lists."""
        for part in tracked.parts:
            incident = self.incidents.get(part.incident)
            if incident is not None and self.listed > self.rooms_listed and room in incident.rooms:
                del incident.rooms[room]
                self.listed -= 1
                incident.rooms_complete = False

    def _drop(self, incident: Incident, started: bool) -> None:
        """Forget an incident: past the bound or taken in by another (`started`: its count stands, or went to the
        other), or emptied by a refold (its start is taken back)."""
        del self.incidents[incident.id]
        self._leads.pop(incident.id, None)  # its leads in `by_lead` find no incident now
        self._untag(incident, *_tags(incident), *(("session", session) for session in incident.sessions))
        self._untag(incident, *(("noticed", rank) for rank in incident.noticed_by))
        self.listed -= len(incident.rooms)
        if self._latest.get(incident.key) == incident.id:
            self._del_latest(incident)
        if not started:
            self.started[_counted(incident)[1:]] -= 1


def _tags(incident: Incident) -> list[Tag]:
    """What lookups ask of an incident that never changes: its suspect's name, and the vaguer incidents a rank's
    `unresponsive` incident may explain (`_explains`: of its instance, of its role's side, a symptom), and those."""
    tags: list[Tag] = [("name", incident.suspect.name)]
    if incident.symptom_of:
        tags.append(("symptom", ""))
    if incident.kind == Kind.UNRESPONSIVE:
        suspect = incident.suspect
        if suspect.kind in ("instance", "rank"):
            tags.append((suspect.kind, suspect.name if suspect.kind == "instance" else ""))
        if _of_ranks(incident):  # a cause as a rank's incident is (`_a_cause`)
            tags.append(("rank", ""))
        elif suspect.kind == "side":
            tags.append(("side", suspect.role))
        if host := session_host(suspect):  # a decode session's, or a host's: `_of_host`
            tags.append(("host", host))
    if incident.suspect.kind == "rank" and (instance := _instance(incident.suspect.name)):
        tags.append(("of", instance))  # `_of_instance`, whatever the kind of failure
    return tags


def _explains(cause: Incident, vague: Incident, quiet_gap_s: float, around: Surroundings) -> bool:
    """Whether a rank's `unresponsive` incident explains a vaguer one under way beside it: the instance of that
    rank, or the side of its role of an instance it could have served (`could_serve`), stopped answering; or a pool
    filled (a symptom) while the rank was silent."""
    if vague.id == cause.id or not cause.first_seen - BEFORE_S <= vague.first_seen:
        return False
    suspect, rank = vague.suspect, cause.suspect
    if vague.symptom_of:  # a pool full while the rank's incident is ongoing (or draining after it)
        return vague.first_seen <= cause.last_seen + quiet_gap_s
    if vague.kind != Kind.UNRESPONSIVE or vague.first_seen > cause.last_seen + quiet_gap_s:
        return False
    if suspect.kind == "instance":
        return _end_of(rank) == suspect.name
    return suspect.kind == "side" and suspect.role == rank.role and could_serve(rank, suspect.name, around)


def _its_own_unseen(cause: Incident, other: Incident) -> bool:
    """Whether an incident is of failures the rank of a new `unresponsive` incident recorded of itself (a refusal)
    whose records never arrived, only echoes that carried them, just before it (the rank went silent before it
    published them): its silence's, as such a group that comes after it joins it (`Attribution.echoed`)."""
    return (
        other is not cause and other.suspect == cause.suspect and other.kind != cause.kind
        and set(other.evidence) == {CARRIED_BOTH} and cause.first_seen - BEFORE_S <= other.first_seen
    )  # fmt: skip


def _one_of_its_sessions(single: Incident, instance: Incident, quiet_gap_s: float) -> bool:
    """Whether an incident is of one session that a multi-node decode's (or a host's) incident of its kind named, or
    of a host whose sessions a multi-node decode's named, under way when that one started (a room that named
    sessions on that host only came first): its groups are the instance's. One that started later is the session
    failing afresh (`IncidentTracker._joinable`)."""
    suspect = single.suspect
    if suspect.kind == "host":
        named = instance.suspect.kind == "instance" and any(session in instance.sessions for session in single.sessions)
    else:
        named = suspect.kind == "rank" and suspect.name in instance.sessions
    return (
        single is not instance and named and single.kind == instance.kind
        and instance.first_seen - quiet_gap_s <= single.last_seen and single.first_seen <= instance.first_seen
    )  # fmt: skip


def _instance(label: str) -> str:
    return label.rpartition("/")[0]


def _whole(failing: set[str], seen: list[str], stated: int) -> bool:
    """Whether the failing ranks of an instance are every rank of it: every rank seen of it, and where its log stated
    its TP size (`server_args`), ranks 0 to size-1 of each pipeline stage among them (a log that names two ranks of a
    TP 8 instance names no whole one)."""
    if not seen or not failing.issuperset(seen):
        return False
    if not stated:
        return True
    stages: dict[str, set[int]] = {}
    for label in failing:
        rank = label.rpartition("/")[2]
        digits = len(rank) - len(rank.rstrip("0123456789"))  # the TP number: the label's last digits
        if not digits:
            return False
        stages.setdefault(rank[:-digits], set()).add(int(rank[-digits:]))
    return all(numbers.issuperset(range(stated)) for numbers in stages.values())


def _of_ranks(incident: Incident) -> bool:
    """Whether an incident is of an instance whose every rank stopped answering (`IncidentTracker._of_instance`): it
    remembers its ranks by label."""
    return incident.suspect.kind == "instance" and bool(incident.sessions) and "/" in incident.sessions[0]


def _a_cause(incident: Incident) -> bool:
    """Whether an incident may explain vaguer ones (`_explains`): a rank's `unresponsive` one, or an instance's whose
    every rank stopped answering."""
    return incident.kind == Kind.UNRESPONSIVE and (incident.suspect.kind == "rank" or _of_ranks(incident))


def _end_of(cause: Suspect) -> str:
    """The instance of a cause's suspect (`_a_cause`): a rank's, or the instance itself."""
    return cause.name if cause.kind == "instance" else _instance(cause.name)


def room_groups(room: int, failures: list[Observed]) -> list[FailureGroup]:
    """The room's groups. The common cases without a fold: one failure alone, one origin of our agents alone, or
    one origin and echoes that each name it, all within `ROOM_REUSE_S` and no failure twice (what the fold makes of
    them)."""
    if len(failures) == 1:  # a room one rank failed (every log's most): the group the fold makes of it
        failure = failures[0]
        if failure.is_origin:
            return [FailureGroup(room, failure.rank, failure)]
        return [FailureGroup(room, failure.origin, None, [failure])]  # its origin's, or "origin unknown" ("")
    origins = [failure for failure in failures if failure.is_origin]
    if len(origins) == 1 and not origins[0].inferred and origins[0].reason_class != ABORTED:
        origin = origins[0]
        echoes = [failure for failure in failures if failure is not origin]
        first, last = min(f.ts for f in failures), max(f.ts for f in failures)
        if (
            all(echo.origin == origin.rank for echo in echoes)
            and last - first <= ROOM_REUSE_S
            and len({(f.ts, f.rank) for f in failures}) == len(failures)
        ):
            return [FailureGroup(room, origin.rank, origin, sorted(echoes))]
    return fold_room(failures)


def _lead_key(lead: Observed) -> LeadKey:
    return (lead.ts, lead.room, lead.rank)


def _unseen_class(group: FailureGroup) -> str:
    """The class of a group whose origin's record never arrived: what an echo carried of it, else its lead's."""
    carrier = carrying_echo(group)
    return carrier.origin_class if carrier is not None and carrier.origin_class else group.lead.reason_class


def _started_by(incident: Incident, ts: float, reason_class: str) -> None:
    """A failure at `ts` joined the incident: one earlier than its start starts it (its class is the incident's)."""
    if ts < incident.first_seen:
        incident.first_seen, incident.reason_class = ts, reason_class


def _counted(incident: Incident) -> tuple[int, str, str]:
    """The start `started` counts for an incident (`Incident.counted`; its own unless it took in an earlier one)."""
    return incident.counted if incident.counted[0] else (incident.id, incident.kind, incident.suspect.kind)


def _forget(index: dict[_At, TimedKeys[IncidentKey]], at: _At, key: IncidentKey) -> None:
    """Take a key out of its entry of an index of keys (an entry emptied goes)."""
    keys = index.get(at)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[at]


def _remember(kept: list[str], sessions: Iterable[str]) -> list[str]:
    """Keep the sessions not kept yet, up to `SESSIONS_KEPT`; those it kept."""
    added: list[str] = []
    for session in sessions:
        if len(kept) >= SESSIONS_KEPT:
            break
        if session not in kept:
            kept.append(session)
            added.append(session)
    return added


def _count(counts: dict[str, int], name: str, count: int = 1) -> None:
    if name not in counts and len(counts) >= LABELS_KEPT:
        name = "other"
    counts[name] = counts.get(name, 0) + count


def _uncount(counts: dict[str, int], name: str) -> None:
    if name not in counts:
        name = "other"
    left = counts.get(name, 0) - 1
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)


class TrackerState(msgspec.Struct, array_like=True):
    """An `IncidentTracker` as a keyframe holds it (`IncidentTracker.state`, `IncidentTracker.restored`)."""

    quiet_gap_s: float
    incidents_kept: int
    rooms_tracked: int
    rooms_listed: int
    incidents: list[Incident]
    next_id: int
    started: list[tuple[str, str, int]]
    pending: list[Observed]
    held: list[int]
    tracked: list[tuple[int, list[Observed], list[Part]]]
    latest: list[tuple[str, str, str, int]]
    listed: int
    leads: list[tuple[float, int, str, int]]
    newest: float
