"""The overview: throughput sparkline, rank grid, link heat map and top origins."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from kvtop.tui.frame import Frame
from kvtop.tui.renderables.heatmap import LinkHeatMap
from kvtop.tui.rows import RANK_HEADER, Palette, rank_line, rate
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList


class OverviewView(Vertical):
    """Cluster at a glance; enter on a rank opens its history."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.frame: Frame | None = None
        self._side_shown: object = None
        self._side_shape: object = None
        """What the links and origins panels show (redrawn only when it changes: they need a layout)."""

    def compose(self) -> ComposeResult:
        yield Line(id="throughput-title", classes="title")
        yield Sparkline([], id="throughput")
        with Horizontal(id="overview-body"):
            with Vertical(id="ranks-panel"):
                yield Static(RANK_HEADER, classes="header")
                yield RowList(id="ranks-list")
            with Vertical(id="side-panel"):
                yield Static("Links  rate over 10 s, ✗ failed rooms", classes="title")
                yield Static(id="links")
                yield Static("Top origins  last 60 s", classes="title")
                yield Static(id="origins")

    def show(self, frame: Frame, palette: Palette) -> None:
        self.frame = frame
        peak = max(frame.throughput, default=0.0)
        self.query_one("#throughput-title", Line).show(
            f"Throughput  per second over the last minute (peak {rate(peak)})"
        )
        self.query_one("#throughput", Sparkline).data = frame.throughput
        ranks = frame.ranks
        self.query_one("#ranks-list", RowList).set_rows(len(ranks), lambda i: rank_line(ranks[i], palette))
        if (frame.links, frame.top_origins, palette) == self._side_shown:
            return
        shape = (sorted(frame.links), len(frame.top_origins))
        relayout = shape != self._side_shape  # new rows: the panels grow; new figures only: repaint in place
        self._side_shown, self._side_shape = (frame.links, frame.top_origins, palette), shape
        self.query_one("#links", Static).update(
            LinkHeatMap(frame.links, palette.accent, palette.error), layout=relayout
        )
        origins = Text()
        for title, count in frame.top_origins:
            origins.append(f"{count:>5}  ", style=palette.error)
            origins.append(f"{title}\n")
        self.query_one("#origins", Static).update(
            origins or Text("no failures in the last minute", style="dim"), layout=relayout
        )

    def selected_rank(self, index: int) -> str | None:
        return self.frame.ranks[index].label if self.frame and index < len(self.frame.ranks) else None
