"""Rolling statistics on a numpy ring buffer: fixed memory, vectorised window queries.

numpy is imported where an array is made, not with the module: `kvtop check` fills a model whose rings it never
reads, and numpy was 0.1 of its 0.26 CPU seconds (docs/performance.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class RingBuffer:
    """The last `capacity` rows of (ts, value_0, value_1, ...) as float64; the slots are made at the first row
    written or the first read."""

    def __init__(self, capacity: int, columns: int) -> None:
        self._shape: tuple[int, ...] = (capacity, 1 + columns)
        self._data: npt.NDArray[np.float64] | None = None
        self._next = 0
        self._size = 0

    def _slots(self) -> npt.NDArray[np.float64]:
        """Every slot, made (zeros) at the first call."""
        if self._data is None:
            import numpy as np

            self._data = np.zeros(self._shape)
        return self._data

    def extend(self, rows: npt.NDArray[np.float64]) -> None:
        """Append rows of (ts, value_0, ...) in order, as many single appends would (the oldest fall out)."""
        self.flush()
        self._write(rows)

    def flush(self) -> None:
        """Write what waits to be written, before a read (a ring that takes its rows at once has none)."""

    def _write(self, rows: npt.NDArray[np.float64]) -> None:
        data, count, start = self._slots(), len(rows), self._next
        capacity = len(data)
        if count <= capacity - start:  # no wrap: one copy (a batch's few rows, nearly always)
            data[start : start + count] = rows
        else:
            if count > capacity:
                start = (start + count - capacity) % capacity
                rows, count = rows[-capacity:], capacity
            head = capacity - start
            data[start:] = rows[:head]
            data[: count - head] = rows[head:]
        self._next = (start + count) % capacity
        size = self._size + count
        self._size = size if size < capacity else capacity

    def window(self, since: float) -> npt.NDArray[np.float64]:
        """Rows with ts >= `since` (any order)."""
        self.flush()
        rows = self._slots()[: self._size]
        return rows[rows[:, 0] >= since]

    def per_second(self, now: float, window_s: float, column: int = 1) -> float:
        """The sum of `column` over the rows of the last `window_s` seconds, divided by `window_s`."""
        return float(self.window(now - window_s)[:, column].sum()) / window_s

    def state(self) -> tuple[npt.NDArray[np.float64], int, int]:
        """(every slot, the next slot written, rows held): what a keyframe keeps."""
        self.flush()
        return self._slots(), self._next, self._size

    def restore(self, data: npt.NDArray[np.float64], next_slot: int, size: int) -> None:
        """Hold what `state()` described (this ring's shape or another's)."""
        self._data, self._shape, self._next, self._size = data, data.shape, next_slot, size

    def __len__(self) -> int:
        self.flush()
        return self._size

    @property
    def full(self) -> bool:
        """Every slot holds a row: the next one pushes the oldest out."""
        return len(self) == self._shape[0]


def percentiles(values: npt.NDArray[np.float64], points: tuple[float, ...] = (50, 90, 99)) -> list[float]:
    """The given percentiles of `values` (zeros when empty): `np.percentile`'s, bit for bit (its linear method),
    without it: it sorts its indexes with `np.unique`, whose first call imports numpy's masked arrays (15-25 ms of a
    `kvtop status`)."""
    if values.size == 0:
        return [0.0 for _ in points]
    import numpy as np

    ordered: list[float] = np.sort(values).tolist()  # a NaN sorts last
    if math.isnan(ordered[-1]):
        return [math.nan for _ in points]
    last = len(ordered) - 1
    found = []
    for point in points:
        virtual = last * (point / 100)
        below = math.floor(virtual)
        low, high = (ordered[-1], ordered[-1]) if virtual >= last else (ordered[below], ordered[below + 1])
        weight, step = virtual - below, high - low
        found.append(high - step * (1 - weight) if weight >= 0.5 else low + step * weight)  # numpy's `_lerp`
    return found
