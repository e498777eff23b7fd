"""Where the dashboard's frames come from: a model in this process, or the model process (`model_client`).

The app asks one question per refresh, `build(options, pages)`, from its frame worker thread, and one per
enter key, `detail(...)`, from the UI thread. Both answers are plain data (a `Frame`, a Rich `Text`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from rich.text import Text

from kvtop.model.cluster import ClusterModel
from kvtop.tui.details import rank_history, room_timeline
from kvtop.tui.frame import Frame, FrameBuilder, Options
from kvtop.tui.pages import PageRequest
from kvtop.tui.rows import Palette


class Source(Protocol):
    """A model in this process, the lock its writer holds, and the writer's last error."""

    @property
    def model(self) -> ClusterModel: ...

    @property
    def lock(self) -> threading.Lock: ...

    @property
    def error(self) -> str: ...


class FrameSource(Protocol):
    def build(self, options: Options, pages: Mapping[str, PageRequest]) -> Frame:
        """The frame as of now; `pages`: the window of each long list ("rooms", "events") the views show (a
        source in this process may return the whole lists)."""
        ...

    def detail(self, kind: str, key: int | str, palette: Palette) -> Text | None:
        """A room's timeline (`kind` "room", `key` its id) or a rank's history ("rank", its label)."""
        ...


def rendered_detail(model: ClusterModel, kind: str, key: int | str, now: float, palette: Palette) -> Text | None:
    """The detail panel `kind` of `key` (read the model under its lock); None for a kind there is none of."""
    if kind == "room" and isinstance(key, int):
        return room_timeline(model, key, now, palette)
    if kind == "rank" and isinstance(key, str):
        return rank_history(model, key, now, palette)
    return None


class LocalFrames:
    """Frames built here, from a source's model under its lock (logs, recordings, tests): whole lists."""

    def __init__(self, source: Source, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.clock = clock
        self._builder = FrameBuilder(source.model, clock)

    def build(self, options: Options, pages: Mapping[str, PageRequest]) -> Frame:
        with self.source.lock:
            return self._builder.build(options, error=self.source.error)

    def detail(self, kind: str, key: int | str, palette: Palette) -> Text | None:
        with self.source.lock:
            return rendered_detail(self.source.model, kind, key, self.clock(), palette)
