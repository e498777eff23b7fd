"""The dashboard's time machine over a recording: where the replayed moment is, and the model there.

No Textual here. The UI thread queues moves (`step`, `origin`, `jump`, `play`, `live`); the frame worker
resolves them in order and builds the frame (`build`), so a seek (a keyframe restored, the ops after it
replayed: tens of ms) never runs on the UI thread. One lock (`lock`) guards the cursor: held while moving
it and while a frame or a detail panel reads its model.

An instant between two runs of the recorder (`Replay.unrecorded`) was not recorded: its frame is the model as the
first run left it, and says so (`Replayed.unrecorded`), as the one-shot views refuse that instant.

On a live session the recording is the ring the dashboard writes; it is re-read when a move needs what was
written since, and a move that reaches its end goes back to live. On a recording alone (`live=False`) the
end is as far as it goes: "live" then means the recording's end.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.format import NothingRecorded, RecordingError
from kvtop.record.replay import Cursor, Replay
from kvtop.tui.frame import Frame, FrameBuilder, Options, Replayed
from kvtop.views.times import stamp

STEP_S = 10.0
"""A step back or forward (`,` `.`)."""
BIG_STEP_S = 60.0
"""A big step (`<` `>`)."""
REREAD_S = 1.0
"""A live ring is re-read for a seek when its copy is older than this (the recorder writes every 0.25 s)."""


@dataclass(frozen=True)
class _Step:
    seconds: float


@dataclass(frozen=True)
class _Origin:
    direction: int


@dataclass(frozen=True)
class _Jump:
    time: float


@dataclass(frozen=True)
class _Play:
    pass


@dataclass(frozen=True)
class _Live:
    pass


_Move = _Step | _Origin | _Jump | _Play | _Live


class Rewind:
    """A recording the dashboard can rewind; also the dashboard's `Source` while rewound (model, lock, error)."""

    def __init__(
        self,
        path: str | Path,
        *,
        live: bool,
        clock: Callable[[], float] = time.time,
        journal_events: int = JOURNAL_EVENTS_KEPT,
        error: Callable[[], str] = lambda: "",
        cursor: Cursor | None = None,
    ) -> None:
        """`clock`: the dashboard's (a live session's "now", and what "ago" is measured from); `error`: why
        the recording stopped, if it did (the recorder's `error`); `cursor`: where a recording alone opens
        (its end by default)."""
        self.path = Path(path)
        self.live = live
        self.lock = threading.Lock()
        self.engaged = not live
        """Rewound, or about to be (a move is queued): read by the UI thread to route `p`, `L` and frames."""
        self.version = 0
        """Moves queued so far: a paused replay rebuilds its frame only when this (or the options) changed."""
        self.playing = False
        self._clock = clock
        self._journal_events = journal_events
        self._recording_error = error
        self._moves: deque[_Move] = deque()
        self._replay: Replay | None = None
        self._read_at = float("-inf")
        self._cursor: Cursor | None = None
        self._builder: FrameBuilder | None = None
        self._played_from = (0.0, 0.0)
        """(replayed time, time.monotonic()) when playing started."""
        self._note = ""
        if cursor is not None:
            self._replay, self._cursor, self._read_at = cursor.replay, cursor, time.monotonic()
        elif not live:
            self._moves.append(_Jump(float("inf")))  # the recording's end until told otherwise

    # --- the UI thread's side ---------------------------------------------------------------------

    def step(self, seconds: float) -> None:
        self._queue(_Step(seconds))

    def origin(self, direction: int) -> None:
        """The next (1) or previous (-1) failure origin."""
        self._queue(_Origin(direction))

    def jump(self, when: float) -> None:
        self._queue(_Jump(when))

    def play(self) -> None:
        """Play the recording forward at its own pace, or pause it."""
        self._queue(_Play())

    def back_to_live(self) -> None:
        """The live model again (a recording alone: its end)."""
        self._queue(_Live())

    def _queue(self, move: _Move) -> None:
        self._moves.append(move)
        self.version += 1
        self.engaged = not (isinstance(move, _Live) and self.live)

    @property
    def model(self) -> ClusterModel:
        """The replayed model (read it under `lock`); an empty one before the first frame."""
        return self._cursor.model if self._cursor is not None else ClusterModel()

    @property
    def time(self) -> float:
        return self._cursor.time if self._cursor is not None else self._clock()

    @property
    def error(self) -> str:
        return self._recording_error()

    @property
    def busy(self) -> bool:
        """A frame would differ from the last one: moves queued, or playing."""
        return self.playing or bool(self._moves)

    # --- the frame worker's side ------------------------------------------------------------------

    def build(self, options: Options) -> Frame | None:
        """Resolve the queued moves, then the frame at the replayed time (None: live, build from the source)."""
        with self.lock:
            self._resolve()
            cursor = self._cursor
            if cursor is None or self._replay is None:
                return None
            if self._builder is None or self._builder.model is not cursor.model:  # a seek, or a new run
                self._builder = FrameBuilder(cursor.model, lambda: cursor.time)
            cursor.model.update_incidents()  # what came since the recorded collector's last sweep, as views do
            replay = self._replay
            gap = replay.unrecorded(cursor.time)  # between two runs: as the first left it, not aged by the gap
            frame = self._builder.build(options, now=cursor.time if gap is None else gap[0], error=self.error)
            replayed = Replayed(cursor.time, self.playing, replay.start, replay.end, self.live, self._note,
                                cursor.inexact, gap)  # fmt: skip
            return replace(frame, replay=replayed)

    def live_note(self) -> str:
        """News of the last move that left the dashboard live ("" when none), said once."""
        with self.lock:
            note, self._note = (self._note, "") if self._cursor is None else ("", self._note)
            return note

    def _resolve(self) -> None:
        while self._moves:
            self._apply(self._moves.popleft())
        if self.playing and self._cursor is not None:
            at, since = self._played_from
            self._go(at + (time.monotonic() - since), playing=True)
        self.engaged = self._cursor is not None or bool(self._moves) or not self.live

    def _apply(self, move: _Move) -> None:
        now = self._cursor.time if self._cursor is not None else self._clock()
        self._note = ""
        if isinstance(move, _Live):
            self.playing = False
            if self.live:
                self._leave()
            else:
                self._go(float("inf"))
        elif isinstance(move, _Play):
            if self._cursor is not None:
                self.playing = not self.playing
                self._played_from = (self._cursor.time, time.monotonic())
        elif isinstance(move, _Step):
            self._go(now + move.seconds)
        elif isinstance(move, _Jump):
            self._go(move.time)
        elif self._read(fresh=move.direction > 0 or self._cursor is None):
            assert self._replay is not None
            mark = self._replay.next_origin(now) if move.direction > 0 else self._replay.previous_origin(now)
            if mark is None:
                self._note = f"no {'later' if move.direction > 0 else 'earlier'} failure origin recorded"
            else:
                self._go(mark.arrived)
                self._note = f"origin: room {mark.room} on {mark.rank} ({mark.reason_class})"

    def _go(self, when: float, playing: bool = False) -> None:
        """Put the cursor at `when`, clamped to the recording; a live session at or past its end goes live."""
        cursor = self._cursor
        if not self._read(fresh=when > (self._replay.end if self._replay else float("-inf"))):
            return
        replay = self._replay
        assert replay is not None
        if self.live and when >= replay.end and (cursor is not None or when >= self._clock()):
            self._leave()  # forward past what was recorded: the present (a move back from live stops at the end)
            self._note = self._note or "back to live: the recording's end"
            return
        target = min(max(when, replay.start), replay.end)
        if when < replay.start:
            self._note = f"the recording starts at {stamp(replay.start, dated=True)[:19]}"
        elif when > replay.end:
            self._note, self.playing = "the recording's end", False
        if cursor is not None and cursor.replay is replay and cursor.time <= target:
            cursor.advance(target)  # forward: go on from here
        else:
            self._cursor = replay.at(target)
        if not playing:
            self._played_from = (target, time.monotonic())

    def _read(self, fresh: bool) -> bool:
        """Open the recording (again, on a live session, when `fresh` and the copy is old); False if it cannot be."""
        if self._replay is not None and not (self.live and fresh and time.monotonic() - self._read_at > REREAD_S):
            return True
        old = self._replay
        try:
            self._replay = Replay(str(self.path), journal_events=self._journal_events)
        except NothingRecorded as error:
            self._note = "nothing recorded yet: try again in a second" if self.live else str(error)
            return self._replay is not None
        except RecordingError as error:
            self._note = f"cannot rewind: {error}"
            return self._replay is not None
        except OSError as error:
            self._note = f"cannot rewind: {error.strerror or error}"
            return self._replay is not None
        self._read_at = time.monotonic()
        if old is not None:
            old.recording.close()  # its open segments (a cursor still on it reopens what it reads)
        return True

    def _leave(self) -> None:
        self._cursor = None
        self._builder = None
        self.playing = False


def since(seconds: float) -> str:
    """How long ago, for people: `now`, `12s ago`, `20m 5s ago`, `3h 4m ago`, `2d 3h ago`."""
    if abs(seconds) < 1:
        return "now"
    left = int(abs(seconds))
    days, hours, minutes, secs = left // 86400, left // 3600 % 24, left // 60 % 60, left % 60
    if days:
        text = f"{days}d {hours}h"
    elif hours:
        text = f"{hours}h {minutes}m"
    elif minutes:
        text = f"{minutes}m {secs}s"
    else:
        text = f"{secs}s"
    return f"{text} ago" if seconds > 0 else f"in {text}"
