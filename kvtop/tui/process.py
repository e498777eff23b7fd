"""The interpreter settings the dashboard's process runs under, set while the app is mounted and restored after."""

from __future__ import annotations

import gc
import sys

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
