"""Rolling statistics on a numpy ring buffer: fixed memory, vectorised window queries."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class RingBuffer:
    """The last `capacity` rows of (ts, value_0, value_1, ...) as float64."""

    def __init__(self, capacity: int, columns: int) -> None:
        self._data: npt.NDArray[np.float64] = np.zeros((capacity, 1 + columns))
        self._next = 0
        self._size = 0

    def extend(self, rows: npt.NDArray[np.float64]) -> None:
        """Append rows of (ts, value_0, ...) in order, as many single appends would (the oldest fall out)."""
        capacity = len(self._data)
        if len(rows) > capacity:
            self._next = (self._next + len(rows) - capacity) % capacity
            rows = rows[-capacity:]
        head = min(len(rows), capacity - self._next)
        if head == len(rows):  # no wrap: one copy (a batch's few rows, nearly always)
            self._data[self._next : self._next + head] = rows
        else:
            self._data[self._next : self._next + head] = rows[:head]
            self._data[: len(rows) - head] = rows[head:]
        self._next = (self._next + len(rows)) % capacity
        self._size = min(self._size + len(rows), capacity)

    def window(self, since: float) -> npt.NDArray[np.float64]:
        """Rows with ts >= `since` (any order)."""
        rows = self._data[: self._size]
        return rows[rows[:, 0] >= since]

    def per_second(self, now: float, window_s: float, column: int = 1) -> float:
        """The sum of `column` over the rows of the last `window_s` seconds, divided by `window_s`."""
        return float(self.window(now - window_s)[:, column].sum()) / window_s

    def __len__(self) -> int:
        return self._size


def percentiles(values: npt.NDArray[np.float64], points: tuple[float, ...] = (50, 90, 99)) -> list[float]:
    """The given percentiles of `values` (zeros when empty)."""
    if values.size == 0:
        return [0.0 for _ in points]
    return [float(v) for v in np.percentile(values, points)]
