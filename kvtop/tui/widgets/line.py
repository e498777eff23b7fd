"""A one-line label that repaints only when its text changes, and never asks for a new layout."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvtop.tui.strips import shown_safely


class Line(Static):
    """Banners, health and titles: updated every frame, one row high (a layout pass costs ~50 ms)."""

    DEFAULT_CSS = "Line { height: 1; width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }"
    """One wider than the line is cut with `…` in its last cell (it wrapped at a word, the rest out of sight)."""

    def __init__(self, text: str | Text = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(Text(text) if isinstance(text, str) else text, id=id, classes=classes)
        self._shown: str | Text = text

    def show(self, text: str | Text) -> None:
        """Show `text` as it is: a string is never read as markup (titles carry the user's filter)."""
        if text != self._shown:
            self._shown = text
            self.update(shown_safely(Text(text) if isinstance(text, str) else text), layout=False)
