"""Bare `kvtop` on a terminal: a rank lost while the dashboard ran makes it exit 1 and say which, as without it.

It exited 0 and said nothing (`--no-dashboard` exited 1 naming the rank, and its stderr file, in a folder
removed on exit).
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def _decode_agent(parent: psutil.Process) -> psutil.Process | None:
    """The decode rank among the dashboard's descendants (its command line names its instance)."""
    return next(
        (child for child in parent.children(recursive=True) if _cmdline_has(child, '"instance":"decode-0"')), None
    )


def _ready(tmp_path: Path, parent: psutil.Process) -> bool:
    """The cluster is up and the dashboard's model runs: both ranks said they are ready in their logs (in the
    temporary log folder kvtop made under `tmp_path`) and the model's process started (after the cluster came up:
    a rank killed before that is a cluster that did not come up, another exit)."""
    logs = [log for name in ("prefill-0", "decode-0") for log in tmp_path.glob(f"kvtop-logs-*/{name}.log")]
    if len(logs) < 2 or not all("ready" in log.read_text() for log in logs):
        return False
    return any(_cmdline_has(child, "spawn_main") for child in parent.children(recursive=True))


def _cmdline_has(process: psutil.Process, text: str) -> bool:
    try:
        return text in " ".join(process.cmdline())
    except psutil.Error:
        return False


@contextlib.contextmanager
def _dashboard(tmp_path: Path, duration_s: int) -> Iterator[subprocess.Popen[bytes]]:
    """Bare `kvtop` on a 1P1D cluster with no fault, on a pseudo-terminal read in the background (so it never
    blocks on a full terminal), its temporary log folder under `tmp_path`; killed on the way out if it still runs."""
    main, terminal = pty.openpty()
    args = [sys.executable, "-m", "kvtop", "--prefill", "1", "--decode", "1", "--tp", "1", "--fault", "none"]
    kvtop = subprocess.Popen(
        [*args, "--no-record", "--duration", str(duration_s)],
        stdin=terminal,
        stdout=terminal,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    os.close(terminal)
    threading.Thread(target=_drain, args=(main,), daemon=True).start()
    try:
        yield kvtop
    finally:
        if kvtop.poll() is None:
            kvtop.kill()
            kvtop.wait()
        os.close(main)


def test_a_rank_killed_under_the_dashboard_makes_it_exit_1_naming_it_and_what_its_stderr_said(tmp_path: Path):
    with _dashboard(tmp_path, 12) as kvtop:
        parent = psutil.Process(kvtop.pid)
        wait_for(lambda: _ready(tmp_path, parent), 30, "the cluster up and the dashboard's model running")
        decode = _decode_agent(parent)
        assert decode is not None
        decode.send_signal(signal.SIGKILL)
        _, stderr = kvtop.communicate(timeout=60)

    said = stderr.decode(errors="replace")
    assert kvtop.returncode == 1, said
    assert f"kvtop: rank decode-0/TP0 (pid {decode.pid}) killed by SIGKILL; its stderr " in said
    assert ", removed on exit: --log-dir DIR keeps them) ..." in said  # the folder it names is gone by now


def _drain(fd: int) -> None:
    """Read what the dashboard draws, so it never blocks on a full terminal."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


def test_a_sigterm_while_the_dashboards_cluster_comes_up_stops_its_agents_and_removes_its_log_folder(tmp_path: Path):
    """Before the dashboard took SIGTERM it killed kvtop: the temporary log folder stayed behind, and the agents
    lived on until their parent-death check (then waited out a deregistration nobody answered)."""
    with _dashboard(tmp_path, 60) as kvtop:
        parent = psutil.Process(kvtop.pid)
        agents = wait_for(lambda: parent.children(recursive=True), 30, "an agent started")
        kvtop.send_signal(signal.SIGTERM)
        kvtop.send_signal(signal.SIGTERM)
        _, stderr = kvtop.communicate(timeout=60)

    said = stderr.decode(errors="replace")
    assert kvtop.returncode == 130 and "Traceback" not in said, said
    assert not any(agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE for agent in agents)
    assert not list(tmp_path.glob("kvtop-logs-*"))
