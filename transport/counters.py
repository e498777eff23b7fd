"""Counters an agent keeps, safe to snapshot from another thread."""

from __future__ import annotations

import copy
import threading

REJECTION_REASONS = ("malformed", "unknown_version", "oversize", "truncated", "unexpected", "invalid")
"""`invalid`: a frame that decodes but whose values cannot be used (a registration with a bad endpoint)."""


class Counters:
    """Named integer counters; the key set is fixed up front so snapshots never race a resize.

    `for_socket(name)` hands one socket's loop a view of the same counters whose rejections are
    also counted per socket (`rejections()`), so the heartbeat can say which socket refused what.
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self._values = dict.fromkeys(names, 0)
        self._by_socket: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._socket = ""

    def for_socket(self, socket: str) -> Counters:
        """These counters as one socket's loop counts: its rejections also land under `socket`."""
        view = copy.copy(self)  # shares the values, the per-socket table and the lock
        view._socket = socket
        with self._lock:
            self._by_socket.setdefault(socket, dict.fromkeys(REJECTION_REASONS, 0))
        return view

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def add_with_bytes(self, name: str, bytes_name: str, nbytes: int, count: int = 1) -> None:
        """Count `count` items under `name` and their `nbytes` under `bytes_name`, both in one update."""
        with self._lock:
            self._values[name] += count
            self._values[bytes_name] += nbytes

    def reject(self, reason: str) -> None:
        """Count one rejected frame under `rejected_<reason>` (and under this view's socket)."""
        with self._lock:
            self._values[f"rejected_{reason}"] += 1
            if self._socket:
                self._by_socket[self._socket][reason] += 1

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def rejected(self) -> dict[str, int]:
        """Rejected frames by reason, over every socket these counters serve."""
        with self._lock:
            return {reason: self._values.get(f"rejected_{reason}", 0) for reason in REJECTION_REASONS}

    def rejections(self) -> dict[str, dict[str, int]]:
        """Rejected frames by socket, then reason, for the sockets given a `for_socket` view."""
        with self._lock:
            return {socket: dict(reasons) for socket, reasons in self._by_socket.items()}


def rejection_names() -> tuple[str, ...]:
    """The counter names of every rejection reason."""
    return tuple(f"rejected_{reason}" for reason in REJECTION_REASONS)
