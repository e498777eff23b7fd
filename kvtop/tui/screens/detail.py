"""A detail panel over the dashboard: a room's timeline or a rank's history, redrawn as its subject changes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kvtop.tui.strips import shown_safely

WHOLE_WIDTH_BELOW = 100
"""Columns under which the panel takes the whole width (90 % of 80 left a rank's heartbeat row two lines)."""


class DetailScreen(ModalScreen[None]):
    """Escape (or q) closes it; the text scrolls."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, body: Text) -> None:
        super().__init__()
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(shown_safely(self.body))

    def show(self, body: Text) -> None:
        """The subject's new text (the scroll position kept)."""
        self.body = body
        self.query_one("#detail Static", Static).update(shown_safely(body))

    def on_mount(self) -> None:
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        self.query_one("#detail").styles.width = "100%" if self.size.width < WHOLE_WIDTH_BELOW else "90%"
