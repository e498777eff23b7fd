"""The dashboard's process: the interpreter settings it runs under while mounted, and what a lost terminal does."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time

SWITCH_INTERVAL_S = 0.001
"""Threads of one process (a collector, the frame worker) hand the GIL over every 1 ms instead of 5, so that
keys and paints wait less behind them."""
FULL_COLLECTION_EVERY_S = 60.0


class DashboardTuning:
    """The dashboard's interpreter settings while it is mounted: `apply()` sets them, `restore()` puts back what
    was there (they are the process's, and tests run many apps in one).

    The interpreter's own collections are off, and `collect()` runs them between frames instead (the app
    calls it every refresh, before it asks for the next frame). A paint allocates tens of thousands of tracked
    objects (strips, segments), so one or two young collections fell due inside every paint, and a middle
    one (10-50 ms) every twentieth: those set the frame p99. Here the young generations are collected every
    refresh and everything once a minute; what was alive when the dashboard mounted is frozen out of them.
    """

    def __init__(self) -> None:
        self._saved: tuple[float, bool] | None = None
        self._next_full = 0.0

    def apply(self) -> None:
        if self._saved is None:
            self._saved = (sys.getswitchinterval(), gc.isenabled())
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        gc.disable()
        gc.freeze()
        self._next_full = time.monotonic() + FULL_COLLECTION_EVERY_S

    def collect(self) -> None:
        """A collection of the young generations, or of everything when a minute has passed since the last."""
        if self._saved is None:
            return
        if time.monotonic() < self._next_full:
            gc.collect(1)
            return
        gc.collect()
        self._next_full = time.monotonic() + FULL_COLLECTION_EVERY_S

    def restore(self) -> None:
        if self._saved is not None:
            interval, enabled = self._saved
            sys.setswitchinterval(interval)
            gc.unfreeze()
            if enabled:
                gc.enable()
            self._saved = None


HANG_UP_EXIT_S = 10.0
"""After SIGHUP the dashboard quits as `q` does; a process still here this much later ends at once (the agents
an embedded cluster started exit when their parent does)."""


def terminal_lost() -> None:
    """The terminal is gone (SIGHUP): point stdout and stderr at /dev/null, and arm a watchdog.

    Textual writes through a thread with a bounded queue: one write to the dead terminal (EIO) ends that
    thread, and the exit's own writes then wait on the full queue forever, leaving the dashboard and its
    agents running. Writes to /dev/null cannot fail; the watchdog bounds whatever else may hang.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(devnull, stream.fileno())  # type: ignore[union-attr]
    os.close(devnull)
    threading.Thread(target=_end_if_still_running, name="kvtop-hang-up", daemon=True).start()


def _end_if_still_running() -> None:
    time.sleep(HANG_UP_EXIT_S)
    os._exit(128 + signal.SIGHUP)
