"""Live clusters of real agents for the kvtop tests: the small failing cluster most of them start, the rooms
they run on it, and `kvtop cluster up` run as an operator runs it."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from transport import FaultSpec, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient

KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"

QUICK_TRANSFER = TransferConfig(chunk_bytes=16384, timeouts=Timeouts(3, 3, 2), peer_timeout_s=2)
"""16 KiB chunks, and transfers that give up within seconds: a room a fault broke settles fast."""


def small_cluster(faults: Mapping[str, str] | None = None, **fields: Any) -> ClusterSpec:
    """64 pages of 16 KiB per rank, `QUICK_TRANSFER`, one fault per target (`{"prefill-0/TP1": "corrupt"}`);
    `fields` set or override the rest of the `ClusterSpec`."""
    defaults: dict[str, Any] = {"num_pages": 64, "page_bytes": 16384, "transfer": QUICK_TRANSFER}
    parsed = {target: (FaultSpec.parse(fault),) for target, fault in (faults or {}).items()}
    return ClusterSpec(**{**defaults, **fields, "faults": parsed})


def run_rooms(
    cluster: LocalCluster, connect: Callable[[str], ControlClient], rooms: Iterable[int], wait_s: float | None = 10
) -> None:
    """Submit each room (8 pages) to every rank through `connect` (the `control` fixture), the decodes pulling
    from prefill-0; then, unless `wait_s` is None, wait for every rank's result of every room."""
    clients = {agent.label: connect(agent.control_endpoint) for agent in cluster.agents()}
    rooms = list(rooms)
    for room in rooms:
        for label, client in clients.items():
            client.submit(room, 8, "prefill-0" if label.startswith("decode") else "")
    if wait_s is not None:
        for room in rooms:
            for client in clients.values():
                client.wait_result(room, wait_s)


class Running:
    """A `kvtop cluster up` process whose stderr lines are read by a thread, so a test can wait for one."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        """`env`: variables set for it beside the environment's."""
        self.process = subprocess.Popen(
            [KVTOP, "cluster", "up", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env} if env else None,
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
