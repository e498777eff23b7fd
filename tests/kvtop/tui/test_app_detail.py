"""The dashboard's detail pane: a room's timeline, a rank's history, the list beside it."""

from __future__ import annotations

from tui_support import (
    SIZE,
    FixtureSource,
    all_rooms,
    drive,
    focused_id,
    journal_events,
    lines,
    next_frame,
    room_ids,
    wait_until,
)

from kvtop.tui.app import KvtopApp
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.widgets.row_list import RowList
from transport.kvpoll import KVPoll


def test_enter_on_a_room_opens_its_timeline_across_its_ranks(app: KvtopApp, source: FixtureSource):
    """The timeline names the room, every rank that reported it with its state, and its journal events."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        await pilot.press("down", "down")
        await pilot.pause()
        seen["room"] = room_ids(lines(app.query_one("#rooms-list")))[2]
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the room timeline")
        seen["body"] = app.screen.body.plain
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, DetailScreen), "escape closes the timeline")
        seen["focused"] = focused_id(app)

    drive(app, scenario)

    room, body = seen["room"], seen["body"]
    view = all_rooms(source)[room]
    journal = [e for _, e in journal_events(source) if getattr(e, "room", None) == room]
    assert body.startswith(f"Room {room}\n")
    assert [f"{label} {KVPoll(state).name}" for label, state in sorted(view.states.items())] == [
        " ".join(line.split()) for line in body.splitlines() if line.split()[:1] and line.split()[0] in view.states
    ]
    assert f"Timeline ({len(journal)} events still in the journal)" in body
    assert seen["focused"] == "rooms-list"


def test_enter_on_a_rank_opens_its_history(app: KvtopApp, source: FixtureSource):
    """The second rank of the overview (prefill-0/TP1) opens its identity, counters and heartbeats."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        seen["body"] = app.screen.body.plain
        await pilot.press("q")
        await wait_until(pilot, lambda: not isinstance(app.screen, DetailScreen), "q closes the history")
        seen["running"] = app.is_running

    drive(app, scenario)

    view = source.model.ranks["prefill-0/TP1"]
    assert seen["body"].startswith(f"prefill-0/TP1  prefill, pid {view.pid} on {view.host}")
    assert "Heartbeats (1 in the journal)" in seen["body"]
    assert seen["running"]


def test_opening_the_detail_pane_fits_the_failures_list_to_its_new_width(app: KvtopApp):
    """With the pane open (and the views paused, so no new frame comes) the narrower list does not scroll sideways."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("f")
        await next_frame(pilot)
        await pilot.press("p", "d")
        await pilot.pause()
        tree = app.query_one("#failure-tree", RowList)
        seen["widths"] = (tree.virtual_size.width, tree.scrollable_content_region.width)
        seen["scrollbar"] = tree.show_horizontal_scrollbar

    drive(app, scenario)

    virtual, width = seen["widths"]
    assert width < SIZE[0] - 40
    assert virtual <= width
    assert seen["scrollbar"] is False


def test_at_80_columns_a_ranks_and_a_rooms_panel_fit_their_rows(app: KvtopApp):
    """At 80x24 a rank's throughput row ended on a lone `MB/s` line, each heartbeat and each failure took two
    lines, and a room's every state change and transfer two: those rows fit (prose, a reason, may wrap), each
    still saying what it said."""
    seen: dict[str, tuple[int, list[str]]] = {}

    async def scenario(pilot):
        for name, keys in (("rank", ("enter",)), ("room", ("r", "enter"))):
            await pilot.press(*keys)
            await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), f"the {name} panel")
            await pilot.pause()
            width = app.screen.query_one("#detail Static").content_region.width
            seen[name] = (width, app.screen.body.plain.splitlines())
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, DetailScreen), "escape closes it")

    drive(app, scenario, size=(80, 24))

    width, rank = seen["rank"]
    rows = rank[rank.index("Throughput per 10 s (newest last)") :]
    assert [row for row in rows if len(row) > width] == []
    assert any(" cpu " in row and " in flight " in row and " dropped " in row for row in rows)
    assert any("echo of " in row for row in rows)
    width, room = seen["room"]
    traffic = [row for row in room if " ms  " in row and ("->" in row or " B in " in row or " B" in row)]
    assert traffic and [row for row in traffic if len(row) > width] == []
    assert all("room=" not in row for row in traffic)  # the panel's own room, said once at its top
