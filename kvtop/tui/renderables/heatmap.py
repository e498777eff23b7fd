"""The prefill x decode link heat map as a Rich renderable (testable as a string)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text

from kvtop.tui.rows import Pieces
from kvtop.views import units

SHADES = " ░▒▓█"
"""Cell fill by share of the busiest link: the map reads without colour too."""


@dataclass
class LinkHeatMap:
    """Rows are prefill instances, columns decode instances; a cell shows GB/s and failed rooms.

    `hot` colours the busiest links, `failed` any link with failed rooms; both come from the theme. `untimed`:
    every rank is known from server logs, which time no transfer (none is to come): cells show failed rooms only.
    `width`: the columns it has; where each cell's own unit would not fit, every cell is in the busiest link's unit,
    named once in the corner (`MB/s`), and only a map wider still is cut at its right edge.
    """

    links: dict[tuple[str, str], tuple[float, int]]
    hot: Style
    failed: Style
    dim: Style = field(default_factory=lambda: Style(dim=True))
    untimed: bool = False
    width: int = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("\n", no_wrap=True, overflow="crop").join(self.lines())

    def lines(self) -> list[Text]:
        """The map's lines, laid out by hand as a borderless table: names left, figures right, a space either
        side of each cell; a map wider than the panel is cut at its right edge. (A Rich Table measured every
        cell on every frame, ~17 ms for 8 x 8 links; cutting one Text of ~250 spans into lines cost ~5 ms; a
        cell's nested spans sent every line down Rich's slow path.)"""
        if not self.links:
            return [Text("none: server logs time no transfer" if self.untimed else "no transfers yet", style="dim")]
        prefills = sorted({p for p, _ in self.links})
        decodes = sorted({d for _, d in self.links})
        peak = max(gbps for gbps, _ in self.links.values()) or 1.0
        lines = self._lines(prefills, decodes, peak, None)
        if self.width and not self.untimed and max(line.cell_len for line in lines) > self.width:
            lines = self._lines(prefills, decodes, peak, _Unit.of(peak))
        return lines

    def _lines(self, prefills: list[str], decodes: list[str], peak: float, unit: _Unit | None) -> list[Text]:
        """The map with each cell's rate in its own unit (`unit` None), or every one in `unit`."""
        bold = Style(bold=True)
        rows: list[list[Cell]] = [
            [((prefill, None),), *(self._cell(self.links.get((prefill, d)), peak, unit) for d in decodes)]
            for prefill in prefills
        ]
        header: list[Cell] = [((unit.name if unit else "", self.dim),), *(((decode, bold),) for decode in decodes)]
        widths = [max(_width(row[column]) for row in [header, *rows]) for column in range(len(header))]
        lines = []
        for row in [header, *rows]:
            line = Pieces()
            for column, cell in enumerate(row):
                pad = " " * (widths[column] - _width(cell))
                line.add(" " if column == 0 else " " + pad)
                for piece, style in cell:
                    line.add(piece, style)
                line.add(pad + " " if column == 0 else " ")
            lines.append(line.text())
        return lines

    def _cell(self, link: tuple[float, int] | None, peak: float, unit: _Unit | None) -> Cell:
        if link is None:
            return (("-", self.dim),)
        gbps, failed = link
        if self.untimed:  # the failed rooms alone: a `0 B/s` would read as a link measured idle
            return ((f"✗{failed}", self.failed),) if failed else (("-", self.dim),)
        shade = SHADES[min(len(SHADES) - 1, round(gbps / peak * (len(SHADES) - 1)))]
        rate = units.gbps(gbps) if unit is None else unit.figure(gbps)
        figure = (f"{shade} {rate}", self.hot if gbps >= peak / 2 and gbps > 0 else None)
        return (figure, (f" ✗{failed}", self.failed)) if failed else (figure,)


@dataclass(frozen=True)
class _Unit:
    """One unit for every cell of a narrow map: the busiest link's, as `units.rate` would name it."""

    name: str
    scale: float
    """GB/s per one of the unit."""
    digits: int

    @classmethod
    def of(cls, peak_gbps: float) -> _Unit:
        name = units.gbps(peak_gbps).split()[-1]
        scale = {"GB/s": 1.0, "MB/s": 1e-3, "KB/s": 1e-6}.get(name, 1e-9)
        return cls(name, scale, {"GB/s": 2, "MB/s": 1}.get(name, 0))

    def figure(self, gbps: float) -> str:
        """`18.9`, `0.50`; a rate that is not none but rounds to it: `<0.1`."""
        shown = f"{gbps / self.scale:.{self.digits}f}"
        if gbps > 0 and float(shown) == 0:
            return f"<{10**-self.digits:.{self.digits}f}" if self.digits else "<1"
        return shown


LEGEND = "  shade: ░ ¼  ▒ ½  ▓ ¾  █ of the busiest link"
SHORT_LEGEND = " ░ ¼  ▒ ½  ▓ ¾  █ of the busiest link"


def legend(width: int = 0) -> Text:
    """What the shades mean (the map reads without colour too), without `shade:` where the panel is narrower."""
    return Text(LEGEND if not width or len(LEGEND) <= width else SHORT_LEGEND, style="dim")


Cell = tuple[tuple[str, Style | None], ...]
"""A cell's pieces of text and their styles."""


def _width(cell: Cell) -> int:
    return sum(cell_len(piece) for piece, _ in cell)
