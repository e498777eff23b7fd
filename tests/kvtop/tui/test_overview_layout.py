"""The overview's panels by priority at any terminal size, and its charts and time axis as strings."""

from __future__ import annotations

import pytest

from kvtop.tui.layout import CHART_ROWS, NARROW_COLUMNS, PANELS, overview_layout
from kvtop.tui.renderables.chart import ZERO, bars, spark, time_axis

VIEW_ROWS = {(160, 45): 40, (100, 30): 25, (80, 24): 19}
"""The overview's rows at each terminal size (banner, health, tabs and footer take five)."""


def test_a_big_terminal_shows_every_panel_and_taller_charts():
    layout = overview_layout(160, VIEW_ROWS[160, 45], ranks=8, link_rows=3)
    assert layout.panels == frozenset(PANELS)
    assert not layout.narrow
    assert layout.failure_rows > CHART_ROWS[0] and layout.throughput_rows > CHART_ROWS[0]


@pytest.mark.parametrize(("size", "kept", "dropped"), [
    ((100, 30), {"failures", "incidents", "throughput"}, {"links"}),
    ((80, 24), {"failures", "incidents"}, {"throughput", "links"}),
])  # fmt: skip
def test_a_small_terminal_drops_whole_panels_the_least_important_first(size, kept, dropped):
    layout = overview_layout(size[0], VIEW_ROWS[size], ranks=8, link_rows=3)
    assert layout.narrow
    assert layout.panels == kept and not layout.panels & dropped


def test_the_panels_shown_never_need_more_rows_than_there_are():
    for height in range(5, 60):
        for width in (80, NARROW_COLUMNS - 1, NARROW_COLUMNS, 200):
            layout = overview_layout(width, height, ranks=8, link_rows=3)
            charts = {"failures", "throughput"} & layout.panels
            used = (1 + 8) + bool(charts)  # the grid, the time axis
            used += (1 + 2 * layout.failure_rows) if "failures" in layout.panels else 0
            used += (1 + layout.throughput_rows) if "throughput" in layout.panels else 0
            if layout.narrow:
                used += bool({"incidents", "links"} & layout.panels)  # the line above them
                used += (1 + layout.incident_rows) if "incidents" in layout.panels else 0
                used += (1 + 3 + 2) if "links" in layout.panels else 0
            assert used <= max(height, 9), (width, height, layout)


def test_bars_stand_in_eighths_and_one_failure_shows():
    assert bars([0, 1, 8, 16], 4, 2, 16.0) == ["   █", " ▁██"]
    assert bars([0, 0], 4, 1, 0.0) == ["    "]
    assert bars([1, 2, 3, 4, 5, 6], 3, 1, 6.0) == ["▃▆█"], "a column shows the largest of its values"


def test_a_sparkline_marks_nothing_apart_from_a_little():
    assert spark([0, 1, 4, 8], 8.0) == f"{ZERO}▁▄█"
    assert spark([0, 0], 0.0) == ZERO * 2


def test_the_time_axis_labels_each_minute_and_now():
    axis = time_axis(60, 300.0)
    assert axis.startswith("-5m") and axis.endswith("now")
    assert [axis.index(label) for label in ("-5m", "-4m", "-3m", "-2m", "-1m")] == [0, 12, 24, 36, 48]
    assert "-1m" not in time_axis(10, 300.0), "a label that would touch `now` leaves"
    assert len(time_axis(33, 300.0)) == 33


def test_rows_to_spare_beside_the_grid_list_more_incidents():
    """At 250x70 the charts were at their tallest and the incidents panel listed 3 of 8 above 12 blank rows."""
    from kvtop.tui.frame import INCIDENT_LINES

    layout = overview_layout(250, 65, ranks=8, link_rows=3)

    assert (layout.failure_rows, layout.throughput_rows) == (CHART_ROWS[1], CHART_ROWS[1])
    side = 1 + layout.incident_rows + (1 + 3 + 1 + 1)  # the incidents' title and rows, the links' panel
    charts = 1 + (1 + 2 * layout.failure_rows) + (1 + layout.throughput_rows)  # the time axis, the charts
    assert layout.incident_rows > INCIDENT_LINES and charts + side == 65
