"""A cumulative histogram of durations: fixed buckets, counts that only grow (what Prometheus scrapes).

numpy is imported where durations are bucketed, not with the module (`kvtop.model.rolling`).
"""

from __future__ import annotations

import itertools

TRANSFER_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of a transfer's duration: a page on loopback takes a millisecond, a stalled
room the transfer timeout (60 s by default)."""
HELD_KEPT = 512
"""Observed durations kept aside before they are bucketed (a read buckets them too), so that the ingest loop
buckets in bulk rather than per batch."""


class DurationHistogram:
    """Counts of observed durations per bucket (`bounds`, then +Inf) and their sum; never forgets."""

    def __init__(self, bounds: tuple[float, ...] = TRANSFER_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts: list[int] = [0] * (len(bounds) + 1)
        """Observations per bucket: `counts[i]` fell in (bounds[i-1], bounds[i]]; the last, above every bound."""
        self.total_s = 0.0
        self._held: list[float] = []

    def observe(self, seconds: list[float]) -> None:
        """Count these durations (kept aside, bucketed `HELD_KEPT` or more at a time in one pass)."""
        held = self._held
        held += seconds
        if len(held) >= HELD_KEPT:
            self._bucket()

    def _bucket(self) -> None:
        if not self._held:
            return
        import numpy as np

        seconds = np.array(self._held, dtype=np.float64)
        self._held = []
        buckets = np.searchsorted(np.asarray(self.bounds, dtype=np.float64), seconds, side="left")
        added = np.bincount(buckets, minlength=len(self.counts)).tolist()
        self.counts = [held + new for held, new in zip(self.counts, added, strict=True)]
        self.total_s += float(seconds.sum())

    def read(self) -> tuple[list[tuple[str, int]], float]:
        """(le, observations at or below it) per bound and "+Inf", as Prometheus's buckets read; and the sum."""
        self._bucket()
        running = list(itertools.accumulate(self.counts))
        bounds = [f"{bound:g}" for bound in self.bounds]
        return [*zip(bounds, running, strict=False), ("+Inf", running[-1])], self.total_s

    @property
    def count(self) -> int:
        self._bucket()
        return sum(self.counts)
