"""The overview: throughput sparkline, rank grid, link heat map and the incidents ongoing."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from kvtop.tui.frame import INCIDENT_LINES, Frame
from kvtop.tui.renderables.heatmap import LinkHeatMap
from kvtop.tui.rows import RANK_COLUMNS, RANK_HEADER, Palette, clock, rank_columns, rank_header, rank_line
from kvtop.tui.widgets.block import Block
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList
from kvtop.tui.widgets.sparkline import Sparkline
from kvtop.views import units

NARROW_COLUMNS = 120
"""Below this width the links and incidents go under the rank grid instead of beside it."""


class OverviewView(Vertical):
    """Cluster at a glance; enter on a rank opens its history."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.frame: Frame | None = None
        self._side_shown: object = None
        self._columns = frozenset(RANK_COLUMNS)
        """What the links and incidents panels show (drawn again only when it changes)."""

    def compose(self) -> ComposeResult:
        yield Line(id="throughput-title", classes="title")
        yield Sparkline(id="throughput")
        with Horizontal(id="overview-body"):
            with Vertical(id="ranks-panel"):
                yield Static(RANK_HEADER, classes="header", id="ranks-header")
                yield RowList(id="ranks-list")
            with Vertical(id="side-panel"):
                yield Static("Links  rate over 10 s, ✗ failed rooms", classes="title")
                yield Block(id="links")
                yield Static("Incidents  ongoing: rooms, what broke", classes="title")
                yield Block(id="incidents", lines=INCIDENT_LINES)

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_COLUMNS, "narrow")

    def show(self, frame: Frame, palette: Palette) -> None:
        self.frame = frame
        peak = max(frame.throughput, default=0.0)
        self.query_one("#throughput-title", Line).show(
            f"Throughput  per second over the last minute (peak {units.gbps(peak)})"
        )
        self.query_one("#throughput", Sparkline).show(frame.throughput)
        ranks, rank_list = frame.ranks, self.query_one("#ranks-list", RowList)
        columns = rank_columns(rank_list.scrollable_content_region.width)
        if columns != self._columns:
            self._columns = columns
            self.query_one("#ranks-header", Static).update(rank_header(columns))
        rank_list.set_rows(len(ranks), lambda i: rank_line(ranks[i], palette, columns))
        ongoing = [row for row in frame.incidents if row.ongoing and not row.client]
        if (frame.links, ongoing, palette) == self._side_shown:
            return
        self._side_shown = (frame.links, ongoing, palette)
        self.query_one("#links", Block).show(LinkHeatMap(frame.links, palette.accent, palette.error).lines())
        shown = INCIDENT_LINES // 2  # two lines each: who broke, then what and since when
        lines: list[Text] = []
        for row in ongoing[:shown]:
            since = f"  since {clock(row.first_seen)[:-4]}"
            lines.append(Text.assemble((f"{row.rooms:>5}  {row.suspect}", palette.error), (since, "dim")))
            lines.append(Text(f"       {row.headline.removeprefix(row.suspect).strip()}", style="dim"))
        if len(ongoing) > shown:
            lines[-1] = Text(f"       and {len(ongoing) - shown + 1} more (f: failures)", style="dim")
        ended = sum(not row.ongoing and not row.client for row in frame.incidents)
        idle = f"no incident ongoing ({ended} ended, f: failures)" if ended else "no incident ongoing"
        self.query_one("#incidents", Block).show(lines or [Text(idle, style="dim")])

    def selected_rank(self, index: int) -> str | None:
        return self.frame.ranks[index].label if self.frame and index < len(self.frame.ranks) else None
