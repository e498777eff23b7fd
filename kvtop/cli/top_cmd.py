"""`kvtop top` (the dashboard on a live cluster) and the dashboard half of bare `kvtop`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import Bootstrap, Connect, Wait, fail, require_source

if TYPE_CHECKING:
    from kvtop.tui.app import Source

Theme = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_THEME",
        help="Dashboard theme: kvtop-dark (default), kvtop-light, kvtop-high-contrast, kvtop-colorblind, "
        "or one from ~/.config/kvtop/themes/ (see themes/README.md).",
    ),
]


def run_dashboard(source: Source, title: str, theme: str, quit_after: float | None = None) -> None:
    """Open the dashboard on `source` until the user quits (q, Ctrl-C) or the terminal goes away."""
    from kvtop.tui.app import KvtopApp
    from kvtop.tui.themes import load_themes

    themes = load_themes()
    if theme not in themes.themes:
        known = ", ".join(sorted(themes.themes))
        raise typer.BadParameter(f"no theme {theme!r} (found: {known})", param_hint="--theme")
    os.environ.setdefault("TEXTUAL_FPS", "30")
    KvtopApp(source, title=title, themes=themes, theme=theme, quit_after=quit_after).run()


def top(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    theme: Theme = "kvtop-dark",
    wait: Wait = 2.0,
) -> None:
    """The dashboard on a live cluster: overview, rooms, failures (folded), events; `?` lists the keys."""
    from kvtop.collect import Collector
    from transport.errors import BootstrapError

    require_source(bootstrap, connect)
    collector = Collector(bootstrap, connect)
    try:
        collector.start(discover_timeout_s=wait)
    except BootstrapError as error:
        collector.close()
        raise fail(str(error)) from None
    try:
        run_dashboard(collector, bootstrap or ", ".join(connect), theme)
    finally:
        collector.close()


def register(app: typer.Typer) -> None:
    app.command("top")(top)
