"""A terminal's Ctrl-C in `kvtop bench`: SIGINT to the whole process group, the bench's children included. One line,
no traceback from any process, exit 130, no process left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest

pytestmark = pytest.mark.processes

KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"


def _start(*args: str) -> subprocess.Popen[str]:
    """`kvtop ARGS` in a process group of its own, as a shell starts a job in a terminal."""
    return subprocess.Popen([KVTOP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _wait_for(what: str, found: Callable[[], psutil.Process | None], timeout_s: float = 60.0) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with_it = found()
        if with_it is not None:
            return with_it
        time.sleep(0.01)
    raise AssertionError(f"no {what} within {timeout_s} s")


def _spawned(bench: psutil.Process, working: bool) -> psutil.Process | None:
    """A child the bench spawned (multiprocessing's `spawn_main`); `working`: one already running its target (its
    ZeroMQ threads started), else one still starting."""
    for child in bench.children():
        try:
            if "spawn_main" in " ".join(child.cmdline()) and (not working or child.num_threads() > 1):
                return child
        except psutil.Error:
            continue
    return None


def _interrupted(bench: subprocess.Popen[str]) -> tuple[str, list[psutil.Process]]:
    """Ctrl-C the bench's process group; its stderr once it exited (within a deadline), and its descendants at the
    moment of the Ctrl-C."""
    descendants = psutil.Process(bench.pid).children(recursive=True)
    os.killpg(bench.pid, signal.SIGINT)
    try:
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    return err, descendants


def _left_behind(processes: list[psutil.Process], timeout_s: float = 30.0) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout_s` (a zombie waiting for init to reap it ran its last)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for process in processes:
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.mark.parametrize("working", [False, True], ids=["child-starting", "child-working"])
def test_ctrl_c_in_bench_transfer_is_one_line_exit_130_and_no_child_left(working: bool) -> None:
    """A spawned leg printed `Process SpawnProcess-2: Traceback ... KeyboardInterrupt` (caught in its work) or a
    traceback from its imports (caught while it started) under the bench's exit 130, which said nothing itself."""
    bench = _start("bench", "transfer", "--chunk-bytes", "64KiB", "--room-bytes", "1MiB", "--rooms", "100000",
                   "--repeats", "1")  # fmt: skip
    try:
        _wait_for("spawned leg", lambda: _spawned(psutil.Process(bench.pid), working))
    finally:
        err, descendants = _interrupted(bench)

    assert err == "kvtop bench transfer: interrupted, stopping\n"
    assert bench.returncode == 130
    assert _left_behind(descendants) == []


def test_ctrl_c_in_bench_sidecar_stops_its_writer_and_tail_quietly() -> None:
    """The log writer and the bare tail loop (`python -c`) printed a KeyboardInterrupt traceback each, and the
    thread reading the tail a ValueError on the half line it left."""
    bench = _start("bench", "sidecar", "--seconds", "60")
    try:
        _wait_for("log writer", lambda: _child_running(psutil.Process(bench.pid), "write_log"))
    finally:
        err, descendants = _interrupted(bench)

    assert err.splitlines()[-1:] == ["kvtop bench sidecar: interrupted, stopping"]
    assert "Traceback" not in err
    assert bench.returncode == 130
    assert _left_behind(descendants) == []


def _child_running(bench: psutil.Process, named: str) -> psutil.Process | None:
    for child in bench.children():
        try:
            if named in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None
