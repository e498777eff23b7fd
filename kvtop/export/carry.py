"""Counters that start again with their source, carried across restarts so that they only grow."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Carried(Generic[K]):
    """A rank's heartbeat counters start at 0 in each incarnation; their sum across incarnations does not.

    `update(key, generation, value)` with the value the source reports now; `totals()` is every key ever
    seen, each the sum of what earlier generations reached plus the current one's value."""

    def __init__(self) -> None:
        self._before: dict[K, int] = {}
        """What the ended generations of each key reached."""
        self._last: dict[K, tuple[int, int]] = {}
        """(generation, value) each key reported last."""

    def update(self, key: K, generation: int, value: int) -> None:
        last = self._last.get(key)
        if last is not None and (last[0] != generation or value < last[1]):  # a restart: counting began again
            self._before[key] = self._before.get(key, 0) + last[1]
        self._last[key] = (generation, value)

    def totals(self) -> dict[K, int]:
        return {key: self._before.get(key, 0) + value for key, (_, value) in self._last.items()}
