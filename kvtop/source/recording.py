"""A recording (`kvtop record`, the dashboard's ring), positioned at `--at` (its end by default)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvtop.source.base import Events, Gap, Source, Told
from kvtop.source.errors import SourceError

if TYPE_CHECKING:
    from kvtop.record.records import Gapped
    from kvtop.record.replay import Applied, Cursor, Replay
    from kvtop.source.spec import SourceSpec


class RecordingSource(Source):
    """The model the recording held at the instant read; `now()` is that instant."""

    def __init__(
        self, spec: SourceSpec, replay: Replay, cursor: Cursor, heard: list[Applied | Gapped], start: float
    ) -> None:
        super().__init__(spec, cursor.model, start=start)
        self.replay = replay
        self.cursor = cursor
        self._heard = heard

    @classmethod
    @contextlib.contextmanager
    def opened(cls, spec: SourceSpec, tail: bool = False, journal: bool = False) -> Iterator[RecordingSource]:
        """The recording at `--at`; `tail` also keeps what its collector heard from `--since` to `--at` for
        `tail()`; `journal`: the model keeps its event journal (the dashboard's). `SourceError` when it cannot
        be read or the times lie outside it."""
        from kvtop.model.cluster import JOURNAL_EVENTS_KEPT
        from kvtop.record.format import RecordingError
        from kvtop.record.replay import Replay
        from kvtop.source.when import on_their_day
        from kvtop.views.times import stamp

        try:
            replay = Replay(spec.replay, JOURNAL_EVENTS_KEPT if journal else 0)
        except (RecordingError, OSError) as error:
            raise SourceError(f"cannot read the recording: {error}") from None
        start, end, when = replay.start, replay.end, spec.when
        at = end if when.at is None else when.at
        span = f"{stamp(start, dated=True)} to {stamp(end, dated=True)}"
        if not start <= at <= end:
            raise SourceError(
                f"--at {stamp(at, dated=True)} is outside the recording ({span}){on_their_day('--at', at, start, end)}"
            )
        if gap := replay.unrecorded(at):
            raise SourceError(
                f"--at {stamp(at, dated=True)} is where the recorder did not run (nothing recorded from "
                f"{stamp(gap[0], dated=True)} to {stamp(gap[1], dated=True)})"
            )
        if when.since is not None and when.since > at:
            raise SourceError(f"--since {stamp(when.since, dated=True)} is after the instant read (recording: {span})")
        if tail:
            cursor = replay.at(max(start, when.since or start))
            heard = cursor.advance(at)
        else:
            cursor, heard = replay.at(at), []
        source = cls(spec, replay, cursor, heard, start)
        damage = replay.recording.damage.summary()
        if cursor.inexact:
            damage = (
                damage + "; " if damage else ""
            ) + "ops were lost before this instant: the model may be incomplete"
        source.damage = damage
        yield source

    def now(self) -> float:
        return self.cursor.time

    def partly_read(self) -> str:
        """The recording's damage (records lost to bad bytes, ops lost before the instant read): what it shows may
        be incomplete, so a check says so on its line, not only on stderr."""
        return self.damage

    def nothing_to_judge(self) -> str:
        """A recording that holds no agent at the instant read (its recorder heard none, or not yet), named with
        its last failure origin before it: a ring whose latest run heard nobody (a dashboard started on a dead
        address) hides the run before it from a view read at its end."""
        from kvtop.views.times import stamp

        if self.model.ranks:
            return ""
        at = stamp(self.now(), dated=True)
        said = f"the recording holds no agent at {at}, the instant read (its recorder heard none)"
        if (mark := self.replay.previous_origin(self.now())) is not None:
            said += f"; its last failure origin before it arrived at {stamp(mark.arrived, dated=True)} (give --at)"
        return said

    def tail(self, follow: bool) -> Iterator[list[Told]]:
        from kvtop.record.records import Gapped

        yield [
            Gap(item.label, item.batches, item.now)
            if isinstance(item, Gapped)
            else Events.heard(item.label, item.events, item.snapshot)
            for item in self._heard
        ]
