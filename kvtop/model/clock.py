"""Each agent's clock against the collector's: estimated from its envelopes, corrected where it is off.

An agent stamps each batch and snapshot with the time it sent it (`sent_at`); the collector notes when it took
it in. Their difference is the agent's clock offset less the delay on the way, and the delay is never negative:
the largest difference of the last `SAMPLES` envelopes is the offset less the shortest delay among them (NTP's
minimum filter). A collector that falls behind makes every difference smaller, never larger; it reads as the
agents' clocks being behind only while it stays more than `SKEWED_S` behind for all of those envelopes.

Past `SKEWED_S` an agent's times are corrected (its events' `ts` less the offset) before anything reads them:
the fold, the windows, the incidents, the views. A smaller offset is left alone: NTP keeps clocks within
milliseconds, and an agent's events are seconds apart from its peers' only when its clock is wrong.
"""

from __future__ import annotations

from collections import deque

import msgspec

from transport.plane.events import Event, Snapshot

SKEWED_S = 2.0
"""An agent whose clock is this far off the collector's has its times corrected, and views warn of it."""
SAMPLES = 32
"""Envelopes the estimate takes its largest difference over: a few seconds of an agent's batches, 30 s of a
quiet agent's heartbeats."""


class ClockEstimate:
    """One agent's clock offset (positive: ahead of the collector's), from its latest envelopes."""

    __slots__ = ("_differences",)

    def __init__(self, differences: list[float] | None = None) -> None:
        self._differences: deque[float] = deque(differences or (), maxlen=SAMPLES)

    def sample(self, sent_at: float, arrived: float) -> None:
        """An envelope the agent stamped `sent_at` (its clock) arrived at `arrived` (the collector's)."""
        self._differences.append(sent_at - arrived)

    @property
    def offset_s(self) -> float:
        """The agent's clock less the collector's, in seconds (0 before any envelope)."""
        return max(self._differences, default=0.0)

    @property
    def correction_s(self) -> float:
        """What to take off the agent's times: its offset when it is `SKEWED_S` or more, else 0."""
        offset = self.offset_s
        return offset if abs(offset) >= SKEWED_S else 0.0

    def differences(self) -> list[float]:
        """The samples the estimate holds (a keyframe keeps them)."""
        return list(self._differences)


def corrected(events: list[Event], correction_s: float) -> list[Event]:
    """`events` on the collector's clock: each `ts` less `correction_s`."""
    return [msgspec.structs.replace(event, ts=event.ts - correction_s) for event in events]


def corrected_snapshot(snapshot: Snapshot, correction_s: float) -> Snapshot:
    """`snapshot` with every record and its history's start on the collector's clock."""
    since = snapshot.history_since and snapshot.history_since - correction_s  # 0: nothing dropped, stays 0
    records = {
        name: corrected(getattr(snapshot, name), correction_s)
        for name in ("live_rooms", "finished_rooms", "failures", "progress", "transfers", "context")
    }
    hello, heartbeat = (
        record and msgspec.structs.replace(record, ts=record.ts - correction_s)
        for record in (snapshot.hello, snapshot.heartbeat)
    )
    return msgspec.structs.replace(snapshot, hello=hello, heartbeat=heartbeat, history_since=since, **records)
