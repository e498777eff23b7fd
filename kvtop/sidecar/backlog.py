"""What a sidecar read of the lines its log held when it started, said once when it reached their end."""

from __future__ import annotations

import time

from kvtop.views.incidents import ago, plural
from kvtop.views.times import stamp
from kvtop.views.units import size
from transport.plane.events import Event, Failure


class Backlog:
    """The lines the file held at start: published with their own times like any other (a view of a live window
    names them older than it), counted here so the sidecar says what it did with them and how old they are."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failures = 0
        self.last_ts: float | None = None
        """The latest time its events carry (its failures', batch and context lines')."""

    def add(self, events: list[Event]) -> None:
        self.failures += sum(isinstance(event, Failure) for event in events)
        latest = max((event.ts for event in events), default=None)
        if latest is not None and (self.last_ts is None or latest > self.last_ts):
            self.last_ts = latest

    def said(self, read: int) -> str:
        """`read the 48.2 KB FILE held at start (2 failures), the latest dated 2026-03-04 10:02:12, 276 days ago:
        published with their own times (a view's window counts them older than it); following what it gains`
        (`read` bytes: a record's lines are counted once it is whole, the bytes as they are read)."""
        dated = "" if self.last_ts is None else (
            f", the latest dated {stamp(self.last_ts, dated=True)[:-4]}, {ago(time.time() - self.last_ts)} ago"
        )  # fmt: skip
        return (
            f"read the {size(read)} {self.path} held at start ({plural(self.failures, 'failure')}){dated}: "
            "published with their own times (a view's window counts them older than it); following what it gains"
        )
