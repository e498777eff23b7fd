"""Counts per fixed time bucket over the last few minutes: failures (origins, echoes) and bytes moved.

A ring of `BUCKETS` buckets of `BUCKET_S` seconds, each holding one row of columns: memory is fixed whatever
the rate, and a bucket is reused once the time it covered left the window.
"""

from __future__ import annotations

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
        self.ids: npt.NDArray[np.int64] = np.full(buckets, -1, dtype=np.int64)
        """The bucket each slot holds (`floor(ts / bucket_s)`; -1: none)."""
        self.sums: npt.NDArray[np.float64] = np.zeros((buckets, COLUMNS))

    def add_one(self, ts: float, column: int, amount: float = 1.0) -> None:
        """One value at `ts` (a failure: low volume, no numpy call)."""
        bucket = int(ts // self.bucket_s)
        slot = bucket % len(self.ids)
        held = self.ids.item(slot)  # a Python int: a third of `int()` of numpy's scalar
        if held != bucket:
            if held > bucket:  # the slot holds a newer bucket: `ts` left the window
                return
            self.ids[slot] = bucket
            self.sums[slot] = 0.0
        self.sums[slot, column] += amount

    def move(self, ts: float, source: int, target: int) -> None:
        """One value at `ts` counted in `source` that belongs in `target` (nothing once `ts` left the window)."""
        bucket = int(ts // self.bucket_s)
        slot = bucket % len(self.ids)
        if self.ids.item(slot) == bucket:
            self.sums[slot, source] -= 1.0
            self.sums[slot, target] += 1.0

    def add(self, ts: npt.NDArray[np.float64], amounts: npt.NDArray[np.float64], column: int) -> None:
        """Many values at once (a ring's finished transfers as it writes them)."""
        if not len(ts):
            return
        first, last = int(ts.min() // self.bucket_s), int(ts.max() // self.bucket_s)
        if first == last:  # nearly always: a ring writes its rows every 64 transfers, or at each frame
            self.add_one(float(ts[0]), column, float(amounts.sum()))
            return
        buckets = np.floor_divide(ts, self.bucket_s).astype(np.int64)
        slots = buckets % len(self.ids)
        for bucket in sorted(set(buckets.tolist())):  # a batch spans a bucket or two (np.unique loads numpy.ma)
            slot = bucket % len(self.ids)
            held = self.ids.item(slot)
            if held < bucket:
                self.ids[slot] = bucket
                self.sums[slot] = 0.0
        keep = self.ids[slots] == buckets
        np.add.at(self.sums[:, column], slots[keep], amounts[keep])

    def series(self, now: float) -> npt.NDArray[np.float64]:
        """Every bucket of the window ending with the one that holds `now`, oldest first: rows of columns
        (zeros where nothing came)."""
        count = len(self.ids)
        last = int(now // self.bucket_s)
        wanted = np.arange(last - count + 1, last + 1, dtype=np.int64)
        slots = wanted % count
        rows = self.sums[slots].copy()
        rows[self.ids[slots] != wanted] = 0.0
        return rows

    def state(self) -> tuple[list[int], list[float]]:
        """(bucket ids, sums row by row): what a keyframe keeps."""
        return self.ids.tolist(), self.sums.ravel().tolist()

    @classmethod
    def restored(cls, ids: list[int], sums: list[float]) -> Timeline:
        """The timeline `state()` described (an empty one when its shape is not this build's)."""
        timeline = cls()
        if len(ids) == len(timeline.ids) and len(sums) == timeline.sums.size:
            timeline.ids[:] = ids
            timeline.sums[:] = np.asarray(sums).reshape(timeline.sums.shape)
        return timeline
