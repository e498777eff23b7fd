"""The dashboard's detail pane: a room's timeline, a rank's history (followed live), the list beside it."""

from __future__ import annotations

import time

from tui_support import (
    FIXED_NOW,
    SIZE,
    FixtureSource,
    all_rooms,
    drive,
    focused_id,
    journal_events,
    lines,
    make_app,
    next_frame,
    room_ids,
    submit_filter,
    text,
    wait_until,
)

from kvtop.tui.app import KvtopApp
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.widgets.row_list import RowList
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, RoomState


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
    lines, a room's every state change and transfer two, and its `1,048,576/1,048,576 bytes` wrapped: those rows
    fit (prose, a reason, may wrap), each still saying what it said, sizes as the rest of the dashboard says them."""
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
    rows = rank[next(i for i, row in enumerate(rank) if row.startswith("Throughput per 10 s to ")) :]
    assert [row for row in rows if len(row) > width] == []
    assert any(" cpu " in row and " in flight " in row and " dropped " in row for row in rows)
    assert any("echo of " in row for row in rows)
    width, room = seen["room"]
    summary = room[: room.index("")]  # its id, times, bytes and link, each rank's state
    assert [row for row in summary if len(row) > width] == []
    assert any(row.endswith(" MB") or " MB, link " in row for row in summary), summary  # `1.0 MB/1.0 MB`, no `bytes`
    assert all(" bytes" not in row for row in summary)
    traffic = [row for row in room if " ms  " in row and ("->" in row or " B in " in row or " B" in row)]
    assert traffic and [row for row in traffic if len(row) > width] == []
    assert all("room=" not in row for row in traffic)  # the panel's own room, said once at its top


def _hear(source: FixtureSource, role: str, instance: str, rank: int, seq: int, *events) -> None:
    """`events` from `instance`/TP`rank` reach the model as the collector applies a delivery (then its sweep)."""
    batch = EventBatch(EVENT_SCHEMA, role, instance, rank, 1, seq, FIXED_NOW, list(events))
    with source.lock:
        source.model.apply(f"{instance}/TP{rank}", batch, FIXED_NOW)
        source.model.sweep(FIXED_NOW)


async def _open_room(pilot, app: KvtopApp, room: int) -> None:
    """The rooms view filtered to `room`, its timeline opened."""
    await pilot.press("r")
    await submit_filter(pilot, str(room))
    await next_frame(pilot)
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the room timeline")


def test_an_open_rooms_panel_shows_the_room_failing_while_it_is_open(app: KvtopApp, source: FixtureSource):
    """A room's timeline was taken as the panel opened: the room failing meanwhile showed only once it was
    reopened. With the panel open, the decode rank's failure and its Failed state come in the next frames."""
    room = 4545001
    moving = (int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
    _hear(source, "prefill", "prefill-0", 0, 20_000, RoomState(FIXED_NOW - 0.5, room, *moving))
    _hear(source, "decode", "decode-0", 0, 20_000, RoomState(FIXED_NOW - 0.5, room, *moving))
    seen = {}

    async def scenario(pilot):
        await _open_room(pilot, app, room)
        seen["before"] = app.screen.body.plain
        failed = Failure(FIXED_NOW, room, "decode-0/TP0", "KV chunk 3 failed its checksum", "checksum", "error", False,
                         "decode-0/TP0", "prefill-0/TP0")  # fmt: skip
        state = RoomState(FIXED_NOW, room, int(KVPoll.Failed), int(KVPoll.Transferring))
        _hear(source, "decode", "decode-0", 0, 20_001, state, failed)
        await wait_until(pilot, lambda: "checksum" in app.screen.body.plain, "the panel has the room's failure")
        await pilot.pause()
        seen["after"] = text(app, "#detail Static")  # on screen

    drive(app, scenario)

    assert "decode-0/TP0      Transferring" in seen["before"] and "checksum" not in seen["before"]
    assert "decode-0/TP0      Failed" in seen["after"]
    assert "Timeline (4 events still in the journal)" in seen["after"]
    assert "KV chunk 3 failed its checksum" in seen["after"]


def test_an_open_ranks_panel_shows_its_new_failure(app: KvtopApp, source: FixtureSource):
    """A failure the rank records while its history is open joins the history's failures in the next frames."""
    room = 4545002
    seen = {}

    async def scenario(pilot):
        await pilot.press("down", "enter")  # prefill-0/TP1
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        seen["before"] = app.screen.body.plain
        failed = Failure(FIXED_NOW, room, "prefill-0/TP1", "decode peer stopped answering", "timeout_transfer",
                         "error", False, "prefill-0/TP1", "decode-1/TP1")  # fmt: skip
        _hear(source, "prefill", "prefill-0", 1, 20_000, failed)
        await wait_until(pilot, lambda: f"room {room}" in app.screen.body.plain, "the panel shows the new failure")
        seen["after"] = app.screen.body.plain

    drive(app, scenario)

    assert f"room {room}" not in seen["before"]
    assert f"room {room}  timeout_transfer  origin" in seen["after"]


def test_a_panel_whose_subject_did_not_change_is_not_redrawn(source: FixtureSource):
    """While the clock moves and other rooms change, a retired room's panel keeps its text: frames come, and the
    panel is not redrawn (no repaint of a subject that did not change)."""
    started = time.monotonic()
    app = make_app(source, clock=lambda: FIXED_NOW + (time.monotonic() - started))
    room = next(iter(source.model.finished))
    seen = {}

    async def scenario(pilot):
        await _open_room(pilot, app, room)
        body, drawn = app.screen.body, app.frames_drawn
        moving = (int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
        _hear(source, "decode", "decode-0", 0, 20_000, RoomState(FIXED_NOW, 4545003, *moving))
        await wait_until(pilot, lambda: app.frames_drawn >= drawn + 3, "three frames drawn with the panel open")
        seen["same"] = app.screen.body is body
        seen["text"] = body.plain

    drive(app, scenario)

    assert seen["same"]
    assert seen["text"].startswith(f"Room {room}\n")


def test_without_a_recording_the_rewind_keys_leave_an_open_panel_as_it_is(app: KvtopApp):
    """The rewind keys pass through an open panel to the dashboard, which judges them: with nothing recorded
    (`--no-record`, SGLang logs) `,` and `[` do nothing, and the panel stays open on the live rank."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        body = app.screen.body.plain
        await pilot.press("comma", "left_square_bracket")
        drawn = app.frames_drawn
        await wait_until(pilot, lambda: app.frames_drawn >= drawn + 2, "two more frames")
        seen["open"] = isinstance(app.screen, DetailScreen)
        seen["live"] = app.frame.replay is None
        seen["same text"] = app.screen.body.plain == body

    drive(app, scenario)
    assert seen == {"open": True, "live": True, "same text": True}
