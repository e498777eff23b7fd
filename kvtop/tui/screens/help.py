"""`?`: every key binding of the dashboard, generated from the bindings themselves."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

_KEY_NAMES = {"question_mark": "?", "slash": "/", "comma": ",", "full_stop": ".", "less_than_sign": "<",
              "greater_than_sign": ">", "left_square_bracket": "[", "right_square_bracket": "]"}  # fmt: skip


def binding_table(sections: dict[str, list[BindingType]]) -> Table:
    """Key, action description per binding, grouped by where it works."""
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for section, bindings in sections.items():
        table.add_row(f"[u]{section}[/u]", "")
        for binding in bindings:
            if isinstance(binding, Binding):
                table.add_row(
                    " / ".join(_KEY_NAMES.get(key, key) for key in binding.key.split(",")),
                    binding.tooltip or binding.description,
                )
        table.add_row("", "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: dict[str, list[BindingType]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static("kvtop keys  (escape closes; the mouse works too: click a view's tab, a row, a node)")
            yield Static(binding_table(self.sections))
