"""`kvtop top` (the dashboard on a live cluster) and the dashboard half of bare `kvtop`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import (
    At,
    Bootstrap,
    Connect,
    ReplayPath,
    SGLangLog,
    Wait,
    fail,
    open_sglang_logs,
    require_source,
)

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.tui.app import Source
    from kvtop.tui.themes import ThemeSet

Theme = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_THEME",
        help="Dashboard theme: kvtop-dark (default), kvtop-light, kvtop-high-contrast, kvtop-colorblind, "
        "or one from ~/.config/kvtop/themes/ (see themes/README.md).",
    ),
]


def find_theme(theme: str) -> ThemeSet:
    """Every theme found, checked to hold `theme` (a usage error otherwise, before anything starts)."""
    from kvtop.tui.themes import load_themes

    themes = load_themes()
    if theme not in themes.themes:
        known = ", ".join(sorted(themes.themes))
        raise typer.BadParameter(f"no theme {theme!r} (found: {known})", param_hint="--theme")
    return themes


def run_dashboard(
    source: Source,
    title: str,
    themes: ThemeSet,
    theme: str,
    quit_after: float | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Open the dashboard on `source` until the user quits (q, Ctrl-C) or the terminal goes away.

    A dashboard that failed (a frame that could not be built, or an exception in the app, whose traceback
    Textual prints first) exits 1 with one line naming the error."""
    from kvtop.tui.app import KvtopApp

    app = KvtopApp(source, title=title, themes=themes, theme=theme, quit_after=quit_after, clock=clock)
    app.run()
    if app.return_code:
        error = app.failure or app._exception  # Textual keeps what ended the app (no public accessor)
        raise fail(f"the dashboard failed: {error!r}" if error is not None else "the dashboard failed")


def top(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    sglang_log: SGLangLog = [],  # noqa: B006
    theme: Theme = "kvtop-dark",
    wait: Wait = 2.0,
    replay: ReplayPath = "",
    at: At = "",
) -> None:
    """The dashboard on a live cluster, on SGLang server logs or on a recording: overview, rooms, failures
    (folded), events.

    `?` in the dashboard lists every key. With --sglang-log the files are read from their start and
    followed as they grow; "now" is the latest time they mention. With --replay, the model as it was at
    --at (default: the recording's end), "now" being that instant.
    """
    from kvtop.cli.source import opened
    from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
    from transport.errors import BootstrapError

    require_source(bootstrap, connect, sglang_log, replay)
    themes = find_theme(theme)
    if replay:
        _top_on_recording(replay, at, themes, theme)
        return
    if at:
        raise typer.BadParameter("--at reads a recording: give --replay DIR")
    if sglang_log:
        _top_on_logs(sglang_log, themes, theme)
        return
    try:
        with opened(bootstrap, connect, wait, model=ClusterModel(JOURNAL_EVENTS_KEPT), synced=False) as source:
            assert source.collector is not None
            run_dashboard(source.collector, bootstrap or ", ".join(connect), themes, theme)
    except BootstrapError as error:
        raise fail(str(error)) from None


def _top_on_recording(replay: str, at: str, themes: ThemeSet, theme: str) -> None:
    """The dashboard on the model a recording held at `at` (its end by default), judged at that instant."""
    from kvtop.cli.source import opened
    from kvtop.cli.when import Past, pick
    from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
    from kvtop.views.times import stamp

    try:
        past = Past(replay, pick(at, "", ""))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with opened("", [], 0.0, model=ClusterModel(JOURNAL_EVENTS_KEPT), past=past) as source:
        if source.damage:
            typer.echo(f"kvtop: {source.damage}", err=True)
        held = _Still(source.model)
        instant = source.now()
        title = f"replay {replay} at {stamp(instant, dated=True)}"
        run_dashboard(held, title, themes, theme, clock=lambda: instant)


class _Still:
    """A source that never changes: a recording's model at one instant."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.error = ""


def _top_on_logs(sglang_log: list[str], themes: ThemeSet, theme: str) -> None:
    from kvtop.sources.sglang.follow import LogFollower

    follower = LogFollower(open_sglang_logs(sglang_log)).start()
    try:
        run_dashboard(follower, "sglang logs: " + ", ".join(sglang_log), themes, theme, clock=follower.now)
    finally:
        follower.close()
    if follower.died is not None:
        raise fail(follower.error)


def register(app: typer.Typer) -> None:
    app.command("top")(top)
