"""Where the dashboard's frames come from: a model in this process, or the model process (`model_client`).

The app asks one question per refresh, `build(options, pages)`, from its frame worker thread, and while a detail
panel is open another, `panel(request)` (from the UI thread as the enter key opens it, then from the worker at each
frame). The answers are plain data (a `Frame`, a `PanelBody`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from kvtop.model.cluster import ClusterModel
from kvtop.tui.frame import Frame, FrameBuilder, Options
from kvtop.tui.pages import PageRequest
from kvtop.tui.panels import PanelBody, PanelFollower, PanelRequest


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

    def panel(self, request: PanelRequest) -> PanelBody | None:
        """A room's timeline (kind "room", key its id) or a rank's history ("rank", its label) as of now; None
        when the version the request shows is still the current one (`PanelFollower`)."""
        ...


class LocalFrames:
    """Frames built here, from a source's model under its lock (logs, recordings, tests): whole lists."""

    def __init__(self, source: Source, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.clock = clock
        self._builder = FrameBuilder(source.model, clock)
        self._panels = PanelFollower()

    def build(self, options: Options, pages: Mapping[str, PageRequest]) -> Frame:
        with self.source.lock:
            return self._builder.build(options, error=self.source.error)

    def panel(self, request: PanelRequest) -> PanelBody | None:
        with self.source.lock:
            return self._panels.follow(self.source.model, request, self.clock())
