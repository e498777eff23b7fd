"""The overview: failures and throughput over the last minutes, rank grid, link heat map, incidents ongoing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from kvtop.tui.fit import ESSENTIAL, fit
from kvtop.tui.frame import INCIDENT_LINES, Frame, History, IncidentRow
from kvtop.tui.layout import Layout, overview_layout
from kvtop.tui.renderables.chart import bars, time_axis
from kvtop.tui.renderables.heatmap import LinkHeatMap, legend
from kvtop.tui.rows import (
    RANK_COLUMNS,
    RANK_HEADER,
    Palette,
    Pieces,
    TrendPeaks,
    clock,
    rank_columns,
    rank_header,
    rank_line,
)
from kvtop.tui.widgets.block import Block
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList
from kvtop.views import units
from kvtop.views.safe import one_line
from kvtop.views.text import fit_label

GUTTER = 12
"""Cells left of a chart: its scale (the value of a full bar) and its name."""
_PANEL_WIDGETS = {
    "failures": ("#failures-graph-title", "#failures-graph"),
    "throughput": ("#throughput-title", "#throughput-graph"),
    "links": ("#links-title", "#links", "#links-legend"),
    "incidents": ("#incidents-title", "#incidents"),
}


class OverviewView(Vertical):
    """Cluster at a glance; enter on a rank opens its history. Panels leave whole, by priority, where the
    terminal is too small for them (`overview_layout`)."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.frame: Frame | None = None
        self._palette: Palette | None = None
        self._side_shown: object = None
        """What the links and incidents panels show (drawn again only when it changes)."""
        self._charts_shown: object = None
        self._columns = frozenset(RANK_COLUMNS)
        self.layout_shown: Layout | None = None

    def compose(self) -> ComposeResult:
        yield Line(id="failures-graph-title", classes="title")
        yield Block(id="failures-graph", lines=4)
        yield Line(id="throughput-title", classes="title")
        yield Block(id="throughput-graph", lines=2)
        yield Line(id="time-axis")
        with Horizontal(id="overview-body"):
            with Vertical(id="ranks-panel"):
                yield Static(RANK_HEADER, classes="header", id="ranks-header")
                yield RowList(id="ranks-list")
            with Vertical(id="side-panel"):
                yield Static("Links  rate over 10 s, ✗ failed rooms", classes="title", id="links-title")
                yield Block(id="links")
                yield Line(id="links-legend")
                yield Static("Incidents  ongoing: rooms, what broke", classes="title", id="incidents-title")
                yield Block(id="incidents", lines=INCIDENT_LINES)

    def on_resize(self, event: events.Resize) -> None:
        """Lay out and draw for the new size at once (what is drawn for a width is kept: a view shown again at
        the size it had draws nothing new)."""
        if self.frame is not None and self._palette is not None and event.size.width and event.size.height:
            self.show(self.frame, self._palette)

    def _lay_out(self, width: int, height: int) -> None:
        """Show the panels that fit (a layout pass: only when the layout changes; a hidden view, of no size, keeps
        the layout it had)."""
        if not width or not height:
            return
        frame = self.frame
        ranks = len(frame.ranks) if frame is not None else 0
        prefills = len({prefill for prefill, _ in frame.links}) if frame is not None else 0
        layout = overview_layout(width, height, ranks, 1 + prefills if prefills else 1)
        if layout == self.layout_shown:
            return
        self.layout_shown = layout
        self.set_class(layout.narrow, "narrow")
        for panel, selectors in _PANEL_WIDGETS.items():
            for selector in selectors:
                self.query_one(selector).display = panel in layout.panels
        self.query_one("#time-axis").display = bool({"failures", "throughput"} & layout.panels)
        self.query_one("#failures-graph", Block).set_lines(2 * layout.failure_rows)
        self.query_one("#throughput-graph", Block).set_lines(layout.throughput_rows)
        self.query_one("#side-panel").display = bool({"incidents", "links"} & layout.panels)
        self.query_one("#incidents", Block).set_lines(layout.incident_rows)
        self._charts_shown = self._side_shown = None

    def show(self, frame: Frame, palette: Palette) -> None:
        self.frame, self._palette = frame, palette
        self._lay_out(self.size.width, self.size.height)
        layout = self.layout_shown
        if layout is None:
            return
        width = self.size.width
        charts = (frame.history, not frame.health.timed, palette, width, layout)
        if charts != self._charts_shown:
            self._charts_shown = charts
            self._show_charts(*charts)
        ranks, rank_list = frame.ranks, self.query_one("#ranks-list", RowList)
        sources = any(row.source != "agent" for row in ranks)
        columns = rank_columns(rank_list.scrollable_content_region.width, sources)
        if columns != self._columns:
            self._columns = columns
            self.query_one("#ranks-header", Static).update(rank_header(columns))
        peaks = TrendPeaks.of(ranks)
        rank_list.set_rows(len(ranks), lambda i: rank_line(ranks[i], palette, columns, peaks))
        ongoing = [row for row in frame.incidents if row.ongoing and not row.client]
        where = frame.options.filter
        links_width = self.query_one("#links").size.width  # (0 until laid out: its next frame draws it to fit)
        side = (frame.links, not frame.health.timed, ongoing, palette, width, links_width, layout.incident_rows, where)
        if side == self._side_shown:
            return
        self._side_shown = side
        title = f"Incidents  ongoing matching '{one_line(where)}'" if where else "Incidents  ongoing: rooms, what broke"
        self.query_one("#incidents-title", Static).update(Text(title))  # the health line counts them all
        untimed = not frame.health.timed
        heat = LinkHeatMap(frame.links, palette.accent, palette.error, untimed=untimed, width=links_width)
        self.query_one("#links", Block).show(heat.lines())
        self.query_one("#links-legend", Line).show(legend(links_width))
        ended = sum(not row.ongoing and not row.client for row in frame.incidents)
        if layout.narrow:
            lines = _incident_one_liners(ongoing, palette, width, layout.incident_rows)
        else:
            lines = _incident_lines(ongoing, palette, layout.incident_rows, self.query_one("#incidents").size.width)
        idle = f"no incident ongoing ({ended} ended, f: failures)" if ended else "no incident ongoing"
        self.query_one("#incidents", Block).show(lines or [Text(idle, style="dim")])

    def _show_charts(self, history: History, untimed: bool, palette: Palette, width: int, layout: Layout) -> None:
        chart = max(width - GUTTER, 0)
        minutes = f"{history.span_s / 60:g} min"
        self.query_one("#failures-graph-title", Line).show(
            fit(
                [
                    (Text("Failures", palette.accent + Style(bold=True)), ESSENTIAL),
                    (Text(f"  per {history.bucket_s:g} s, the last {minutes}  "), 2),
                    (Text("█ origins", palette.error), ESSENTIAL),
                    (Text(" (the rank that recorded it first)", style="dim"), 3),
                    (Text("  █ echoes", palette.warning), ESSENTIAL),
                    (Text(" (ranks told of it)", style="dim"), 3),
                ],
                width,
            )
        )
        rows = layout.failure_rows
        lines = _chart(history.origins, "origins", rows, chart, palette.error, _count)
        lines += _chart(history.echoes, "echoes", rows, chart, palette.warning, _count)
        if not any(history.origins) and not any(history.echoes):
            lines[rows - 1] = Text(f"{'':>{GUTTER}}no failure in the last {minutes}", style="dim")
        self.query_one("#failures-graph", Block).show(lines)
        peak = max(history.gbps, default=0.0)
        about = (
            "  none: server logs time no transfer"
            if untimed
            else f"  transfers done, mean per {history.bucket_s:g} s (scale: the peak, {units.gbps(peak)})"
        )
        self.query_one("#throughput-title", Line).show(
            fit([(Text("Throughput", palette.accent + Style(bold=True)), ESSENTIAL), (Text(about), 2)], width)
        )
        rows = layout.throughput_rows
        if untimed:  # no scale: a peak of 0 B/s would read as transfers that moved nothing
            lines = [Text(f"{'':>{GUTTER - 1}}│", style="dim")] * (rows - 1)
            lines.append(Text(f"{'':>{GUTTER}}server logs tell no throughput", style="dim"))
        else:
            lines = _chart(history.gbps, "0", rows, chart, palette.success, units.gbps)
        self.query_one("#throughput-graph", Block).show(lines)
        self.query_one("#time-axis", Line).show(Text(" " * GUTTER + time_axis(chart, history.span_s), style="dim"))

    def selected_rank(self, index: int) -> str | None:
        return self.frame.ranks[index].label if self.frame and index < len(self.frame.ranks) else None


def _chart(
    values: Sequence[float], name: str, rows: int, width: int, style: Style, label: Callable[[float], str]
) -> list[Text]:
    """`rows` lines of bars, the gutter naming the scale (the peak's value) at the top and `name` at the bottom."""
    peak = max(values, default=0.0)
    lines = []
    for row, cells in enumerate(bars(values, width, rows, peak)):
        gutter = label(peak) if row == 0 else name if row == rows - 1 else ""
        line = Pieces()
        line.add(f"{gutter:>{GUTTER - 2}} ", style if row == 0 else Style(dim=True))
        line.add("│", Style(dim=True))
        line.add(cells, style)
        lines.append(line.text())
    return lines


def _count(value: float) -> str:
    """A count chart's scale: `max 5` (a bare 5 above `origins` read as one axis with the 15 above `echoes`)."""
    return f"max {value:.0f}"


def _rooms(row: IncidentRow) -> str:
    """`31`, or `1+15` with failures that named no room (as `kvtop incidents`' ROOMS): no made-up rooms."""
    return f"{row.rooms}+{row.roomless}" if row.roomless else str(row.rooms)


def _incident_lines(ongoing: list[IncidentRow], palette: Palette, rows: int, width: int) -> list[Text]:
    """Two lines each, in `rows`: who broke, then what; since when beside who broke where the panel's `width` has
    room, else beside what where it has room there. A suspect wider than the panel keeps its start and its end (an
    address its port)."""
    shown = rows // 2
    if len(ongoing) > shown:  # the last place says how many more: each incident listed is listed whole
        shown -= 1
    lines: list[Text] = []
    for row in ongoing[:shown]:
        rooms = f"{_rooms(row):>5}  "
        suspect = fit_label(row.suspect, width - len(rooms)) if width > len(rooms) else row.suspect
        who = Text.assemble((f"{rooms}{suspect}", palette.error))  # a span: since when, appended, is not red
        what = Text(f"       {_cut_prose(row.headline.removeprefix(row.suspect).strip(), width - 7)}", style="dim")
        since = Text(f"  since {clock(row.first_seen)[:-4]}", style="dim")
        if not width or who.cell_len + since.cell_len <= width:
            lines += [who.append_text(since), what]
        else:
            lines += [who, fit([(what, ESSENTIAL), (since, 1)], width)]  # whole, or not at all
    if len(ongoing) > shown:
        lines.append(Text(f"       and {len(ongoing) - shown} more (f: failures)", style="dim"))
    return lines


def _cut_prose(what: str, width: int) -> str:
    """What broke in `width` cells (0: any): a longer one loses the end of its prose, not its class in parentheses
    (`stopped answ… (timeout_transfer)`; cut at the edge, it read `(timeout_tran`)."""
    if width <= 0 or len(what) <= width:
        return what
    prose, _, kind = what.rpartition(" (")
    room = width - len(kind) - 3
    return f"{prose[:room]}… ({kind}" if prose and what.endswith(")") and room > 0 else f"{what[: width - 1]}…"


def _incident_one_liners(ongoing: list[IncidentRow], palette: Palette, width: int, shown: int) -> list[Text]:
    """One line each (what broke leaves first where the line is narrow, never the rooms or the suspect)."""
    lines = [
        fit(
            [
                (Text(f"{_rooms(row):>5}  {row.suspect}", palette.error), ESSENTIAL),
                (Text(f"  {row.headline.removeprefix(row.suspect).strip()}", style="dim"), 2),
                (Text(f"  since {clock(row.first_seen)[:-4]}", style="dim"), 1),
            ],
            width,
        )
        for row in ongoing[:shown]
    ]
    if len(ongoing) > shown:
        lines[-1] = Text(f"      and {len(ongoing) - shown + 1} more (f: failures)", style="dim")
    return lines
