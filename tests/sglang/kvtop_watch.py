"""kvtop watching the SGLang ranks: a real `kvtop bootstrap`, and its views as JSON."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KVTOP = str(Path(sys.executable).parent / "kvtop")


@contextmanager
def registry() -> Iterator[str]:
    """`kvtop bootstrap` on a free loopback port; yields its address; stopped by SIGTERM."""
    process = subprocess.Popen([KVTOP, "bootstrap"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        assert address.startswith("tcp://127.0.0.1:"), process.stderr.read() if process.stderr else address
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def view(bootstrap: str, name: str, *args: str) -> Any:
    """`kvtop NAME --bootstrap B --json`, parsed (None: kvtop found no rank to ask, exit 1)."""
    done = subprocess.run([KVTOP, name, "--bootstrap", bootstrap, "--json", "--wait", "3", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def events(bootstrap: str) -> list[dict[str, Any]]:
    """`kvtop events --jsonl` of the live cluster: what its ranks' snapshots hold."""
    done = subprocess.run([KVTOP, "events", "--bootstrap", bootstrap, "--jsonl", "--level", "debug", "--wait", "3"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
