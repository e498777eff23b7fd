"""The dashboard's process: the interpreter settings it runs under while mounted, and what a lost terminal does."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time

GC_THRESHOLDS = (20_000, 20, 20)
"""The dashboard's process keeps a big long-lived heap (the model, Textual's caches) and allocates fast while
building frames: at CPython's default (700, 10, 10) a full collection (~100 ms at 100k rooms) ran several times
a minute and set the frame p99 (`kvtop bench ui`: 148 ms); with these, young objects die before promotion and
full collections are rare (p99 ~40 ms)."""
SWITCH_INTERVAL_S = 0.001
"""The collector and the frame worker are threads of this process: hand the GIL over every 1 ms instead of
5 so that keys and paints wait less behind them."""


class DashboardTuning:
    """`apply()` sets the GC thresholds and the GIL switch interval; `restore()` puts back what was there
    (both are the process's, and tests run many apps in one)."""

    def __init__(self) -> None:
        self._saved: tuple[tuple[int, ...], float] | None = None

    def apply(self) -> None:
        if self._saved is None:
            self._saved = (gc.get_threshold(), sys.getswitchinterval())
        gc.set_threshold(*GC_THRESHOLDS)
        sys.setswitchinterval(SWITCH_INTERVAL_S)

    def restore(self) -> None:
        if self._saved is not None:
            thresholds, interval = self._saved
            gc.set_threshold(*thresholds)
            sys.setswitchinterval(interval)
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
