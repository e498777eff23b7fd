"""A FIFO made where the sidecar awaits its log: opening it waited for a writer, so the sidecar hung, deaf to
SIGTERM. It is looked at as a file not there yet."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from kvtop.sidecar.tail import LogTail
from kvtop.sources.sglang import LogSpec


def _polled_in_a_thread(tail: LogTail, fifo: Path) -> bool:
    """Whether `tail.poll()` came back; a poll stuck in the FIFO's open is let go by a writer's open."""
    thread = threading.Thread(target=tail.poll, daemon=True)
    thread.start()
    thread.join(timeout=20)
    came_back = not thread.is_alive()
    if not came_back:
        with contextlib.suppress(OSError), open(fifo, "wb"):
            pass  # the stuck open returns, and the thread ends
    return came_back


def test_a_fifo_where_the_log_is_awaited_is_waited_on_as_no_file(tmp_path: Path) -> None:
    path = tmp_path / "prefill-0.log"
    tail = LogTail(LogSpec(path, "prefill"))
    assert tail.poll().events == []  # not there yet
    os.mkfifo(path)

    assert _polled_in_a_thread(tail, path)
    assert tail.logs is None  # still waited for
