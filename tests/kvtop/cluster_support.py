"""`kvtop cluster up` run as an operator runs it, for tests that need a live cluster of real agents."""

from __future__ import annotations

import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"


class Running:
    """A `kvtop cluster up` process whose stderr lines are read by a thread, so a test can wait for one."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [KVTOP, "cluster", "up", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.bootstrap = self.process.stdout.readline().strip()
        self.lines: list[str] = []
        self._cursor = 0
        """Lines before it were looked at by an earlier `wait_line`."""
        self._new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._new.put(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout_s: float = 60.0) -> re.Match[str]:
        """The first stderr line after the one the previous call matched that matches `pattern`."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._cursor < len(self.lines):
                self._cursor += 1
                if match := re.search(pattern, self.lines[self._cursor - 1]):
                    return match
            left = deadline - time.monotonic()
            try:
                self.lines.append(self._new.get(timeout=max(0.0, left)))
            except queue.Empty:
                seen = self.lines[-20:]
                raise AssertionError(f"no stderr line matched {pattern!r} in {timeout_s} s: {seen}") from None

    def stop(self) -> int:
        """SIGTERM, as an operator's Ctrl-C would; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)
