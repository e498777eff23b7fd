"""An open detail panel followed live: the room's timeline or the rank's history as of each frame.

The app asks at every frame (`PanelRequest`, with the version it shows); the follower reads only the journal's
batches that came since it last looked, keeps its subject's events, and answers a new `PanelBody` only when the
panel's text changed: a quiet room costs a glance at the new batches, and no repaint.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text

from kvtop.model.cluster import ClusterModel
from kvtop.tui.details import of_rank, of_room, rank_history, room_timeline
from kvtop.tui.rows import Palette
from transport.plane.events import Event


@dataclass(frozen=True)
class PanelRequest:
    """The panel `kind` ("room" or "rank") of `key` (a room id, a rank's label); `shown`: the version of it on
    screen (0: none yet)."""

    kind: str
    key: int | str
    palette: Palette
    shown: int = 0

    @property
    def subject(self) -> tuple[str, int | str]:
        return self.kind, self.key


@dataclass(frozen=True)
class PanelBody:
    """The panel's text as of now, and its version (it changes whenever the text does)."""

    kind: str
    key: int | str
    version: int
    text: Text

    @property
    def subject(self) -> tuple[str, int | str]:
        return self.kind, self.key


class PanelFollower:
    """One panel's subject, followed from question to question (one follower per model source; not thread-safe:
    ask under the model's lock)."""

    def __init__(self) -> None:
        self._versions = itertools.count(1)
        self._followed: tuple[str, int | str, Palette] | None = None
        """The subject and palette the kept events and text are of."""
        self._model: weakref.ref[ClusterModel] | None = None
        """The model they are of (a seek's new model is another one, even where the old one's memory is reused)."""
        self._read = 0
        """The model's `journal_total` up to which its batches were read."""
        self._events: deque[tuple[int, str, Event]] = deque()
        """The subject's events: (number of the batch that brought it, agent label, event), oldest first."""
        self._body: PanelBody | None = None

    def follow(self, model: ClusterModel, request: PanelRequest, now: float) -> PanelBody | None:
        """The panel as of `now`; None when the version `request` shows is the current text, or when there is no
        panel of that kind."""
        wanted = self._wanted(request)
        if wanted is None:
            return None
        followed = (request.kind, request.key, request.palette)
        same_model = self._model is not None and self._model() is model and model.journal_total >= self._read
        if followed != self._followed or not same_model:
            self._followed, self._model, self._read, self._body = followed, weakref.ref(model), 0, None
            self._events.clear()
        self._read_new(model, wanted)
        journal = ((label, event) for _, label, event in self._events)
        if isinstance(request.key, int):
            text = room_timeline(model, request.key, now, request.palette, journal)
        else:
            text = rank_history(model, request.key, now, request.palette, journal)
        if self._body is None or self._body.text != text:
            self._body = PanelBody(request.kind, request.key, next(self._versions), text)
        return None if self._body.version == request.shown else self._body

    def _read_new(self, model: ClusterModel, wanted: Callable[[str, Event], bool]) -> None:
        """Keep the subject's events from the batches journaled since the last read; drop those whose batch the
        journal let go."""
        total, journal = model.journal_total, model.journal
        first = total - len(journal)  # the number of the oldest batch still journaled
        new = total - max(self._read, first)
        fresh = list(itertools.islice(reversed(journal), new))
        for number, (label, batch) in enumerate(reversed(fresh), start=total - len(fresh)):
            self._events.extend((number, label, event) for event in batch if wanted(label, event))
        while self._events and self._events[0][0] < first:
            self._events.popleft()
        self._read = total

    @staticmethod
    def _wanted(request: PanelRequest) -> Callable[[str, Event], bool] | None:
        key = request.key
        if request.kind == "room" and isinstance(key, int):
            return lambda label, event: of_room(key, label, event)
        if request.kind == "rank" and isinstance(key, str):
            return lambda label, event: of_rank(key, label, event)
        return None
