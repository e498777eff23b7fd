"""The prefill x decode link heat map as a Rich renderable (testable as a string)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.table import Table
from rich.text import Text

from kvtop.tui.rows import rate

SHADES = " ░▒▓█"
"""Cell fill by share of the busiest link: the map reads without colour too."""


@dataclass
class LinkHeatMap:
    """Rows are prefill instances, columns decode instances; a cell shows GB/s and failed rooms.

    `hot` colours the busiest links, `failed` any link with failed rooms; both come from the theme.
    """

    links: dict[tuple[str, str], tuple[float, int]]
    hot: Style
    failed: Style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.links:
            yield Text("no transfers yet", style="dim")
            return
        prefills = sorted({p for p, _ in self.links})
        decodes = sorted({d for _, d in self.links})
        peak = max(gbps for gbps, _ in self.links.values()) or 1.0
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        table.add_column("", no_wrap=True)
        for decode in decodes:
            table.add_column(decode, justify="right", no_wrap=True)
        for prefill in prefills:
            cells = [Text(prefill)]
            for decode in decodes:
                cells.append(self._cell(self.links.get((prefill, decode)), peak))
            table.add_row(*cells)
        yield table

    def _cell(self, link: tuple[float, int] | None, peak: float) -> Text:
        if link is None:
            return Text("-", style="dim")
        gbps, failed = link
        shade = SHADES[min(len(SHADES) - 1, round(gbps / peak * (len(SHADES) - 1)))]
        text = Text(f"{shade} {rate(gbps)}", style=self.hot if gbps >= peak / 2 and gbps > 0 else "")
        if failed:
            text.append(f" ✗{failed}", style=self.failed)
        return text
