"""Which overview panels fit a terminal, by priority (no Textual here: testable as plain data)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtop.tui.frame import INCIDENT_LINES

NARROW_COLUMNS = 120
"""Below this width the links and incidents go under the rank grid instead of beside it."""
NARROW_INCIDENTS = (2, 4)
"""Under the grid, the incidents ongoing take a line each: the least lines, and the most with rows to spare."""
GRID_ROWS = 8
"""Rank rows the grid keeps before a panel is shown (more ranks scroll)."""
PANELS = ("failures", "incidents", "throughput", "links")
"""The panels, the first kept longest."""
CHART_ROWS = (2, 5)
"""Rows of each failure chart (origins, echoes) and of the throughput chart: the least, and the most where the
screen has room to spare."""


@dataclass(frozen=True)
class Layout:
    panels: frozenset[str]
    failure_rows: int
    """Rows of the origins chart, and of the echoes chart."""
    throughput_rows: int
    incident_rows: int
    narrow: bool


def overview_layout(width: int, height: int, ranks: int, link_rows: int) -> Layout:
    """The panels that fit `height` rows with the rank grid (its header and up to `GRID_ROWS` ranks), taken in
    `PANELS` order; a panel too tall for what is left leaves whole. Rows to spare go to the incidents under the
    grid, then make the charts taller, then (wide) to the incidents beside the grid.

    Under `NARROW_COLUMNS` the links (`link_rows` lines) and incidents stack under the grid; wider, they sit
    beside it, and the grid is as tall as they are."""
    narrow = width < NARROW_COLUMNS
    low, high = CHART_ROWS
    links = 1 + link_rows + 1 + 1  # title, map, legend, a blank line
    grid = 1 + min(ranks or GRID_ROWS, GRID_ROWS)
    heights = {"failures": 1 + 2 * low, "throughput": 1 + low, "incidents": 0, "links": 0}
    if narrow:
        heights.update(incidents=1 + NARROW_INCIDENTS[0], links=links)
    else:
        grid = max(grid, 1 + INCIDENT_LINES + links)
    room = height - grid
    shown: list[str] = []
    for panel in PANELS:
        need = heights[panel]
        if panel in ("failures", "throughput") and not {"failures", "throughput"} & set(shown):
            need += 1  # the time axis under the charts
        if narrow and panel in ("incidents", "links") and not {"incidents", "links"} & set(shown):
            need += 1  # the line between the grid and what is under it
        if need <= room:
            shown.append(panel)
            room -= need
    failure_rows = throughput_rows = low
    incident_rows = INCIDENT_LINES
    if narrow:
        grow = min(NARROW_INCIDENTS[1] - NARROW_INCIDENTS[0], room) if "incidents" in shown else 0
        incident_rows, room = NARROW_INCIDENTS[0] + grow, room - grow
    if "failures" in shown:
        grow = min(high - low, room // 2)
        failure_rows, room = low + grow, room - 2 * grow
    if "throughput" in shown:
        grow = min(high - low, room)
        throughput_rows, room = low + grow, room - grow
    if not narrow:  # beside the grid: what is left lists more incidents (3 of 8 were shown above 12 blank rows)
        incident_rows += room
    return Layout(frozenset(shown), failure_rows, throughput_rows, incident_rows, narrow)
