"""Stopping a command on a signal, with no lock taken in the signal handler; holding a signal for a moment.

A handler runs in the main thread, between two of its bytecodes. `threading.Event.set` takes the event's
lock; when the signal lands while the main thread is inside `stop.wait()`, which holds that same lock for a
moment, the handler waits for a lock its own thread holds: the process never exits (seen: a sidecar that
ignored SIGTERM for good). Here the handler only puts the signal on a `queue.SimpleQueue`, whose `put` is
reentrant, and a thread of its own sets the event.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_DONE = 0
"""What the relay thread is told when the command ends without a signal (no signal is numbered 0)."""


@contextlib.contextmanager
def stop_on(stop: threading.Event, *signums: int) -> Iterator[None]:
    """While inside, each of `signums` sets `stop`; the handlers before are put back on the way out."""
    told: queue.SimpleQueue[int] = queue.SimpleQueue()

    def relay() -> None:
        if told.get() != _DONE:
            stop.set()

    thread = threading.Thread(target=relay, name="kvtop-signals", daemon=True)
    thread.start()
    previous = {signum: signal.signal(signum, lambda signum, _frame: told.put(signum)) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        told.put(_DONE)
        thread.join()


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
