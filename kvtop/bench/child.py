"""A benchmark's child processes: started so that a Ctrl-C ends them quietly, and reporting over a `Pipe` (its next
message, or why none came).

A terminal's Ctrl-C reaches the whole process group, children included. A child that took it as Python's default
`KeyboardInterrupt` printed a traceback (`Process SpawnProcess-2: ... KeyboardInterrupt`) under the bench's own
line; one that ignored it would run on if its parent could not stop it. So a child starts with SIGINT held (blocked,
as the signal mask is inherited through fork and exec): a Ctrl-C during its start stays pending instead of landing in
its imports; once it runs it lets SIGINT in (a pending one at once) and stops on it the way its parent does, its
`with` blocks closed, exit 130 and no traceback; a second one does nothing (`transport.signals.interrupt`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.process import BaseProcess
from typing import Any

from kvtop.bench import BenchFailed
from transport.signals import held, interrupt

INTERRUPTED = 130
"""A child's exit code when a Ctrl-C stopped it (a shell's, for SIGINT; `kvtop.cli.options.INTERRUPTED`)."""


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT in this thread while inside: a child started here starts with it blocked (`exit_quietly` lets it
    in); one that reached this process meanwhile goes to its handler on the way out (`held`)."""
    with held(signal.SIGINT):
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def exit_quietly() -> Iterator[None]:
    """The work of a child started under `interrupts_held`: SIGINT let in, as one `KeyboardInterrupt` (once; a
    pending one raises at once), which ends the child with exit 130 and no traceback."""
    try:
        signal.signal(signal.SIGINT, interrupt)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        yield
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)


class Child(SpawnProcess):
    """A spawned process (`multiprocessing`'s spawn start method) that a Ctrl-C ends quietly: see the module."""

    def start(self) -> None:
        resource_tracker.ensure_running()  # first: starting it unblocks SIGINT (CPython's own hold, bpo-33613)
        with interrupts_held():
            super().start()

    def run(self) -> None:
        with exit_quietly():
            super().run()


@dataclass(frozen=True)
class ChildFailed:
    """What a child sends instead of its next message when it failed: in which part, and the error."""

    where: str
    error: str


def expect(conn: Connection, process: BaseProcess, what: str, timeout_s: float, name: str) -> Any:
    """`name`'s next message (`what`, for the errors); BenchFailed when it reports `ChildFailed`, exits first, or
    sends nothing within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.1):
        if not process.is_alive():
            raise BenchFailed(f"{name} exited with {process.exitcode} before its {what}")
        if time.monotonic() > deadline:
            raise BenchFailed(f"{name} sent no {what} within {timeout_s:g} s")
    message = conn.recv()
    if isinstance(message, ChildFailed):
        raise BenchFailed(f"{name} failed in its {message.where}: {message.error}")
    return message
