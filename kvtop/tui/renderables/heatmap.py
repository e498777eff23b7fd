"""The prefill x decode link heat map as a Rich renderable (testable as a string)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
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
        yield self.text()

    def text(self) -> Text:
        """The map as lines of text laid out by hand: a Rich Table measured every cell on every frame (~17 ms
        for 8 x 8 links, several times per paint: most of the overview's frame time). Names left, figures
        right, a space either side of each cell, as a borderless table; a map wider than the panel is cut at
        its right edge."""
        if not self.links:
            return Text("no transfers yet", style="dim")
        prefills = sorted({p for p, _ in self.links})
        decodes = sorted({d for _, d in self.links})
        peak = max(gbps for gbps, _ in self.links.values()) or 1.0
        rows = [
            [Text(prefill), *(self._cell(self.links.get((prefill, d)), peak) for d in decodes)] for prefill in prefills
        ]
        header = [Text(""), *(Text(decode, style="bold") for decode in decodes)]
        widths = [max(row[column].cell_len for row in [header, *rows]) for column in range(len(header))]
        text = Text(no_wrap=True, overflow="crop")
        for line, row in enumerate([header, *rows]):
            if line:
                text.append("\n")
            for column, cell in enumerate(row):
                pad = " " * (widths[column] - cell.cell_len)
                text.append(" ")
                text.append_text(Text(pad) + cell if column else cell + Text(pad))
                text.append(" ")
        return text

    def _cell(self, link: tuple[float, int] | None, peak: float) -> Text:
        if link is None:
            return Text("-", style="dim")
        gbps, failed = link
        shade = SHADES[min(len(SHADES) - 1, round(gbps / peak * (len(SHADES) - 1)))]
        text = Text(f"{shade} {rate(gbps)}", style=self.hot if gbps >= peak / 2 and gbps > 0 else "")
        if failed:
            text.append(f" ✗{failed}", style=self.failed)
        return text
