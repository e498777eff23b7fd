"""`stop_on`: a signal stops a command whatever its main thread was doing, never deadlocking it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

ROUNDS = 1000
PROGRAM = f"ROUNDS = {ROUNDS}\n" + textwrap.dedent(
    """
    import os, signal, threading
    from transport.signals import stop_on

    for i in range(ROUNDS):
        stop = threading.Event()
        with stop_on(stop, signal.SIGUSR1):
            threading.Timer(0.0002 * (i % 5), os.kill, (os.getpid(), signal.SIGUSR1)).start()
            while not stop.wait(0):
                pass
    print(f"stopped {ROUNDS} times")
    """
)


@pytest.mark.slow
@pytest.mark.processes
def test_a_signal_landing_while_the_main_thread_waits_on_the_event_stops_it_every_time() -> None:
    """A thousand signals, each landing while the main thread spins on `stop.wait(0)` (inside the event's lock
    half the time): every one sets the event. (With a handler that calls `stop.set()` itself this program hangs
    within a few thousand rounds, as a sidecar did that ignored SIGTERM for good.)"""
    try:
        done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("a signal never stopped the loop") from None
    assert (done.returncode, done.stdout.strip()) == (0, f"stopped {ROUNDS} times"), done.stderr
