"""Counters an agent keeps, safe to snapshot from another thread."""

from __future__ import annotations

import threading

REJECTION_REASONS = ("malformed", "unknown_version", "oversize", "truncated", "unexpected")


class Counters:
    """Named integer counters; the key set is fixed up front so snapshots never race a resize."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._values = dict.fromkeys(names, 0)
        self._lock = threading.Lock()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def add_with_bytes(self, name: str, bytes_name: str, nbytes: int) -> None:
        """Count one item under `name` and its `nbytes` under `bytes_name`, both in one update."""
        with self._lock:
            self._values[name] += 1
            self._values[bytes_name] += nbytes

    def reject(self, reason: str) -> None:
        """Count one rejected frame under `rejected_<reason>`."""
        self.add(f"rejected_{reason}")

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def rejection_names() -> tuple[str, ...]:
    """The counter names of every rejection reason."""
    return tuple(f"rejected_{reason}" for reason in REJECTION_REASONS)
