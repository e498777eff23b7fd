"""Open and stuck rooms counted a slice per frame: a walk over 100k open rooms at once (30 ms) would hold the
GIL the UI thread needs for a frame's paint."""

from __future__ import annotations

from kvtop.model import ClusterModel
from kvtop.tables import STUCK_AFTER_S

SLICE = 25_000
"""Open rooms looked at per frame: at two frames a second, 100k open rooms are counted every 2 s."""


class RoomCounter:
    """`counts()` gives (open, stuck) as of the last full pass over the open rooms; each call does one slice
    (a cluster with fewer open rooms than a slice is counted afresh at every call)."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self._ids: list[int] = []
        self._next = 0
        self._open = 0
        self._stuck = 0
        self._counts = (0, 0)

    def counts(self, now: float, gone: frozenset[str]) -> tuple[int, int]:
        if self._next >= len(self._ids):  # the last pass ended (or none began): start the next
            self._ids, self._next, self._open, self._stuck = self.model.open_ids(), 0, 0, 0
        rooms, cutoff = self.model.rooms, now - STUCK_AFTER_S
        for room_id in self._ids[self._next : self._next + SLICE]:
            room = rooms.get(room_id)
            if room is None or (gone and room.finished(gone)):
                continue  # retired since the pass began, or open only on ranks that are gone
            self._open += 1
            self._stuck += room.last_progress < cutoff
        self._next += SLICE
        if self._next >= len(self._ids):
            self._counts = (self._open, self._stuck)
        return self._counts
