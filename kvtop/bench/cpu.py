"""CPU seconds a benchmark leg's processes spend in its timed window: a figure a shared machine bends less.

On a loaded machine a leg's GB/s follows the share of the cores it gets; the
CPU time both of its processes spend per byte (user and system, every thread,
ZeroMQ's I/O threads and the kernel's copies included) follows the work it
does. On a machine whose cores the transfer saturates, throughput is about
cores / (CPU seconds per byte), so the ratio of CPU per byte predicts the
ratio of GB/s a quiet machine would show.

Where the system tells (Linux's `/proc`), the meter also splits those seconds
by thread, grouped by the name the kernel knows each by (`THREAD_GROUPS`;
kvtop's threads name themselves: `transport.thread_names`): which thread of a
leg does the work it costs more than another.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

THREAD_GROUPS = (("kv-engine", "engine"), ("events-", "events"), ("ZMQbg/", "zeromq_io"), ("bootstrap", "bootstrap"))
"""(start of a thread's kernel name, its group); a process's first thread is `main`, any other `other`. Threads
that ended inside the timed window are `exited` (what the processes' totals hold beyond their live threads). A
thread carries the name of the thread that started it until it names itself: pyzmq's zero-copy garbage thread,
started by a prefill engine's first send, counts as `engine` (in the pyzmq legs, as `other`)."""


@dataclass(frozen=True)
class Leg:
    """One run of a leg: wall seconds and CPU seconds (both processes) to move its bytes."""

    seconds: float
    cpu_seconds: float
    cpu_by_thread: dict[str, float] = field(default_factory=dict)
    """`cpu_seconds` by thread group (`THREAD_GROUPS`); empty where the system does not tell."""

    def scaled(self, factor: float) -> Leg:
        by_thread = {group: seconds * factor for group, seconds in self.cpu_by_thread.items()}
        return Leg(self.seconds * factor, self.cpu_seconds * factor, by_thread)


class CpuMeter:
    """CPU seconds of this process and `pids` (every thread) between `start()` and `stop()`; after `stop()`,
    `by_thread` holds them by thread group."""

    def __init__(self, *pids: int | None) -> None:
        self._processes = [psutil.Process()] + [psutil.Process(pid) for pid in pids if pid is not None]
        self._started = 0.0
        self._threads: dict[tuple[int, int], ThreadTimes] = {}
        self.by_thread: dict[str, float] = {}

    def _now(self) -> float:
        return sum(cpu_seconds(process) for process in self._processes)

    def start(self) -> None:
        self.by_thread = {}
        self._threads = thread_times([process.pid for process in self._processes])
        self._started = self._now()

    def stop(self) -> float:
        spent = self._now() - self._started
        ended = thread_times([process.pid for process in self._processes])
        if not ended:
            return spent
        by_thread: dict[str, float] = {}
        for (pid, tid), times in ended.items():
            group = thread_group(times.name, pid == tid)
            begun = self._threads.get((pid, tid), ThreadTimes(times.name, 0.0, 0.0))
            seconds = times.user_s + times.system_s - begun.user_s - begun.system_s
            by_thread[group] = by_thread.get(group, 0.0) + seconds
        by_thread["exited"] = max(0.0, spent - sum(by_thread.values()))
        self.by_thread = by_thread
        return spent

    def stop_leg(self, seconds: float) -> Leg:
        """`stop()`, as the leg that took `seconds` of wall time (read before this call)."""
        return Leg(seconds, self.stop(), self.by_thread)


def thread_group(name: str, first: bool) -> str:
    """The group (`THREAD_GROUPS`) of a thread by its kernel name; `first`: the process's first thread."""
    if first:
        return "main"
    return next((group for start, group in THREAD_GROUPS if name.startswith(start)), "other")


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ThreadTimes(NamedTuple):
    """A thread's kernel name, CPU seconds in user and in system mode so far, and voluntary context switches (each a
    wake-up after it slept; -1 when not asked for)."""

    name: str
    user_s: float
    system_s: float
    switches: int = -1


def thread_times(pids: list[int], switches: bool = False) -> dict[tuple[int, int], ThreadTimes]:
    """{(pid, tid): its times} of every live thread of `pids` ({} without `/proc`); `switches`: read them too."""
    threads = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                with open(f"{base}/comm") as comm:
                    name = comm.read().strip()
                woken = -1
                if switches:
                    with open(f"{base}/status") as status:
                        woken = next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt"))
            except (OSError, StopIteration):  # the thread ended meanwhile
                continue
            user, system = int(fields[11]) / _TICKS_PER_S, int(fields[12]) / _TICKS_PER_S
            threads[(pid, int(tid))] = ThreadTimes(name, user, system, woken)
    return threads


def cpu_seconds(process: psutil.Process | None) -> float:
    """CPU seconds `process` used so far, user and system, every thread (0 for None)."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def thread_cpu_seconds(process: psutil.Process, thread: threading.Thread) -> float:
    """CPU seconds of one thread of `process` so far (0 once it ended)."""
    return next((t.user_time + t.system_time for t in process.threads() if t.id == thread.native_id), 0.0)
