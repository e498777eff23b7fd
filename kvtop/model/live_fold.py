"""The fold kept current as failures arrive and age out: only the rooms that changed are folded again.

`fold()` over every failure the model holds (up to 50k) costs hundreds of
milliseconds; a dashboard refreshing twice a second while failures stream in
cannot pay that per frame. Same result as `fold(model.failures)`.

A failure that names its own rank is counted as an origin where it arrives (the ranks' counts, the
timelines); the fold may find it an echo (the same failure seen first by another rank of its instance, a
prefill rank's log line after its decode gave up, a client's abort seen by another rank). `take_moved()`
tells which failures the fold moved, so those counts can follow it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

from kvtop.model.fold import FailureGroup, Observed, fold, shown_level

LeadKey = tuple[float, int, str, str]
"""(ts, room, rank, reason): a failure as both its event and its `Observed` name it."""


def lead_key(failure: Observed) -> LeadKey:
    return (failure.ts, failure.room, failure.rank, failure.reason)


def group_order(group: FailureGroup) -> tuple[float, int, str]:
    """The order `fold()` returns groups in."""
    return (group.first_ts, group.room, group.origin_label)


class LiveFold:
    """Mirrors a bounded deque of failures (the model's) through `sync()`; groups stay sorted as they change."""

    def __init__(self) -> None:
        self._seen_total = 0
        self._window: deque[Observed] = deque()
        self._by_room: dict[int, list[Observed]] = {}
        self._groups_by_room: dict[int, list[tuple[tuple[float, int, str], FailureGroup]]] = {}
        self._keys: list[tuple[float, int, str]] = []
        """`group_order` of every group, sorted (computed once per group: it walks the echoes)."""
        self._groups: list[FailureGroup] = []
        """The groups in that order."""
        self.leads: dict[LeadKey, str] = {}
        """The lead of every group, with the level it shows at (levels follow the fold: any other member is
        debug)."""
        self._demoted: dict[int, dict[LeadKey, Observed]] = {}
        """Per room, its failures that name their own rank and that the fold holds as echoes."""
        self._moved: list[tuple[Observed, bool]] = []
        """Failures the fold moved since `take_moved()`: (failure, True when it became an echo)."""

    def sync(self, failures: Sequence[Observed], total: int) -> list[FailureGroup]:
        """Every group of `failures`, given how many failures were ever appended to it (`total`)."""
        new = min(len(failures), total - self._seen_total)
        self._seen_total = total
        changed: set[int] = set()
        for failure in (failures[index] for index in range(len(failures) - new, len(failures))):
            self._window.append(failure)
            self._by_room.setdefault(failure.room, []).append(failure)
            changed.add(failure.room)
        while len(self._window) > len(failures):
            dropped = self._window.popleft()
            room = self._by_room[dropped.room]
            room.remove(dropped)
            if not room:
                del self._by_room[dropped.room]
            changed.add(dropped.room)
        for room_id in changed:
            for key, group in self._groups_by_room.pop(room_id, []):
                index = bisect.bisect_left(self._keys, key)
                while self._groups[index] is not group:  # equal keys: find this very group
                    index += 1
                del self._keys[index], self._groups[index]
                self.leads.pop(lead_key(group.lead), None)
            room_failures = self._by_room.get(room_id)
            if room_failures:
                keyed = [(group_order(group), group) for group in fold(room_failures)]
                self._groups_by_room[room_id] = keyed
                for key, group in keyed:
                    index = bisect.bisect_right(self._keys, key)  # new groups are the newest: an append
                    self._keys.insert(index, key)
                    self._groups.insert(index, group)
                    self.leads[lead_key(group.lead)] = shown_level(group.lead)
            self._note_demoted(room_id, self._groups_by_room.get(room_id, []))
        return self._groups

    def _note_demoted(self, room_id: int, keyed: list[tuple[tuple[float, int, str], FailureGroup]]) -> None:
        """Tell the moves of a refolded room's own-rank failures between origin and echo. A failure the window
        forgot keeps what it was counted as (a count never goes back for what is no longer held)."""
        demoted = {lead_key(f): f for _, group in keyed for f in group.echoes if f.is_origin}
        before = self._demoted.pop(room_id, {})
        self._moved += [(failure, True) for key, failure in demoted.items() if key not in before]
        held = {lead_key(f) for f in self._by_room.get(room_id, ())}
        self._moved += [(failure, False) for key, failure in before.items() if key not in demoted and key in held]
        if demoted:
            self._demoted[room_id] = demoted

    def take_moved(self) -> list[tuple[Observed, bool]]:
        """The failures the fold moved since the last call: (failure, True when the fold made the own-rank
        failure an echo; False when a later failure made it an origin again)."""
        moved, self._moved = self._moved, []
        return moved

    def since(self, ts: float) -> list[FailureGroup]:
        """The groups that started at `ts` or later (the last ones: they are in time order)."""
        return self._groups[bisect.bisect_left(self._keys, (ts, -1, "")) :]
