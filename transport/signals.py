"""Stopping a command on a signal, with no lock taken in the signal handler; holding a signal for a moment.

A handler runs in the main thread, between two of its bytecodes. `threading.Event.set` takes the event's
lock; when the signal lands while the main thread is inside `stop.wait()`, which holds that same lock for a
moment, the handler waits for a lock its own thread holds: the process never exits (seen: a sidecar that
ignored SIGTERM for good). Here the handler only puts the signal on a `queue.SimpleQueue`, whose `put` is
reentrant, and a thread of its own sets the event.

Once a command stops, the stop signals are ignored (`ignore`) rather than put back: what follows is its cleanup (a
recording's last flush, its agents' stop) and the interpreter's exit, and a second Ctrl-C or SIGTERM cut that
short (seen: a local cluster's summary lost, exit 130); at exit Python puts a handler of its own back to the
default, so a late SIGTERM killed a stopped command (-15) where an ignored one leaves it be.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops a service cleanly: SIGTERM (a supervisor), Ctrl-C, SIGHUP (its terminal went away)."""
_DONE = 0
"""What the relay thread is told when the command ends without a signal (no signal is numbered 0)."""


@contextlib.contextmanager
def stop_on(stop: threading.Event, *signums: int) -> Iterator[None]:
    """While inside, each of `signums` sets `stop`; on the way out they are ignored from then on (`ignore`):
    only a command's own main takes this, and what follows is its cleanup and exit."""
    told: queue.SimpleQueue[int] = queue.SimpleQueue()

    def relay() -> None:
        if told.get() != _DONE:
            stop.set()

    thread = threading.Thread(target=relay, name="kvtop-signals", daemon=True)
    thread.start()
    for signum in signums:
        signal.signal(signum, lambda signum, _frame: told.put(signum))
    try:
        yield
    finally:
        ignore(*signums)
        told.put(_DONE)
        thread.join()


def ignore(*signums: int) -> None:
    """Ignore `signums` from now on: this process is stopping already (see the module's docstring).

    Not from a handler: one pending then meets SIG_IGN and Python writes "Signal 15 ignored due to race
    condition" on stderr; out of one, `signal.signal` runs what is pending first."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A handler that stops a command the way Ctrl-C does (`KeyboardInterrupt`), once: the stop signals do
    nothing from then on, so a second one cannot cut the stop short (`ignore` them once it is done)."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, _stopping)
    raise KeyboardInterrupt


def _stopping(signum: int, frame: FrameType | None) -> None:
    """A stop signal while the process stops already: nothing more to do."""


@contextlib.contextmanager
def held(*signums: int) -> Iterator[None]:
    """Hold `signums` while inside and deliver the first that came on the way out, to the handler before.

    For a step that a handler raising mid-way would leave half done: a child forked and not yet on the list of
    those to stop. Only the main thread takes signals, so in any other thread this holds nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[tuple[int, FrameType | None]] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: came.append((signum, frame))) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum, frame in came[:1]:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
