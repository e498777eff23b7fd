"""A benchmark's child process reporting over a `Pipe`: its next message, or why none came."""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from kvtop.bench import BenchFailed


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
