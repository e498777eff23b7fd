"""The fold: each failure origin once, its echoes hung under it.

Within a room (DESIGN.md, "The fold"):

1. a failure whose origin is its own rank is a root;
2. several ranks of one instance that report the same reason class within
   `SAME_FAILURE_S` of each other are one failure: the earliest is the root,
   the others are its echoes;
3. a failure that names another origin hangs under that origin's group (a
   group whose origin was never seen, e.g. the rank died, keeps the name);
4. a failure with no origin hangs under the root that best explains it. A
   cross-instance echo from a log ("Failed to get kvcache from prefill
   instance") looks to the other side first, earliest first. SGLang's bare
   `is_from_another_rank` ("Failed due to an unknown reason from another
   rank") is an echo inside its own instance: it hangs under its instance's
   root, else under the group its instance's other failures joined, else as
   a cross-instance echo. With no root at all, under a synthetic "origin
   unknown" group;
5. a room id that comes back more than `ROOM_REUSE_S` after its last failure is
   a new room (ids are random but may repeat), unless its failure says it timed
   out after as long (`timed out after 300.0s`: the room was open all along);
6. an origin inferred from a log (not named by an agent) on a prefill rank,
   at or after a decode root of the room that timed out or aborted, is an
   echo of that root: the decode gave up and told the prefill (DOMAIN.md,
   "Decode to prefill");
7. a client's abort (`aborted`) is one failure of the room on every rank that
   recorded it, whichever side: the earliest is the origin, the others are
   the same abort seen by other ranks (DOMAIN.md, the abort origin);
8. an origin inferred from a log on a decode rank whose reason is, word for
   word, that of a prefill origin of the room not later than it (within
   `SAME_FAILURE_S`) is an echo of that origin: the prefill told it (SGLang
   0.5.23's NIXL and MoRI backends send the prefill's reason with its Failed
   status, and the decode records it as its own);
9. an origin inferred from a log on a decode rank that timed out waiting for
   the KV, after a prefill origin of the room within the wait its timeout
   names (a client's abort, a send that failed, any failure of its own; a
   timeout that names no wait: a client's abort only), is an echo of that
   origin, the earliest:
   the prefill stopped the room without the decode hearing of it, and the
   decode waited out its timeout (a client's abort: sglang PR #28651; a
   failure of NIXL's sender, which tells the decode nothing before sglang PR
   #36108: issue #36033; a Mooncake send whose Failed status never reached the
   decode it could not write to: a DeepSeek-R1 deployment's notes, nvidia_peermem
   missing, `Failed to send kv chunk` on prefill, `timed out after 300.0s in
   KVPoll.WaitingForInput` on decode);
10. origins of the room named by agents that name the same suspect are one
   failure, noticed on both sides (a decode rank killed: its prefill peer's
   send fails and its own instance loses it, each before the other's word
   arrives): the earliest is the origin.
11. an origin inferred from a log on a prefill rank that timed out in
   Bootstrapping, after a decode origin of the room (not a timeout or abort:
   rule 6) within the wait its timeout names, is an echo of that origin, the
   earliest: the decode failed the room before its transfer request reached
   that rank (its `send_metadata to prefill H:P failed`, a bootstrap query or
   a heartbeat lost), told the prefill nothing, and the prefill waited out its
   timeout for the request that never came.

Each group has a lead (`FailureGroup.lead`): its origin, else its earliest
echo. Levels follow the fold (DESIGN.md): the lead shows at its shown level
(`shown_level`), every other member at debug.

Groups are computed from the set of a room's failures sorted by time, so the
result never depends on the order in which events arrived.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

SAME_FAILURE_S = 2.0
ROOM_REUSE_S = 60.0
ABORTED = "aborted"
"""The class of a client's abort (`Aborted by AbortReq.`): shown and counted, never a cluster fault."""
GAVE_UP = frozenset({"timeout_bootstrap", "timeout_waiting", "timeout_transfer", "aborted"})
"""Decode failures after which decode tells prefill (ABORT): prefill failures that follow are their echoes."""
_TIMED_OUT_AFTER = re.compile(r"timed out after (\d{1,9}(?:\.\d+)?) ?s")
"""SGLang's timeouts say how long the room waited (`Request R timed out after 300.0s in KVPoll.WaitingForInput`)."""


class Observed(msgspec.Struct, frozen=True, order=True, gc=False):
    """One failure as one rank recorded it (a Struct: built per failure event, 10x cheaper than a frozen
    dataclass, and never walked by the garbage collector)."""

    ts: float
    room: int
    rank: str
    """The rank's label, `instance/TPn`."""
    role: str
    reason: str
    reason_class: str
    origin: str = ""
    """The label of the rank that observed the failure first ("" when unknown)."""
    level: str = ""
    from_another_rank: bool = False
    """SGLang's flag: the rank learnt of the failure from another rank of its instance."""
    inferred: bool = False
    """The origin was inferred from a log line, not named by an agent (rule 6 may overrule it)."""
    suspect: str = ""
    """What an agent's origin named as the likely cause (`Failure.suspect`; kvtop.model.suspects)."""
    origin_class: str = ""
    """An agent's echo: the class its origin recorded (`Failure.origin_class`; "" when unknown)."""

    @property
    def instance(self) -> str:
        return self.rank.rpartition("/")[0]

    @property
    def is_origin(self) -> bool:
        return self.origin == self.rank


@dataclass
class FailureGroup:
    """One failure of one room: its origin (None when never seen) and every echo of it."""

    room: int
    origin_label: str
    """Who the origin is ("" for a synthetic "origin unknown" group)."""
    origin: Observed | None
    echoes: list[Observed] = field(default_factory=list)

    @property
    def title(self) -> str:
        """`origin-label reason-class`, e.g. `decode-0/TP1 checksum` (what summaries count): the class the origin
        recorded, as its echoes tell it while its own event is not seen (an agent's echo carries it)."""
        label = self.origin_label or "origin unknown"
        told = (
            self.origin.reason_class
            if self.origin
            else next((e.origin_class for e in self.echoes if e.origin_class), "")
        )
        return f"{label} {told}" if told else label

    @property
    def echo_count(self) -> int:
        return len(self.echoes)

    @property
    def first_ts(self) -> float:
        first = self.origin.ts if self.origin is not None else self.echoes[0].ts  # a group without one has an echo
        for echo in self.echoes:  # a loop, not `min()` over a generator: asked of every group at every fold
            if echo.ts < first:
                first = echo.ts
        return first

    @property
    def aborted(self) -> bool:
        """A client's abort (its origin's class is `aborted`), not a cluster fault."""
        return self.origin is not None and self.origin.reason_class == ABORTED

    @property
    def lead(self) -> Observed:
        """The member the default view shows: the origin, else the earliest echo."""
        if self.origin is not None:
            return self.origin
        return self.echoes[0] if len(self.echoes) == 1 else min(self.echoes)  # one: most groups without an origin


def shown_level(lead: Observed) -> str:
    """The level a group's lead shows at: the level its rank logged, or, where that was debug (an echo
    whose origin was never seen) or no level at all, the level of an origin of its side (warning prefill,
    error decode)."""
    if lead.level in ("info", "warning", "error"):
        return lead.level
    return "warning" if lead.role == "prefill" else "error"


def fold(failures: Iterable[Observed]) -> list[FailureGroup]:
    """Every failure group of the given failures, ordered by time."""
    by_room: dict[int, list[Observed]] = {}
    for failure in failures:
        by_room.setdefault(failure.room, []).append(failure)
    groups: list[FailureGroup] = []
    for room_failures in by_room.values():
        groups.extend(fold_room(room_failures))
    return sorted(groups, key=lambda g: (g.first_ts, g.room, g.origin_label))


def fold_room(failures: Iterable[Observed]) -> list[FailureGroup]:
    """The failure groups of one room id's failures (each use of the id apart), in no particular order."""
    groups: list[FailureGroup] = []
    for epoch in _epochs(sorted(set(failures))):
        groups.extend(_fold_room(epoch))
    return groups


def _epochs(ordered: list[Observed]) -> list[list[Observed]]:
    """Split one room id's failures where it was quiet for longer than `ROOM_REUSE_S` (a reused id), unless the
    failure after the quiet timed out after waiting as long."""
    epochs: list[list[Observed]] = [[]]
    for failure in ordered:
        quiet = failure.ts - epochs[-1][-1].ts if epochs[-1] else 0.0
        if quiet > ROOM_REUSE_S and quiet > _waited(failure) + SAME_FAILURE_S:
            epochs.append([])
        epochs[-1].append(failure)
    return epochs


def _waited(failure: Observed) -> float:
    """How long the room waited before the failure, where its reason says (a timeout's), else 0."""
    found = _TIMED_OUT_AFTER.search(failure.reason) if failure.reason_class.startswith("timeout") else None
    return float(found[1]) if found else 0.0


def _fold_room(ordered: list[Observed]) -> list[FailureGroup]:
    roots: list[FailureGroup] = []
    by_label: dict[str, FailureGroup] = {}
    gave_up = [f for f in ordered if f.is_origin and f.role == "decode" and f.reason_class in GAVE_UP]
    prefill_reasons = {f.reason for f in ordered if f.is_origin and f.role == "prefill"}
    failed_first = [
        f for f in ordered
        if f.is_origin and f.role == "decode" and f.reason_class not in GAVE_UP and f.reason not in prefill_reasons
    ]  # fmt: skip  # a decode reason a prefill origin also said may be its echo (rule 8), never a root of rule 11
    told = [
        f for f in ordered
        if f.is_origin and f.role == "prefill" and f.reason_class != ABORTED
        and _gave_up_before(gave_up, f) is None and _request_never_came(failed_first, f) is None
    ]  # fmt: skip
    stopped = [f for f in ordered if f.is_origin and f.role == "prefill" and (f.reason_class == ABORTED or f in told)]
    followers: list[tuple[Observed, Observed]] = []
    for failure in (f for f in ordered if f.is_origin):
        cause = (
            _gave_up_before(gave_up, failure)
            or _request_never_came(failed_first, failure)
            or _told_by(told, failure)
            or _waited_on_prefill(stopped, failure)
        )
        if cause is not None:
            followers.append((failure, cause))
            continue
        same = next((g for g in roots if g.origin and _same_failure(g.origin, failure)), None)
        if same is None:
            group = FailureGroup(failure.room, failure.rank, failure)
            roots.append(group)
        else:
            same.echoes.append(failure)
            group = same
        by_label[failure.rank] = group
    for failure, cause in followers:
        by_label[cause.rank].echoes.append(failure)
    unknown: list[Observed] = []
    for failure in (f for f in ordered if not f.is_origin):
        if not failure.origin:
            unknown.append(failure)
            continue
        target = by_label.get(failure.origin) or _joined_by_carried(roots, failure)
        if target is None:
            target = FailureGroup(failure.room, failure.origin, None)
            roots.append(target)
        by_label[failure.origin] = target
        target.echoes.append(failure)
    for failure in (f for f in unknown if not f.from_another_rank):
        _best_root(roots, failure).echoes.append(failure)
    for failure in (f for f in unknown if f.from_another_rank):
        _own_instance_root(roots, failure).echoes.append(failure)
    return roots


def _joined_by_carried(roots: list[FailureGroup], echo: Observed) -> FailureGroup | None:
    """The root an agent's echo of an origin not seen (yet) belongs to: the one its origin's own record, as the
    echo carried it (its class and suspect), would have joined (`_same_failure`), so an echo that came before its
    origin's record makes no failure of its own beside the room's."""
    if not echo.suspect:
        return None
    carried = Observed(echo.ts, echo.room, echo.origin, "", echo.reason, echo.origin_class, echo.origin,
                       suspect=echo.suspect)  # fmt: skip
    return next((g for g in roots if g.origin and _same_failure(g.origin, carried)), None)


def _gave_up_before(gave_up: list[Observed], failure: Observed) -> Observed | None:
    """The decode root a log-inferred prefill origin follows (rule 6), if any."""
    if not failure.inferred or failure.role != "prefill":
        return None
    return next((cause for cause in gave_up if cause.ts <= failure.ts), None)


def _request_never_came(failed_first: list[Observed], failure: Observed) -> Observed | None:
    """The decode origin (earliest first) a log-inferred prefill timeout in Bootstrapping follows (rule 11), if any:
    one within the wait its reason says it waited out (none where it says none)."""
    if not failure.inferred or failure.role != "prefill" or failure.reason_class != "timeout_bootstrap":
        return None
    waited = _waited(failure)
    began = failure.ts - waited - SAME_FAILURE_S
    return next((cause for cause in failed_first if waited and began <= cause.ts <= failure.ts), None)


def _told_by(told: list[Observed], failure: Observed) -> Observed | None:
    """The prefill origin whose reason a log-inferred decode origin records word for word (rule 8), if any."""
    if not failure.inferred or failure.role != "decode":
        return None
    return next(
        (cause for cause in told if cause.reason == failure.reason and cause.ts <= failure.ts + SAME_FAILURE_S), None
    )


def _waited_on_prefill(stopped: list[Observed], failure: Observed) -> Observed | None:
    """The prefill origin (earliest first) a log-inferred decode timeout in WaitingForInput follows (rule 9), if any:
    one within the wait its reason says it waited out; where it says none, only a client's abort before it."""
    if not failure.inferred or failure.role != "decode" or failure.reason_class != "timeout_waiting":
        return None
    waited = _waited(failure)
    began = failure.ts - waited - SAME_FAILURE_S
    return next(
        (
            cause
            for cause in stopped
            if cause.ts <= failure.ts and (began <= cause.ts if waited else cause.reason_class == ABORTED)
        ),
        None,
    )


def _own_instance_root(roots: list[FailureGroup], failure: Observed) -> FailureGroup:
    """Where an echo from another rank of the same instance belongs: with that instance's failure."""
    instance = failure.instance
    own = [g for g in roots if g.origin is not None and g.origin.instance == instance]
    if not own:
        own = [g for g in roots if any(e.instance == instance and not e.from_another_rank for e in g.echoes)]
    if own:
        return min(own, key=lambda g: (g.first_ts, g.origin_label))
    return _best_root(roots, failure)


def _same_failure(root: Observed, other: Observed) -> bool:
    """Ranks of one instance seeing the same class of failure at about the same time: one failure; a client's
    abort of the room, on any rank of either side (rule 7); and agents' origins that name the same suspect (rule
    10)."""
    if root.reason_class == other.reason_class == ABORTED:
        return True
    if root.suspect and root.suspect == other.suspect and not (root.inferred or other.inferred):
        return True
    return (
        root.instance == other.instance
        and root.reason_class == other.reason_class
        and abs(other.ts - root.ts) <= SAME_FAILURE_S
    )


def _best_root(roots: list[FailureGroup], failure: Observed) -> FailureGroup:
    """The root that best explains an echo of unknown origin (created when there is none)."""
    seen = [g for g in roots if g.origin is not None]
    other_side = [g for g in seen if g.origin and g.origin.role != failure.role]
    for candidates in (other_side, seen, [g for g in roots if not g.origin_label]):
        if candidates:
            return min(candidates, key=lambda g: g.first_ts)
    group = FailureGroup(failure.room, "", None)
    roots.append(group)
    return group
