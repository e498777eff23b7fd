"""The followed event tail's order: what arrives waits a moment, so what other agents published at the same
instant joins it before its level is decided and its line printed.

Each agent publishes its own batches (every 50 ms, a small one within two intervals): an echo's batch can
arrive before its origin's, from another rank, although the origin came first. Printed on arrival, the echo
would lead a group whose origin is not in yet (its own line, at its rank's level) and stand before its origin.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from transport.plane.events import Event

HOLD_S = 0.5
"""How long a followed tail holds an event after it arrived (10 batch intervals: an echo's origin is in)."""

Item = tuple[str, Event]
"""An event and the label of its agent."""


class Settling:
    """Events held from their arrival until `HOLD_S` passed, then let go in time order with every held event
    no later than them (an origin that arrived after its echo goes out with it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: list[tuple[float, Item]] = []
        """(arrival, item), in arrival order."""

    def add(self, items: Sequence[Item]) -> None:
        arrived = self._clock()
        self._held += [(arrived, item) for item in items]

    def settled(self) -> list[Item]:
        """What has settled, in time order (what is still held stays)."""
        ripe = self._clock() - HOLD_S
        settled = [item for arrived, item in self._held if arrived <= ripe]
        if not settled:
            return []
        latest = max(event.ts for _, event in settled)
        going: list[Item] = []
        staying: list[tuple[float, Item]] = []
        for arrived, item in self._held:
            if arrived <= ripe or item[1].ts <= latest:
                going.append(item)
            else:
                staying.append((arrived, item))
        self._held = staying
        return sorted(going, key=lambda item: item[1].ts)

    def all(self) -> list[Item]:
        """Everything held, in time order (a lost batch, or the end: nothing more to wait for)."""
        items, self._held = [item for _, item in self._held], []
        return sorted(items, key=lambda item: item[1].ts)
