"""The benchmarks' CPU meter splits a leg's CPU seconds by thread group, from the kernel's thread names."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from kvtop.bench.cpu import CpuMeter
from transport.thread_names import name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU comes from /proc")

_WORK_S = 0.12
"""Thread CPU seconds each worker spends: a dozen of the kernel's 10 ms ticks."""


def _burn() -> None:
    """Spend `_WORK_S` of this thread's CPU time."""
    until = time.thread_time() + _WORK_S
    while time.thread_time() < until:
        pass


def _engine(burnt: threading.Event, finish: threading.Event) -> None:
    """A thread named like a rank's engine: burns, says so, and lives on until told (so it is live at `stop`)."""
    name_os_thread()
    _burn()
    burnt.set()
    finish.wait(10)


def test_a_legs_cpu_is_split_by_thread_group_and_the_groups_add_up() -> None:
    burnt, finish = threading.Event(), threading.Event()
    engine = threading.Thread(target=_engine, args=(burnt, finish), name="kv-engine-test-0")
    short_lived = threading.Thread(target=_burn, name="short-lived")
    meter = CpuMeter()
    meter.start()
    engine.start()
    short_lived.start()
    short_lived.join()  # its CPU stays in the process's total only
    _burn()  # the main thread's share
    assert burnt.wait(10)
    leg = meter.stop_leg(1.0)
    finish.set()
    engine.join()
    groups = leg.cpu_by_thread
    assert groups["engine"] >= _WORK_S * 0.75, groups
    assert groups["main"] >= _WORK_S * 0.75, groups
    assert groups["exited"] >= _WORK_S * 0.75, groups
    assert sum(groups.values()) == pytest.approx(leg.cpu_seconds, abs=0.03)
    assert leg.scaled(2.0).cpu_by_thread["engine"] == 2 * groups["engine"]
