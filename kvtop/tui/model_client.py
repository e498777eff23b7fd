"""The dashboard's side of the model process (`model_server`): start it, ask it for frames, close it.

`ModelProcess(spec)` is a `FrameSource`: the app's frame worker calls `build` (and `panel` while a detail panel
is open), the UI thread `panel` as one opens; one question is in flight at a time. A model process that ends or
fails raises `ModelProcessError`, which ends the dashboard loudly (exit 1, naming it): a frozen screen would look
like health.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

from kvtop.model.fold import FailureGroup
from kvtop.tui.frame import Frame, Options
from kvtop.tui.model_server import (
    Closed,
    Closing,
    DetailQuery,
    DetailReply,
    Failed,
    FrameQuery,
    FrameReply,
    ModelSpec,
    ModelStartError,
    Ready,
    serve,
)
from kvtop.tui.pages import PageRequest, Receiver
from kvtop.tui.panels import PanelBody, PanelRequest

START_TIMEOUT_S = 120.0
"""Opening may fill a big model (a benchmark's) or wait for a bootstrap; past this the start fails."""
ANSWER_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 30.0
"""The recorder writes what is pending and fsyncs on the way out."""
LOG_SHOWN_CHARS = 4000
REAP_S = 5.0


class ModelProcessError(RuntimeError):
    """The model process ended, failed to answer, or did not answer in time."""


class ModelProcess:
    """Use as `with ModelProcess(spec) as model:`; `start()` raises `ModelStartError` when the source cannot
    be opened (its message, if any, and the exit code the command should end with)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.warnings: tuple[str, ...] = ()
        self.record_folder = ""
        self.recorder_error = ""
        """The recorder's last error, as of the last frame."""
        self.stats: dict[str, object] = {}
        """What the source reported when it closed."""
        self._context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or locks forked
        self._conn: Any = None
        self._process: Any = None
        self._ask_lock = threading.Lock()
        self._groups: Receiver[FailureGroup] = Receiver()
        self.log_path = ""
        """Where the process's output goes once the dashboard owns the terminal (made by `start()`)."""

    @property
    def pid(self) -> int | None:
        """The model process's pid (None before `start()` and after `close()`)."""
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> ModelProcess:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ModelProcess:
        handle, self.log_path = tempfile.mkstemp(prefix="kvtop-model-", suffix=".log")
        os.close(handle)
        self._conn, theirs = self._context.Pipe()
        self._process = self._context.Process(
            target=serve, args=(self.spec, theirs, self.log_path), name="kvtop-model", daemon=True
        )
        self._process.start()
        theirs.close()
        reply = self._receive(timeout_s, "start")
        if isinstance(reply, Failed):
            self.close()
            raise ModelStartError(reply.message, reply.code)
        if not isinstance(reply, Ready):
            self.close()
            raise ModelStartError(f"the model process answered {type(reply).__name__} to its start", 1)
        self.warnings, self.record_folder = reply.warnings, reply.record_folder
        return self

    def build(self, options: Options, pages: Mapping[str, PageRequest]) -> Frame:
        reply = self._ask(FrameQuery(options, dict(pages)))
        if not isinstance(reply, FrameReply):
            raise ModelProcessError(f"the model process answered {type(reply).__name__} to a frame")
        self.recorder_error = reply.recorder_error
        try:
            groups = self._groups.unpack(reply.groups)
        except KeyError:
            raise ModelProcessError("the model process sent a failure group this side never had") from None
        return replace(reply.frame, groups=groups)

    def panel(self, request: PanelRequest) -> PanelBody | None:
        reply = self._ask(DetailQuery(request))
        if not isinstance(reply, DetailReply):
            raise ModelProcessError(f"the model process answered {type(reply).__name__} to a detail")
        return reply.body

    def close(self) -> None:
        """Ask the process to close its source (the recorder writes what is pending), wait for it, and show
        what it logged; idempotent."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None:
            return
        try:
            if process.is_alive():
                with self._ask_lock:
                    conn.send(Closing())
                    reply = self._receive(CLOSE_TIMEOUT_S, "close", conn, process)
                if isinstance(reply, Closed):
                    self.stats = reply.stats
        except (ModelProcessError, OSError):
            pass  # said below: the exit code and the log
        finally:
            conn.close()
            process.join(5.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)
            self._show_log(process.exitcode)

    def _ask(self, query: FrameQuery | DetailQuery) -> object:
        with self._ask_lock:
            if self._conn is None:
                raise ModelProcessError("the model process is closed")
            try:
                self._conn.send(query)
            except OSError:
                raise ModelProcessError(f"the model process ended ({self._ended()})") from None
            reply = self._receive(ANSWER_TIMEOUT_S, type(query).__name__)
        if isinstance(reply, Failed):
            raise ModelProcessError(reply.message)
        return reply

    def _receive(self, timeout_s: float, what: str, conn: Any = None, process: Any = None) -> object:
        """The next reply, waiting while the process lives (a dead one raises at once, not at the timeout)."""
        conn, process = conn or self._conn, process or self._process
        deadline = time.monotonic() + timeout_s
        while not conn.poll(0.1):
            if not process.is_alive() and not conn.poll(0):
                raise ModelProcessError(f"the model process ended ({self._ended(process)}) before its {what} reply")
            if time.monotonic() > deadline:
                raise ModelProcessError(f"the model process gave no {what} reply within {timeout_s:g} s")
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise ModelProcessError(f"the model process ended ({self._ended(process)})") from None

    def _ended(self, process: Any = None) -> str:
        """How the process ended, once it did (a pipe closes a moment before its exit code can be read)."""
        process = process or self._process
        if process is not None:
            process.join(REAP_S)
        code = None if process is None else process.exitcode
        return "still running" if code is None else f"exit code {code}"

    def _show_log(self, exitcode: int | None) -> None:
        """What the process logged goes to stderr once the terminal is the shell's again (then the file goes)."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                logged = handle.read()
        except OSError:
            return
        if logged.strip():
            sys.stderr.write(f"kvtop: the model process (exit code {exitcode}) logged to {self.log_path}:\n")
            sys.stderr.write(logged[-LOG_SHOWN_CHARS:])
        else:
            os.unlink(self.log_path)
