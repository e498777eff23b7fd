"""A ring of finished transfers that takes a delivery's `TransferDone` events as they are and writes them in bulk."""

from __future__ import annotations

from kvtop.model.rolling import RingBuffer
from kvtop.model.timeline import BYTES, Timeline
from transport.plane.events import TransferDone

WAITING_KEPT = 64
"""Transfers a ring holds as events before it writes them (a read writes them at once)."""


class TransferRing(RingBuffer):
    """The last `capacity` transfers as rows of (ts, bytes), or (ts, bytes, seconds) with `seconds`.

    At 1024 agents a delivery holds one or two transfers, and each went to three rings (its rank's, its link's,
    the model's): a numpy copy per ring per delivery. Here a delivery is one list extend per ring, and the rows
    are made and copied once per `WAITING_KEPT` transfers, or when the ring is read."""

    def __init__(self, capacity: int, seconds: bool = False) -> None:
        super().__init__(capacity, 2 if seconds else 1)
        self._seconds = seconds
        self._waiting: list[TransferDone] = []
        self._timeline: Timeline | None = None

    def feed(self, timeline: Timeline) -> None:
        """Add the bytes of every transfer written from now on to `timeline` (in bulk, as rows are written)."""
        self._timeline = timeline

    def add(self, transfers: list[TransferDone]) -> None:
        """Append these transfers, in order, after every row before them."""
        waiting = self._waiting
        waiting += transfers
        if len(waiting) >= WAITING_KEPT:
            self.flush()

    def flush(self) -> None:
        waiting = self._waiting
        if not waiting:
            return
        self._waiting = []
        import numpy as np  # here, not with the module (`kvtop.model.rolling`)

        columns = [[e.ts for e in waiting], [e.nbytes for e in waiting]]
        if self._seconds:
            columns.append([e.seconds for e in waiting])
        rows = np.array(columns, dtype=np.float64).T
        self._write(rows)
        if self._timeline is not None:
            self._timeline.add(rows[:, 0], rows[:, 1], BYTES)
