"""Fixtures of the kvtop tests: SGLang log fixtures are read in UTC."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

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
