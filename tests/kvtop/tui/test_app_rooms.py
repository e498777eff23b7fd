"""The dashboard's rooms view: the filter, faults only, stuck rooms, sorting."""

from __future__ import annotations

from tui_support import (
    FIXED_NOW,
    FixtureSource,
    all_rooms,
    drive,
    focused_id,
    lines,
    make_app,
    next_frame,
    room_ids,
    submit_filter,
    text,
    wait_until,
)

from kvtop.model.cluster import STUCK_AFTER_S, ClusterModel
from kvtop.tui.app import KvtopApp
from kvtop.tui.rows import ROOM_HEADER
from kvtop.tui.widgets.row_list import RowList


def column(rows: list[str], start: int, end: int) -> list[float]:
    return [float(row[start:end]) for row in rows if row.strip()]


AGE, IDLE = (21, 28), (28, 36)
"""Character spans of the AGE s and IDLE s columns of a room row (see `ROOM_HEADER`)."""


def test_filter_by_room_id_shows_that_room_only(app: KvtopApp, source: FixtureSource):
    """`/`, a room id and enter leave one room in the rooms view, named in its title."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        room = room_ids(lines(app.query_one("#rooms-list")))[5]
        await pilot.press("slash")
        seen["box focused"] = focused_id(app)
        await pilot.press(*str(room), "enter")
        await next_frame(pilot)
        seen["count"] = app.query_one("#rooms-list", RowList).count
        seen["rows"] = room_ids(lines(app.query_one("#rooms-list")))
        seen["title"] = text(app, "#rooms-title").split(",")[0]
        seen["focused"] = focused_id(app)
        seen["room"] = room

    drive(app, scenario)

    room = seen["room"]
    assert seen == {
        "box focused": "filter",
        "count": 1,
        "rows": [room],
        "title": f"1 room matching '{room}'",
        "focused": "rooms-list",
        "room": room,
    }


def test_filter_box_recalls_the_last_filter_clears_on_empty_and_closes_on_escape(app: KvtopApp, source: FixtureSource):
    """`/` again offers the filter in force to edit; an empty enter shows every room again; `/` then opens empty,
    the last filter its hint; escape closes the box unchanged."""
    total = len(all_rooms(source))
    seen = []

    async def scenario(pilot):
        box = app.query_one("#filter")
        await pilot.press("r")
        await next_frame(pilot)
        await submit_filter(pilot, "decode-1/TP0")
        await next_frame(pilot)
        filtered = app.query_one("#rooms-list", RowList).count
        await pilot.press("slash")
        seen.append(("recalled", box.value, box.display))
        await pilot.press("home", "ctrl+k", "enter")
        await next_frame(pilot)
        seen.append(("cleared", app.options.filter, app.query_one("#rooms-list", RowList).count, box.display))
        await pilot.press("slash")
        seen.append(("empty after clearing", box.value, box.display, "(last: decode-1/TP0)" in box.placeholder))
        await pilot.press("escape")
        await wait_until(pilot, lambda: focused_id(app) == "rooms-list", "escape hands the keys back to the list")
        seen.append(("escaped", app.options.filter, box.display))
        seen.append(("some rooms matched", 0 < filtered < total))

    drive(app, scenario)

    assert [
        ("recalled", "decode-1/TP0", True),
        ("cleared", "", total, False),
        ("empty after clearing", "", True, True),
        ("escaped", "", False),
        ("some rooms matched", True),
    ] == seen


def test_a_filter_with_square_brackets_is_shown_as_typed():
    """Filter text is data, not markup: `[b]x` and `[/]` show literally in the title and never crash the app."""
    app = make_app(FixtureSource(ClusterModel()))  # empty: a crash's traceback stays short
    seen = []

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        for typed in ("[b]x", "[/]"):
            await submit_filter(pilot, typed)
            await next_frame(pilot)
            seen.append(text(app, "#rooms-title").split(",")[0])

    drive(app, scenario)

    assert seen == ["0 rooms matching '[b]x'", "0 rooms matching '[/]'"]


def test_faults_only_lists_every_failed_or_stuck_room_and_nothing_else(app: KvtopApp, source: FixtureSource):
    """`x` leaves the rooms that failed (a failure group) or are stuck; `x` again shows every room."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r", "x")
        await next_frame(pilot)
        row_list = app.query_one("#rooms-list", RowList)
        seen["count"] = row_list.count
        seen["title"] = text(app, "#rooms-title")
        rows = []
        for _ in range(0, row_list.count, max(1, row_list.size.height)):
            rows += [row for row in lines(row_list) if row.strip()]
            await pilot.press("pagedown")
            await pilot.pause()
        seen["rows"] = rows
        await pilot.press("x")
        await next_frame(pilot)
        seen["count after"] = row_list.count

    drive(app, scenario)

    model = source.model
    faults = {group.room for group in model.groups()} | {room.room for room in model.stuck(FIXED_NOW, STUCK_AFTER_S)}
    assert len(faults) == seen["count"]
    assert faults == set(room_ids(seen["rows"]))
    assert seen["title"].startswith(f"{len(faults)} failed or stuck rooms")
    assert len(all_rooms(source)) == seen["count after"]


def test_a_stuck_room_is_flagged_on_screen(app: KvtopApp, source: FixtureSource):
    """Sorted by idle time the stuck rooms come first, and each of their rows shows STUCK within 140 columns."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r", "s")
        await next_frame(pilot)
        seen["rows"] = lines(app.query_one("#rooms-list"))

    drive(app, scenario)

    stuck = len(source.model.stuck(FIXED_NOW, STUCK_AFTER_S))
    assert stuck > 0
    assert ["STUCK" in row for row in seen["rows"][:stuck]] == [True] * stuck


def test_an_80_column_rooms_view_tells_failed_from_stuck(app: KvtopApp, source: FixtureSource):
    """At 80x24 the FLAG column was past the edge, after the link: faults only listed rooms with nothing telling a
    failed one from a stuck one. Each row now says which, on screen."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r", "x", "s")
        await next_frame(pilot)
        seen["rows"] = [row for row in lines(app.query_one("#rooms-list")) if row.strip()]

    drive(app, scenario, size=(80, 24))

    assert seen["rows"] and all(len(row) <= 80 for row in seen["rows"])
    flag = ROOM_HEADER.index("FLAG")
    flags = [row[flag : flag + 8].strip() for row in seen["rows"]]
    assert set(flags) == {"STUCK", "FAILED"}, flags


def test_sort_cycles_age_idle_bytes_room_and_reorders_the_rows(app: KvtopApp, source: FixtureSource):
    """`s` moves through the orders; each one visibly reorders the rooms as it says."""
    seen = []

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        for _ in range(5):
            seen.append((str(app.options.sort), lines(app.query_one("#rooms-list")), text(app, "#banner")))
            await pilot.press("s")
            await next_frame(pilot)

    drive(app, scenario)

    assert [sort for sort, _, _ in seen] == ["age", "idle", "bytes", "room", "age"]
    assert all(f"sort {sort}" in banner for sort, _, banner in seen)
    by = {sort: rows for sort, rows, _ in seen}
    ids = sorted(all_rooms(source))
    assert ids[: len(room_ids(by["room"]))] == room_ids(by["room"])
    stuck = [row for row in by["idle"] if "STUCK" in row]
    idle = column(stuck, *IDLE)
    assert stuck == by["idle"][: len(stuck)]
    assert sorted(idle, reverse=True) == idle
    assert idle[0] > STUCK_AFTER_S
    assert room_ids(by["age"]) != room_ids(by["idle"]) != room_ids(by["room"])


def test_sort_by_age_lists_the_newest_rooms_first(app: KvtopApp, source: FixtureSource):
    """By age the AGE column grows down the list: rooms ten minutes old are not listed above seconds-old ones."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        seen["rows"] = lines(app.query_one("#rooms-list"))

    drive(app, scenario)

    ages = column(seen["rows"], *AGE)
    newest = min(FIXED_NOW - room.first_seen for room in all_rooms(source).values())
    assert ages == sorted(ages)
    assert round(newest, 1) == ages[0]


def test_a_filter_on_a_failure_class_finds_the_rooms_that_failed_so(app: KvtopApp, source: FixtureSource):
    """`/checksum` in the rooms view lists the rooms whose failures were checksum mismatches, and only those."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        await submit_filter(pilot, "checksum")
        await next_frame(pilot)
        seen["rooms"] = set(room_ids(lines(app.query_one("#rooms-list"))))
        seen["checksum"] = {f.room for f in source.model.failures if f.reason_class == "checksum"}

    drive(app, scenario)

    assert seen["rooms"] and seen["rooms"] <= seen["checksum"]
