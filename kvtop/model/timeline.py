"""Counts per fixed time bucket over the last few minutes: failures (origins, echoes) and bytes moved.

A ring of `BUCKETS` buckets of `BUCKET_S` seconds, each holding one row of columns: memory is fixed whatever
the rate, and a bucket is reused once the time it covered left the window. The rows are Python lists, made into a
numpy array only when read (`series`): a model filled for `kvtop check` never reads them, and loads no numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

BUCKET_S = 5.0
BUCKETS = 60
"""The window: 60 buckets of 5 s, the last five minutes."""
ORIGINS, ECHOES, BYTES = 0, 1, 2
"""The columns: failures a rank recorded first, failures it learnt of from another, bytes of finished transfers."""
COLUMNS = 3


class Timeline:
    """Sums per `bucket_s` seconds of the last `buckets` buckets; what is older than the window is dropped."""

    def __init__(self, bucket_s: float = BUCKET_S, buckets: int = BUCKETS) -> None:
        self.bucket_s = bucket_s
        self.ids: list[int] = [-1] * buckets
        """The bucket each slot holds (`floor(ts / bucket_s)`; -1: none)."""
        self.sums: list[list[float]] = [[0.0] * COLUMNS for _ in range(buckets)]

    def add_one(self, ts: float, column: int, amount: float = 1.0) -> None:
        """One value at `ts`."""
        bucket = int(ts // self.bucket_s)
        slot = bucket % len(self.ids)
        held = self.ids[slot]
        if held != bucket:
            if held > bucket:  # the slot holds a newer bucket: `ts` left the window
                return
            self.ids[slot] = bucket
            self.sums[slot] = [0.0] * COLUMNS
        self.sums[slot][column] += amount

    def move(self, ts: float, source: int, target: int) -> None:
        """One value at `ts` counted in `source` that belongs in `target` (nothing once `ts` left the window)."""
        bucket = int(ts // self.bucket_s)
        slot = bucket % len(self.ids)
        if self.ids[slot] == bucket:
            self.sums[slot][source] -= 1.0
            self.sums[slot][target] += 1.0

    def add(self, ts: npt.NDArray[np.float64], amounts: npt.NDArray[np.float64], column: int) -> None:
        """Many values at once (a ring's finished transfers as it writes them)."""
        if not len(ts):
            return
        first, last = int(ts.min() // self.bucket_s), int(ts.max() // self.bucket_s)
        if first == last:  # nearly always: a ring writes its rows every 64 transfers, or at each frame
            self.add_one(float(ts[0]), column, float(amounts.sum()))
            return
        for at, amount in zip(ts.tolist(), amounts.tolist(), strict=True):  # a batch spans a bucket or two
            self.add_one(at, column, amount)

    def series(self, now: float) -> npt.NDArray[np.float64]:
        """Every bucket of the window ending with the one that holds `now`, oldest first: rows of columns
        (zeros where nothing came)."""
        import numpy as np

        count = len(self.ids)
        last = int(now // self.bucket_s)
        empty = [0.0] * COLUMNS
        rows = []
        for bucket in range(last - count + 1, last + 1):
            slot = bucket % count
            rows.append(self.sums[slot] if self.ids[slot] == bucket else empty)
        return np.array(rows, dtype=np.float64)

    def state(self) -> tuple[list[int], list[float]]:
        """(bucket ids, sums row by row): what a keyframe keeps."""
        return list(self.ids), [amount for row in self.sums for amount in row]

    @classmethod
    def restored(cls, ids: list[int], sums: list[float]) -> Timeline:
        """The timeline `state()` described (an empty one when its shape is not this build's)."""
        timeline = cls()
        if len(ids) == len(timeline.ids) and len(sums) == len(ids) * COLUMNS:
            timeline.ids = [int(bucket) for bucket in ids]
            timeline.sums = [[float(amount) for amount in sums[i : i + COLUMNS]] for i in range(0, len(sums), COLUMNS)]
        return timeline
