"""The fold kept current as failures arrive and age out: only the rooms that changed are folded again.

`fold()` over every failure the model holds (up to 50k) costs hundreds of
milliseconds; a dashboard refreshing twice a second while failures stream in
cannot pay that per frame. Same result as `fold(model.failures)`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kvtop.fold import FailureGroup, Observed, fold


def group_order(group: FailureGroup) -> tuple[float, int, str]:
    """The order `fold()` returns groups in."""
    return (group.first_ts, group.room, group.origin_label)


class LiveFold:
    """Mirrors a bounded deque of failures (the model's) through `sync()`."""

    def __init__(self) -> None:
        self._seen_total = 0
        self._window: deque[Observed] = deque()
        self._by_room: dict[int, list[Observed]] = {}
        self._groups_by_room: dict[int, list[FailureGroup]] = {}
        self._groups: list[FailureGroup] = []

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
        if not changed:
            return self._groups
        for room_id in changed:
            room_failures = self._by_room.get(room_id)
            if room_failures:
                self._groups_by_room[room_id] = fold(room_failures)
            else:
                self._groups_by_room.pop(room_id, None)
        self._groups = sorted((g for groups in self._groups_by_room.values() for g in groups), key=group_order)
        return self._groups
