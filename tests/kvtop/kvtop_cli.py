"""Running `kvtop`: the installed command the way a person or a script would, or in this process.

`kvtop_here` is for argument handling (usage errors, bad values, exit codes):
it runs `kvtop.cli.app.run` inside Typer's `CliRunner` isolation and answers
like `kvtop`, so no process is started. Where a real process is the point (a
cluster, a follow loop, signals, the console entry point) use `kvtop`.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from typer.testing import CliRunner

from kvtop.cli.app import run


def kvtop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `kvtop` (this Python's entry point) and capture its output; `env` adds variables."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    environment = {**os.environ, **env} if env else None
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=False, env=environment)


def kvtop_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`kvtop ARGS` run in this process, with its exit code and output as `kvtop` would give them; the signal
    handlers are put back after it (a service that stopped ignores the stop signals: its process is ending)."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with CliRunner().isolation(env=env) as (stdout, stderr, _):
            code = run(list(args))
            out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(["kvtop", *args], code, out, err)


class StderrLines:
    """A running kvtop's stderr, read by a thread of its own, so a test waits for a line with a deadline (a
    `readline` that no line answers would hang the test)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        self._stream = process.stderr
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            self._lines.put(line.rstrip("\n"))

    def next(self, start: str, timeout_s: float = 30.0) -> str:
        """The next line that starts with `start` (the lines before it are skipped, kept in `seen`)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if line.startswith(start):
                return line
        raise AssertionError(f"no stderr line starting {start!r} within {timeout_s} s: {self.seen[-10:]}")
