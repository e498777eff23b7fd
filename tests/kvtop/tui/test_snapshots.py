"""What each view looks like in the dark and the light theme (SVG snapshots; update only after looking at the diff).

`pytest tests/kvtop/tui/test_snapshots.py --snapshot-update` rewrites them in `__snapshots__/`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_support import SIZE, FixtureSource, build_history_source, make_app, next_frame, wait_until

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.sources.sglang import load
from kvtop.tui.views.failures import FailuresView, group_key

THEMES = ["kvtop-dark", "kvtop-light"]


async def overview(pilot) -> None:
    await next_frame(pilot)


async def rooms(pilot) -> None:
    await pilot.press("r")
    await next_frame(pilot)


async def failures(pilot) -> None:
    """Three levels: the newest incident expanded into its failure groups, its first group into its echoes, the
    group's detail pane open."""
    app = pilot.app
    await pilot.press("f")
    await next_frame(pilot)
    await pilot.press("enter", "down", "enter", "d")
    view = app.query_one(FailuresView)
    await wait_until(
        pilot,
        lambda: (
            view.highlighted.group is not None
            and group_key(view.highlighted.group) in view.expanded
            and app.query_one("#failure-detail").display
        ),
        "the newest incident and its first group expanded, the group's detail shown",
    )
    await next_frame(pilot)  # the list narrowed for the pane: the next frame fits the rows to it


async def events(pilot) -> None:
    """Debug on: echoes and room traffic shown."""
    await pilot.press("e", "l")
    await next_frame(pilot)


VIEWS = {"overview": overview, "rooms": rooms, "failures": failures, "events": events}


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("view", list(VIEWS))
def test_view_snapshot(snap_compare, view: str, theme: str):
    """Each view of the synthetic cluster, as of its fixed clock, in each theme."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await VIEWS[view](pilot)

    app = make_app(theme=theme, refresh_s=3600)  # frames come when asked for, never while the screenshot is taken
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("theme", THEMES)
def test_overview_snapshot_at_100x30(snap_compare, theme: str):
    """Under 120 columns the links and incidents sit below the rank grid, whose columns leave whole; the banner
    keeps the data's time and `? help`, the health line its stuck and gaps, the footer `?` and `q`."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await next_frame(pilot)

    app = make_app(theme=theme, refresh_s=3600)
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_overview_snapshot_at_120x36(snap_compare):
    """At 120x36 the Links panel beside the grid cut `decode-1` and its rates (`█ 19.9 MB/`): every cell in the
    busiest link's unit, named once in the map's corner (`MB/s`), and the legend without `shade:`, fit it."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await next_frame(pilot)

    assert snap_compare(make_app(refresh_s=3600), terminal_size=(120, 36), run_before=run_before)


def test_rooms_snapshot_at_80x24(snap_compare):
    """At 80x24 the rooms view keeps its FLAG column (the link cut, `prefill-0-…`) and its footer every key it
    needs, `x` and `s` among them, closer together (the palette's key left for the help)."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await rooms(pilot)

    assert snap_compare(make_app(refresh_s=3600), terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", [(160, 45), (100, 30)], ids=["160x45", "100x30"])
def test_overview_of_failures_over_time_snapshot(snap_compare, size: tuple[int, int], theme: str):
    """Five minutes of traffic with a burst of failures three minutes ago: the failures graph (origins apart from
    echoes) and the throughput graph over one time axis, each rank's trends; at 100x30 the links leave whole."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await next_frame(pilot)

    app = make_app(build_history_source(), theme=theme, refresh_s=3600)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


CRASH_LOGS = Path(__file__).parent.parent / "fixtures" / "sglang" / "scheduler-crash"


@pytest.mark.usefixtures("utc")
def test_overview_of_logs_with_a_crashed_rank_snapshot(snap_compare):
    """prefill-0/TP2's scheduler crashed: `1 rank crashed` in the health line, its row's state `crashed` in red,
    and the incident its decode peers saw named after it."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    logs = load([CRASH_LOGS / "prefill.log", CRASH_LOGS / "decode.log"], model)

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await next_frame(pilot)

    app = make_app(FixtureSource(model), refresh_s=3600, clock=lambda: logs.now)
    assert snap_compare(app, terminal_size=(160, 30), run_before=run_before)
