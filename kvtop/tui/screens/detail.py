"""A detail panel over the dashboard: a room's timeline or a rank's history."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kvtop.tui.strips import shown_safely


class DetailScreen(ModalScreen[None]):
    """Escape (or q) closes it; the text scrolls."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, body: Text) -> None:
        super().__init__()
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(shown_safely(self.body))
