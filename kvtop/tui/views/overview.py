"""The overview: throughput sparkline, rank grid, link heat map and top origins."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from kvtop.tui.frame import TOP_ORIGINS, Frame
from kvtop.tui.renderables.heatmap import LinkHeatMap
from kvtop.tui.rows import RANK_HEADER, Palette, rank_line, rate
from kvtop.tui.widgets.block import Block
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList
from kvtop.tui.widgets.sparkline import Sparkline


class OverviewView(Vertical):
    """Cluster at a glance; enter on a rank opens its history."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.frame: Frame | None = None
        self._side_shown: object = None
        """What the links and origins panels show (drawn again only when it changes)."""

    def compose(self) -> ComposeResult:
        yield Line(id="throughput-title", classes="title")
        yield Sparkline(id="throughput")
        with Horizontal(id="overview-body"):
            with Vertical(id="ranks-panel"):
                yield Static(RANK_HEADER, classes="header")
                yield RowList(id="ranks-list")
            with Vertical(id="side-panel"):
                yield Static("Links  rate over 10 s, ✗ failed rooms", classes="title")
                yield Block(id="links")
                yield Static("Top origins  last 60 s", classes="title")
                yield Block(id="origins", lines=TOP_ORIGINS)

    def show(self, frame: Frame, palette: Palette) -> None:
        self.frame = frame
        peak = max(frame.throughput, default=0.0)
        self.query_one("#throughput-title", Line).show(
            f"Throughput  per second over the last minute (peak {rate(peak)})"
        )
        self.query_one("#throughput", Sparkline).show(frame.throughput)
        ranks = frame.ranks
        self.query_one("#ranks-list", RowList).set_rows(len(ranks), lambda i: rank_line(ranks[i], palette))
        if (frame.links, frame.top_origins, palette) == self._side_shown:
            return
        self._side_shown = (frame.links, frame.top_origins, palette)
        self.query_one("#links", Block).show(LinkHeatMap(frame.links, palette.accent, palette.error).lines())
        origins = []
        for title, count in frame.top_origins:
            origins.append(Text.assemble((f"{count:>5}  ", palette.error), title))
        self.query_one("#origins", Block).show(origins or [Text("no failures in the last minute", style="dim")])

    def selected_rank(self, index: int) -> str | None:
        return self.frame.ranks[index].label if self.frame and index < len(self.frame.ranks) else None
