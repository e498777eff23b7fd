"""What takes the path of a log the sidecar awaits and is no file: a FIFO (opening it waited for a writer, so the
sidecar hung, deaf to SIGTERM), a folder, a symlink loop. Each is waited on as no file, said once on stderr, and the
heartbeat does not call it found."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sidecar.sidecar import Sidecar, SidecarOptions
from kvtop.sidecar.tail import Gained, LogTail
from kvtop.sources.sglang import LogSpec
from tests.conftest import wait_for


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


def _said_by_a_sidecar_while(path: Path, change: Callable[[], None], expect: str) -> list[str]:
    """The stderr lines of a sidecar on `path` (role given, no bootstrap) until one holds `expect` and it polled the
    file a few times more (passes between its heartbeats too), `change` made once it said its first; its heartbeat
    then says no file was found."""
    said: list[str] = []
    stop = threading.Event()
    tail = LogTail(LogSpec(path, "prefill"))
    polls = [0]
    poll = tail.poll

    def counted_poll() -> Gained:
        polls[0] += 1
        return poll()

    tail.poll = counted_poll  # type: ignore[method-assign]
    sidecar = Sidecar(SidecarOptions(tail, poll_s=0.01), said.append)
    thread = threading.Thread(target=sidecar.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: said, 20, "the sidecar's first line")
        change()
        wait_for(lambda: any(expect in line for line in said), 20, repr(expect))
        after = polls[0]
        wait_for(lambda: polls[0] >= after + 5, 20, "five more passes of the sidecar's loop")
        assert sidecar.tail.followed().exists is False  # the heartbeat: no file found
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()
    return said


@pytest.mark.parametrize(("make", "what"), [(os.mkdir, "is a folder"), (os.mkfifo, "is a pipe")])
def test_a_folder_or_fifo_that_takes_the_awaited_log_s_path_is_said_once_and_not_called_found(
    tmp_path: Path, make: Callable[[Path], None], what: str
) -> None:
    path = tmp_path / "prefill-0.log"
    said = _said_by_a_sidecar_while(path, lambda: make(path), what)

    assert [line for line in said if what in line] == [
        f"{path} {what}, not a log file: waiting for a log file to take its place"
    ]
    assert any("to appear" in line for line in said)  # before it was made: not there at all


def test_a_symlink_loop_at_the_log_s_path_is_said_as_one_not_waited_to_appear(tmp_path: Path) -> None:
    path, other = tmp_path / "prefill-0.log", tmp_path / "other.log"
    os.symlink(other, path)
    os.symlink(path, other)
    said = _said_by_a_sidecar_while(path, lambda: None, "is a symlink loop")

    assert not any("to appear" in line for line in said), said
    assert sum("is a symlink loop" in line for line in said) == 1


def test_a_symlink_loop_given_at_start_is_refused_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "prefill-0.log"
    os.symlink(path, path)

    done = kvtop_here("agent", "--sglang-log", str(path), "--role", "prefill")

    assert done.returncode == 2 and "is a symlink loop" in done.stderr, done.stderr
