"""The model process: owns the source (a collector and its subscriber, the recorder, the exporter) and the
model, and answers the dashboard's questions over a pipe (no Textual here).

Ingest (decode and apply at 50k events/s, the sweep, keyframes) and the frame builder share this process's
interpreter lock, so that a key in the dashboard's process waits behind none of them. That process only
paints: each refresh asks for a frame (`FrameQuery`: the options and the window of each long list the views show) and
gets plain data back (`FrameReply`: a `Frame` whose rooms and events are `Page`s).

The process ignores SIGINT, SIGHUP and SIGTERM (the terminal's signals reach its whole process group): it
ends when the dashboard says `Closing`, or when the pipe closes because the dashboard is gone. After `Ready`
it writes nothing to the terminal: its stdout and stderr go to a log file the dashboard shows on exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Protocol

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.tui.frame import Frame, FrameBuilder, Options
from kvtop.tui.pages import MARGIN_ROWS, Page, PageRequest, Shipped, Shipper
from kvtop.tui.panels import PanelBody, PanelFollower, PanelRequest
from kvtop.tui.process import SWITCH_INTERVAL_S

log = logging.getLogger("kvtop.model_process")

DEFAULT_PAGE = PageRequest(0, 2 * MARGIN_ROWS)
PROTOCOL = pickle.HIGHEST_PROTOCOL


class ModelStartError(Exception):
    """The source could not be opened: `message` for the user ("" when it was said already), `code` to exit."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass
class ServedModel:
    """What a spec opened, as the model process serves it."""

    model: ClusterModel
    lock: threading.Lock
    error: Callable[[], str] = lambda: ""
    """The source's last error (a bootstrap that does not answer, a collector that died)."""
    clock: Callable[[], float] = time.time
    recorder_error: Callable[[], str] = lambda: ""
    warnings: tuple[str, ...] = ()
    record_folder: str = ""
    """The ring the recorder writes ("" when it does not record): the dashboard rewinds into it."""
    stats: Callable[[], dict[str, object]] = dict
    """Figures for the caller, read after the source closed (a benchmark's feeder rate, say)."""
    heard: Callable[[], bool] = lambda: True
    """Whether some agent answered (a collector's `heard()`), for other commands reading this model."""
    synced: Callable[[], bool] = lambda: True
    """Whether every agent's snapshot is in (a collector's `synced()`)."""
    source: str = ""
    """What the model is of, in words (`bootstrap tcp://...`), in the advert other commands find it by."""
    bootstrap: str = ""
    connect: tuple[str, ...] = ()


class ModelSpec(Protocol):
    """A picklable description of a source; `open` runs in the model process."""

    def open(self, stack: contextlib.ExitStack) -> ServedModel:
        """Open the source, its closing pushed on `stack`; raise `ModelStartError` when it cannot be."""
        ...


@dataclass(frozen=True)
class FrameQuery:
    options: Options
    pages: dict[str, PageRequest] = field(default_factory=dict)


@dataclass(frozen=True)
class DetailQuery:
    request: PanelRequest


@dataclass(frozen=True)
class Closing:
    pass


@dataclass(frozen=True)
class Ready:
    warnings: tuple[str, ...]
    record_folder: str


@dataclass(frozen=True)
class Failed:
    message: str
    code: int = 1


@dataclass(frozen=True)
class FrameReply:
    frame: Frame
    """Its `groups` empty: they come in `groups`."""
    groups: Shipped[FailureGroup]
    recorder_error: str


@dataclass(frozen=True)
class DetailReply:
    body: PanelBody | None


@dataclass(frozen=True)
class Closed:
    stats: dict[str, object]


Query = FrameQuery | DetailQuery | Closing


def serve(spec: ModelSpec, conn: Connection, log_path: str) -> None:
    """The model process's main: open `spec`, say `Ready` (or `Failed`), answer queries until told to close."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    from kvtop.sources.live import tune_gc  # (zmq is for the model process, not the dashboard's)

    tune_gc()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    served: ServedModel | None = None
    with contextlib.ExitStack() as stack:
        try:
            served = spec.open(stack)
        except ModelStartError as error:
            conn.send(Failed(error.message, error.code))
            return
        except Exception as error:
            traceback.print_exc()
            conn.send(Failed(f"the model process could not start: {error!r}"))
            return
        conn.send(Ready((*served.warnings, *_serve_endpoint(served, stack)), served.record_folder))
        _to_log(log_path)
        _answer(served, conn)
    conn.send(Closed(served.stats()))


def _serve_endpoint(served: ServedModel, stack: contextlib.ExitStack) -> tuple[str, ...]:
    """Serve the model to other commands (`kvtop status --model`), closed before the source is; a warning
    when it cannot be (the dashboard runs without it)."""
    import zmq

    from kvtop.attach.runtime import RuntimeDirError
    from kvtop.attach.server import ModelEndpoint

    try:
        endpoint = ModelEndpoint(served).start()
    except (RuntimeDirError, OSError, zmq.ZMQError) as error:
        return (f"other commands cannot read this dashboard's model (--model): {error}",)
    stack.callback(endpoint.close)
    return ()


def _to_log(path: str) -> None:
    """From here on the dashboard owns the terminal: what this process prints goes to `path`."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)


def _answer(served: ServedModel, conn: Connection) -> None:
    builder = FrameBuilder(served.model, served.clock, count_in_build=False)
    groups: Shipper[FailureGroup] = Shipper()
    panels = PanelFollower()
    while True:
        try:
            query: Query = conn.recv()
        except (EOFError, OSError):
            return  # the dashboard is gone
        if isinstance(query, Closing):
            return
        try:
            reply = _reply(served, builder, groups, panels, query)
        except Exception as error:
            log.exception("the model process could not answer %s", type(query).__name__)
            reply = pickle.dumps(Failed(f"the model process could not answer: {error!r}"), PROTOCOL)
        try:
            conn.send_bytes(reply)
        except OSError:
            return  # the dashboard is gone
        if isinstance(query, FrameQuery):
            _count_when_due(served, builder)


def _count_when_due(served: ServedModel, builder: FrameBuilder) -> None:
    """The open and stuck rooms, counted while the dashboard paints (out of every frame's way)."""
    try:
        if builder.counts_due(now := served.clock()):
            with served.lock:
                builder.count_rooms(now)
    except Exception:
        log.exception("the model process could not count the open rooms (the next frames show the last count)")


def _reply(
    served: ServedModel,
    builder: FrameBuilder,
    groups: Shipper[FailureGroup],
    panels: PanelFollower,
    query: FrameQuery | DetailQuery,
) -> bytes:
    """The answer, pickled under the model's lock: a frame's rooms are the model's own views, which the
    collector changes in place."""
    with served.lock:
        if isinstance(query, DetailQuery):
            body = panels.follow(served.model, query.request, served.clock())
            return pickle.dumps(DetailReply(body), PROTOCOL)
        frame = builder.build(query.options, error=served.error())
        shipped = groups.pack(frame.groups)
        window = replace(paged(frame, query.pages), groups=[])
        return pickle.dumps(FrameReply(window, shipped, served.recorder_error()), PROTOCOL)


def paged(frame: Frame, pages: Mapping[str, PageRequest]) -> Frame:
    """`frame` with its long lists cut to the windows asked for (the rooms' first rows, the events' tail by
    default): what a frame from the model process carries of them."""
    rooms = Page.of(frame.rooms, pages.get("rooms", DEFAULT_PAGE))
    events = Page.of(frame.events, pages.get("events", PageRequest.tail(DEFAULT_PAGE.count)))
    return replace(frame, rooms=rooms, events=events)
