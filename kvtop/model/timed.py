"""Keys by the time of their latest failure, in buckets of a fixed width: a lookup of those that may still explain a
failure at `ts` (their latest failure at most a quiet gap before it) walks the buckets from that time on, not every
key kept (thousands of one role's ranks' incidents, ended, in one `update`, walked per group: quadratic)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from math import floor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class TimedKeys(Generic[K]):
    """Keys placed by a time each (`put` again when it grows), walked from a time on (`since`)."""

    width: float
    """Seconds a bucket spans (the quiet gap: a lookup walks the bucket it starts in and those after it)."""
    buckets: dict[int, dict[K, None]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)
    """The buckets' numbers, ascending (most logs add at the end)."""
    bucket_of: dict[K, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.bucket_of)

    def put(self, key: K, ts: float) -> None:
        """Place (or move) a key at its time."""
        bucket = floor(ts / self.width)
        was = self.bucket_of.get(key)
        if was == bucket:
            return
        if was is not None:
            self._leave(key, was)
        self.bucket_of[key] = bucket
        keys = self.buckets.get(bucket)
        if keys is None:
            self.buckets[bucket] = {key: None}
            insort(self.starts, bucket)
        else:
            keys[key] = None

    def discard(self, key: K) -> None:
        was = self.bucket_of.pop(key, None)
        if was is not None:
            self._leave(key, was)

    def since(self, ts: float) -> Iterator[K]:
        """Every key placed at `ts` or later (and some placed less than a bucket before it), the earliest buckets
        first."""
        first = bisect_left(self.starts, floor(ts / self.width))
        return chain.from_iterable(self.buckets[bucket] for bucket in self.starts[first:])

    def _leave(self, key: K, bucket: int) -> None:
        keys = self.buckets[bucket]
        del keys[key]
        if not keys:
            del self.buckets[bucket]
            del self.starts[bisect_left(self.starts, bucket)]
