"""`kvtop record` on a real cluster where its folder is not its own: a second recorder on the folder exits 1
naming the first (until the first dies)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtop.cluster.local import demo_spec
from tests.kvtop.kvtop_cli import kvtop
from transport.cluster import LocalCluster
from transport.config import Timeouts


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 1P1D TP1 cluster's bootstrap address."""
    logs = tmp_path_factory.mktemp("logs")
    spec = demo_spec(1, 1, 1, {}, str(logs), Timeouts(bootstrap_s=5.0, waiting_s=5.0, transfer_s=2.0))
    with LocalCluster(spec) as cluster:
        yield cluster.endpoint


def _record(endpoint: str, folder: Path, *options: str) -> subprocess.Popen[str]:
    """A `kvtop record` process."""
    command = [sys.executable, "-m", "kvtop", "record", "--bootstrap", endpoint, "--out", str(folder), *options]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def _recording(process: subprocess.Popen[str]) -> None:
    """Wait until the recorder says it records."""
    assert process.stderr is not None
    line = process.stderr.readline()
    assert line.startswith("kvtop record: recording"), line


def test_a_second_recorder_on_a_folder_exits_1_naming_the_first_ones_pid_until_the_first_dies(
    endpoint: str, tmp_path: Path
) -> None:
    """The second `kvtop record` on a folder says one line naming the first's pid and exits 1, before it
    connects; once the first is killed (-9: no clean exit), the folder's lock is gone and a recorder runs."""
    folder = tmp_path / "rec"
    first = _record(endpoint, folder)
    try:
        _recording(first)
        second = kvtop("record", "--bootstrap", endpoint, "--out", str(folder), "--duration", "1")
        assert second.returncode == 1
        assert second.stderr == f"kvtop: another kvtop (pid {first.pid}) records into {folder}\n"
    finally:
        first.kill()
        first.communicate(timeout=10)
    third = kvtop("record", "--bootstrap", endpoint, "--out", str(folder), "--duration", "1")
    assert third.returncode == 0, third.stderr
