"""The `processes` marker and the fast lane (`pytest --no-processes`, `make test-fast`).

A test that starts a process (an agent, a cluster, the `kvtop` command, a fork)
carries the `processes` marker: set by hand with `pytestmark` or a decorator,
or here for every test that uses a fixture in `PROCESS_FIXTURES`. Under
`--no-processes` the marked tests are deselected and every way of starting a
process raises `ProcessStarted`, naming the test: one that starts a process
without the marker fails loudly instead of slowing the fast lane down.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

PROCESS_FIXTURES = frozenset({"make_cluster", "cluster_up"})
"""Fixtures that start processes: a test using one (directly or through another fixture) is marked."""

_OPTION = "--no-processes"


class ProcessStarted(BaseException):
    """A test of the fast lane started a process (a BaseException, so `except Exception` cannot hide it)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        _OPTION,
        action="store_true",
        help="run only the tests that start no process; a test that starts one anyway fails",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "processes: the test starts a process (agent, cluster, kvtop command, fork); --no-processes skips it"
    )
    config.addinivalue_line(
        "markers", "slow: the test moves a lot of data in-process (seconds on two cores); make test-fast skips it"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use a process fixture; under --no-processes, deselect every marked test."""
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
    if not config.getoption(_OPTION):
        return
    marked = [item for item in items if item.get_closest_marker("processes")]
    config.hook.pytest_deselected(items=marked)
    items[:] = [item for item in items if item.get_closest_marker("processes") is None]


_started = pytest.StashKey[list[str]]()

_STARTS: list[tuple[object, str, str]] = [
    (subprocess.Popen, "_execute_child", "subprocess"),
    (multiprocessing.process.BaseProcess, "start", "multiprocessing"),
    (os, "fork", "os.fork"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
]
"""Every way a test could start a process: subprocess, multiprocessing (any context), and the os calls."""


def _refusing(test: str, what: str, started: list[str]) -> Callable[..., Any]:
    def refuse(*_args: object, **_kwargs: object) -> Any:
        started.append(what)
        raise ProcessStarted(f"{test} started a process ({what}) but is not marked `processes`")

    return refuse


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under --no-processes, refuse every process start during the test's setup, call and teardown."""
    if not item.config.getoption(_OPTION):
        return (yield)
    started: list[str] = []
    item.stash[_started] = started
    patch = pytest.MonkeyPatch()
    for owner, name, what in _STARTS:
        patch.setattr(owner, name, _refusing(item.nodeid, what, started))
    try:
        return (yield)
    finally:
        patch.undo()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A phase that passed though it tried to start a process (the error swallowed, or raised in a thread) fails."""
    report: pytest.TestReport = yield
    started = item.stash.get(_started, [])
    if started and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} started a process ({', '.join(started)}) but is not marked `processes`"
    started.clear()
    return report
