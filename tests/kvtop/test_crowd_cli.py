"""Views of more agents than a process may open sockets and files for by default: every view answers.

Past 1023 agents a view opened more snapshot sockets than ZeroMQ's default context allows and ended with a
traceback (`check`: UNKNOWN). Now each view sizes its context and open files to the agents, and where the
hard limit is too low for them, the ranks it could not open a socket for are named as such, and `check` is
CRITICAL on them.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys

import pytest
from crowd_support import crowd

from kvtop.source.live import nobody_answered
from transport.limits import files_for

AGENTS = 1100
"""More than the 1023 sockets of ZeroMQ's default context."""


def kvtop_limited(*args: str, open_files: int = 0) -> subprocess.CompletedProcess[str]:
    """`kvtop ARGS` in a process whose open files are capped at `open_files`, hard limit included (0: as is)."""

    def cap() -> None:
        if open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=120, preexec_fn=cap)


@pytest.mark.processes
def test_views_of_more_than_1023_agents_open_a_socket_for_each_and_answer():
    """1,100 agents: status lists each, none unreachable; check judges them (a loaded machine may leave some
    snapshots unanswered in time: WARNING or CRITICAL then, never UNKNOWN); neither ends in a traceback."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 6 * AGENTS + files_for(AGENTS):
        pytest.skip(f"the hard limit of open files ({hard}) is too low for the crowd and its view")
    with crowd(AGENTS) as bootstrap:
        status = kvtop_limited("status", "--bootstrap", bootstrap, "--json", "--wait", "20")
        check = kvtop_limited("check", "--bootstrap", bootstrap, "--wait", "20")

    assert status.returncode == 0, status.stderr
    result = json.loads(status.stdout)
    assert (result["ranks"]["total"], result["ranks"]["unreachable"]) == (AGENTS, 0)
    assert result["ranks"]["alive"] > 0 and result["collector"]["unreachable"] == {}
    assert check.returncode in (0, 1, 2), check.stdout + check.stderr
    assert check.stdout.startswith("KVTOP ") and "could not open" not in check.stdout
    for run in (status, check):
        assert "Traceback" not in run.stderr and "ZMQError" not in run.stdout + run.stderr


@pytest.mark.processes
def test_a_view_out_of_open_files_names_the_ranks_it_could_not_reach_and_check_is_critical():
    """60 agents, a view capped at 40 open files (hard limit too): the ranks it could not open a socket for are
    listed as unreachable, with the limit and what to raise; check is CRITICAL on them; no traceback."""
    with crowd(60) as bootstrap:
        ranks = kvtop_limited("ranks", "--bootstrap", bootstrap, "--json", "--wait", "10", open_files=40)
        text = kvtop_limited("ranks", "--bootstrap", bootstrap, "--wait", "10", open_files=40)
        check = kvtop_limited("check", "--bootstrap", bootstrap, open_files=40)

    assert ranks.returncode == 0, ranks.stderr
    unreachable = [rank["unreachable"] for rank in json.loads(ranks.stdout) if rank["unreachable"]]
    assert unreachable, "no rank named unreachable"
    assert all(why.startswith("snapshot socket: ") and "hard limit 40; raise `ulimit -n`" in why for why in unreachable)
    assert text.returncode == 0, text.stderr
    assert "unreachable: snapshot socket: " in text.stdout
    assert "could not open a socket for" in text.stdout and "raise `ulimit -n`" in text.stdout
    assert check.returncode == 2, check.stdout + check.stderr
    assert check.stdout.startswith("KVTOP CRITICAL - kvtop could not open a socket for")
    for result in (ranks, text, check):
        assert "Traceback" not in result.stderr, result.stderr


def test_a_view_that_heard_nobody_says_how_many_ranks_it_could_not_open_a_socket_for():
    """Its own limit may be why nobody answered: the one line says so."""
    line = nobody_answered("tcp://10.0.0.5:5555", [], 2.0, {"decode-0/TP0": "snapshot socket: why", "x/TP0": "why"})

    assert line == (
        "no agent answered within 2s (listed by tcp://10.0.0.5:5555); "
        "kvtop could not open a socket for 2 of them: snapshot socket: why"
    )
