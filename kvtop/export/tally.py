"""Failure origins and echoes, counted so that the counts only grow while the model forgets.

The model keeps a bounded window of failures (`FAILURES_KEPT`) and folds them on
demand; a Prometheus counter must never go down while the process lives. The
tally reads each failure once (the ones the model took since the last sync),
folds the rooms they belong to (`fold()`, as `kvtop failures` does), and keeps
per room the most it ever counted under each label set. A room quiet for
`ROOM_REUSE_S` of event time (its id would be a new room) or pushed out by the
`failures_kept` bound is closed: its counts move into a closed total, its failures
are forgotten. So a counter is the closed total plus the open rooms' counts,
and neither part ever shrinks, even when a later failure refolds a room (an
origin that turns out to be an echo of an earlier one stays counted once as
an origin; the echo count catches up).

Labels: `engine_type` and `pd_instance` of the origin (of the echo, for an
echo; `unknown` where nobody saw the origin) and the origin's reason class.
Client aborts (`aborted` groups) are counted apart, never as failures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtop.model.fold import ROOM_REUSE_S, FailureGroup, Observed, fold

UNKNOWN = "unknown"

ORIGINS, ECHOES, ABORTS, ABORT_ECHOES = "origins", "echoes", "aborts", "abort_echoes"
KINDS = (ORIGINS, ECHOES, ABORTS, ABORT_ECHOES)
"""What a failure counts as: the origin of a group, an echo folded under one, or the same for a client's abort."""

Key = tuple[str, str, str, str]
"""(kind, engine_type, pd_instance, reason_class)."""

FAILURES_KEPT = 50_000
"""Failures the tally holds in its open rooms, as many as the model keeps (a room that fails forever, on a
hostile agent's word, is closed and started again rather than held without bound)."""


@dataclass
class _Room:
    failures: list[Observed] = field(default_factory=list)
    counted: Counter[Key] = field(default_factory=Counter)
    """The most this room ever counted per key (what it adds to the open total)."""
    last_ts: float = 0.0


def group_keys(group: FailureGroup) -> Iterable[Key]:
    """What one group counts: one key for its origin, one per echo."""
    origin = group.origin
    reason_class = origin.reason_class if origin is not None else UNKNOWN
    kind, echo_kind = (ABORTS, ABORT_ECHOES) if group.aborted else (ORIGINS, ECHOES)
    if origin is not None:
        yield (kind, origin.role or UNKNOWN, origin.instance or UNKNOWN, reason_class)
    else:  # the origin named by its echoes was never seen (or nobody named one)
        instance = group.origin_label.rpartition("/")[0] if group.origin_label else ""
        yield (kind, UNKNOWN, instance or UNKNOWN, reason_class)
    for echo in group.echoes:
        yield (echo_kind, echo.role or UNKNOWN, echo.instance or UNKNOWN, reason_class)


class FailureTally:
    """Feed it the failures the model took (`add`); read monotonic counts per key (`totals`)."""

    def __init__(self, failures_kept: int = FAILURES_KEPT, quiet_s: float = ROOM_REUSE_S) -> None:
        self.failures_kept = failures_kept
        self.quiet_s = quiet_s
        self.seen_total = 0
        """How many failures the model had ever taken when the tally last read it (`model.failures_total`)."""
        self.missed = 0
        """Failures the model forgot before the tally read them (more than its window between two reads)."""
        self._rooms: dict[int, _Room] = {}
        """Open rooms, the least recently failed first."""
        self._open: Counter[Key] = Counter()
        self._closed: Counter[Key] = Counter()
        self._latest_ts = 0.0
        self._held = 0
        """Failures held in the open rooms."""

    def unread(self, total: int, kept: int) -> int:
        """How many of the model's newest `kept` failures are new, given it ever took `total`; counts the rest
        of what is new as missed. Call under the model's lock, then `add` those newest failures."""
        new = total - self.seen_total
        self.seen_total = total
        readable = max(0, min(new, kept))
        self.missed += new - readable
        return readable

    def add(self, failures: Iterable[Observed]) -> None:
        """Count new failures (in the order the model took them): their rooms are folded again."""
        changed: set[int] = set()
        for failure in failures:
            room = self._rooms.pop(failure.room, None) or _Room()
            self._rooms[failure.room] = room  # to the end: the most recently failed
            room.failures.append(failure)
            self._held += 1
            room.last_ts = max(room.last_ts, failure.ts)
            self._latest_ts = max(self._latest_ts, failure.ts)
            changed.add(failure.room)
        for room_id in changed:
            self._recount(self._rooms[room_id])
        self._close_quiet()

    def totals(self) -> Counter[Key]:
        """Every key's count so far (closed rooms and open ones): never less than before."""
        return self._closed + self._open

    @property
    def open_rooms(self) -> int:
        return len(self._rooms)

    def _recount(self, room: _Room) -> None:
        now: Counter[Key] = Counter()
        for group in fold(room.failures):
            now.update(group_keys(group))
        for key, count in now.items():
            more = count - room.counted[key]
            if more > 0:
                room.counted[key] = count
                self._open[key] += more

    def _close_quiet(self) -> None:
        """Close the rooms quiet for `quiet_s` (least recently failed first), and the oldest past the bound."""
        cutoff = self._latest_ts - self.quiet_s
        while self._rooms:
            room_id, room = next(iter(self._rooms.items()))
            if room.last_ts >= cutoff and self._held <= self.failures_kept:
                break
            del self._rooms[room_id]
            self._held -= len(room.failures)
            for key, count in room.counted.items():
                self._closed[key] += count
                self._open[key] -= count
