"""A detail panel over the dashboard: a room's timeline or a rank's history, redrawn as its subject changes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kvtop.tui.strips import shown_safely

WHOLE_WIDTH_BELOW = 100
"""Columns under which the panel takes the whole width (90 % of 80 left a rank's heartbeat row two lines)."""

PASSED_TO_THE_APP: list[BindingType] = [
    Binding(keys, f"app.{action}", show=False)
    for keys, action in (
        ("p", "pause"),
        ("comma", "step(-1)"),
        ("full_stop", "step(1)"),
        ("less_than_sign", "step(-6)"),
        ("greater_than_sign", "step(6)"),
        ("left_square_bracket", "origin(-1)"),
        ("right_square_bracket", "origin(1)"),
        ("L", "live"),
        ("L", "end"),
        ("t", "next_theme"),
        ("question_mark", "help"),
    )
]
"""The app's keys that act through an open panel (a modal screen stops the app's bindings): the rewind moves,
which the panel follows (it is of the model the views show), the theme and the help. The app's `check_action`
still judges them (no rewind keys without a recording). Not `b`, `/` (their input box lies under the panel) nor a
view's own keys (what they change lies under it)."""


class DetailScreen(ModalScreen[None]):
    """Escape (or q) closes it; the text scrolls; `o` `r` `f` `e` close it on their view; the rewind keys move the
    replay it follows."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        *(Binding(f"{view[0]},{n}", f"view('{view}')", show=False)
          for n, view in enumerate(("overview", "rooms", "failures", "events"), start=1)),
        *PASSED_TO_THE_APP,
    ]  # fmt: skip

    def __init__(self, body: Text) -> None:
        super().__init__()
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(shown_safely(self.body))

    def at(self, when: str) -> None:
        """Say on the panel's border which model it is of (`live`, `REPLAY 03:00:12 ...`): the banner saying so lies
        under the panel while the rewind keys move it."""
        self.query_one("#detail").border_title = when

    def show(self, body: Text) -> None:
        """The subject's new text (the scroll position kept)."""
        self.body = body
        self.query_one("#detail Static", Static).update(shown_safely(body))

    async def action_view(self, view: str) -> None:
        """A view's key: the panel closes on that view (its subject is not what the view lists)."""
        self.dismiss()
        await self.app.run_action(f"view('{view}')")

    def on_mount(self) -> None:
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        self.query_one("#detail").styles.width = "100%" if self.size.width < WHOLE_WIDTH_BELOW else "90%"
