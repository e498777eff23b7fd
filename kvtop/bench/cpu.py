"""CPU seconds a benchmark leg's processes spend in its timed window: a figure a shared machine bends less.

On a loaded machine a leg's GB/s follows the share of the cores it gets; the
CPU time both of its processes spend per byte (user and system, every thread,
ZeroMQ's I/O threads and the kernel's copies included) follows the work it
does. On a machine whose cores the transfer saturates, throughput is about
cores / (CPU seconds per byte), so the ratio of CPU per byte predicts the
ratio of GB/s a quiet machine would show.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Leg:
    """One run of a leg: wall seconds and CPU seconds (both processes) to move its bytes."""

    seconds: float
    cpu_seconds: float

    def scaled(self, factor: float) -> Leg:
        return Leg(self.seconds * factor, self.cpu_seconds * factor)


class CpuMeter:
    """CPU seconds of this process and `pids` (every thread) between `start()` and `stop()`."""

    def __init__(self, *pids: int | None) -> None:
        self._processes = [psutil.Process()] + [psutil.Process(pid) for pid in pids if pid is not None]
        self._started = 0.0

    def _now(self) -> float:
        return sum(cpu_seconds(process) for process in self._processes)

    def start(self) -> None:
        self._started = self._now()

    def stop(self) -> float:
        return self._now() - self._started


def cpu_seconds(process: psutil.Process | None) -> float:
    """CPU seconds `process` used so far, user and system, every thread (0 for None)."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def thread_cpu_seconds(process: psutil.Process, thread: threading.Thread) -> float:
    """CPU seconds of one thread of `process` so far (0 once it ended)."""
    return next((t.user_time + t.system_time for t in process.threads() if t.id == thread.native_id), 0.0)
