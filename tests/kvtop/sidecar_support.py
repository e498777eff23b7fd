"""Real `kvtop bootstrap` and `kvtop agent --sglang-log` processes for tests; every one is stopped after."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvtop_cli import kvtop

KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"


@contextmanager
def registry() -> Iterator[str]:
    """`kvtop bootstrap` on a free loopback port; yields the address it printed first; stopped by SIGTERM."""
    process = subprocess.Popen([KVTOP, "bootstrap"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        assert address.startswith("tcp://127.0.0.1:"), process.stderr.read() if process.stderr else address
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


class Sidecars:
    """Sidecar processes started by a test; `stop()` ends each with SIGTERM and checks it exited 0."""

    def __init__(self, bootstrap: str, folder: Path) -> None:
        self.bootstrap = bootstrap
        self.folder = folder
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, log: Path, *options: str) -> subprocess.Popen[str]:
        stderr = open(self.folder / f"sidecar-{len(self.processes)}.stderr", "w")  # noqa: SIM115
        command = [KVTOP, "agent", "--sglang-log", str(log), "--bootstrap", self.bootstrap, *options]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        stderr.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = [process.wait(30) for process in self.processes]
        errors = [path.read_text() for path in sorted(self.folder.glob("sidecar-*.stderr"))]
        assert all(code == 0 for code in codes), f"sidecar exit codes {codes}: {errors}"


@contextmanager
def sidecars(bootstrap: str, folder: Path) -> Iterator[Sidecars]:
    started = Sidecars(bootstrap, folder)
    try:
        yield started
    finally:
        started.stop()


def view_json(*args: str) -> Any:
    """`kvtop VIEW ... --json`, parsed (None when it failed)."""
    done = kvtop(*args, "--json", "--wait", "3")
    return json.loads(done.stdout) if done.returncode == 0 else None
