"""Fixtures of the kvtop tests: SGLang log fixtures are read in UTC; `kvtop cluster up` runs that always stop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cluster_support import Running

from kvtop.sources.sglang import prefix


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Log stamps are local time: read them (here and in `kvtop` subprocesses) in UTC, so epochs are fixed."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    prefix._stamps.clear()
    yield
    monkeypatch.undo()
    time.tzset()
    prefix._stamps.clear()


@pytest.fixture
def cluster_up() -> Iterator[type[Running]]:
    """Start `kvtop cluster up ARGS` (call it with the args); every one started is stopped after the test."""
    started: list[Running] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Running:
        running = Running(*args, env=env)
        started.append(running)
        return running

    yield start  # type: ignore[misc]
    for running in started:
        running.stop()
