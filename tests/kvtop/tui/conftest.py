"""Fixtures of the dashboard tests: UTC clock strings, no user themes, the synthetic cluster's source and app."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tui_support import FixtureSource, build_source, make_app

from kvtop.tui.app import KvtopApp


@pytest.fixture(autouse=True)
def utc_clock_strings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clock strings (event lines, failure times) read the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty `$XDG_CONFIG_HOME`: the user's own themes never leak into a test."""
    home = tmp_path / "config"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


@pytest.fixture
def source() -> FixtureSource:
    """The synthetic 2P2D TP2 cluster's model as of `FIXED_NOW`, with its lock."""
    return build_source()


@pytest.fixture
def app(source: FixtureSource) -> KvtopApp:
    """The dashboard over `source`, dark theme, fixed clock."""
    return make_app(source)
