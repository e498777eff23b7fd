"""The dashboard driven headless with Textual's pilot: every view, every key, the mouse."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

from textual.events import Key
from tui_support import (
    CLUSTER,
    FIXED_NOW,
    FRAME_TIMEOUT_S,
    SIZE,
    FixtureSource,
    drive,
    lines,
    make_app,
    next_frame,
    submit_filter,
    text,
    wait_until,
)

from kvtop.model.cluster import STUCK_AFTER_S, ClusterModel
from kvtop.tui.app import KvtopApp
from kvtop.tui.frame import INCIDENT_LINES, WINDOW_S
from kvtop.tui.process import SWITCH_INTERVAL_S
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.screens.help import HelpScreen
from kvtop.tui.views.failures import FailuresView
from kvtop.tui.widgets.row_list import RowList
from kvtop.views.event_lines import LEVELS, shown
from kvtop.views.times import stamp
from transport.kvpoll import KVPoll
from transport.plane.events import Failure

FOCUS = {"overview": "ranks-list", "rooms": "rooms-list", "failures": "failure-tree", "events": "events-list"}
"""The widget that takes the keys in each view."""


def all_rooms(source: FixtureSource) -> dict[int, object]:
    """Every room the rooms view can list: retired ones and live ones, by id."""
    model = source.model
    rooms = {room: finished.view for room, finished in model.finished.items() if finished.view is not None}
    return {**rooms, **model.rooms}


def journal_events(source: FixtureSource) -> list[tuple[str, object]]:
    return [(label, event) for label, events in source.model.journal for event in events]


def room_ids(rows: list[str]) -> list[int]:
    """The ROOM column of rendered room rows (blank rows skipped)."""
    return [int(row.split()[0]) for row in rows if row.strip()]


def column(rows: list[str], start: int, end: int) -> list[float]:
    return [float(row[start:end]) for row in rows if row.strip()]


AGE, IDLE = (21, 28), (28, 36)
"""Character spans of the AGE s and IDLE s columns of a room row (see `ROOM_HEADER`)."""


def focused_id(app: KvtopApp) -> str | None:
    return app.focused.id if app.focused is not None else None


def test_the_dashboard_opens_on_the_overview_with_the_rank_list_focused(app: KvtopApp):
    """The first screen is the overview, keys going to its rank list, one row per rank, prefill ranks first."""
    seen = {}

    async def scenario(pilot):
        seen["view"], seen["focused"] = app.active_view, focused_id(app)
        seen["ranks"] = [row.split()[0] for row in lines(app.query_one("#ranks-list")) if row.strip()]

    drive(app, scenario)

    assert {
        "view": "overview",
        "focused": "ranks-list",
        "ranks": CLUSTER.labels("prefill") + CLUSTER.labels("decode"),
    } == seen


def test_the_dashboard_tunes_the_interpreter_while_it_runs_and_restores_it_on_exit(app: KvtopApp):
    """While mounted: the GIL switch interval is the dashboard's, the interpreter's own collections are off (the
    dashboard collects between frames) and what was alive at mount is frozen; the process's settings after."""
    before = (gc.isenabled(), sys.getswitchinterval(), gc.get_freeze_count())
    seen = {}

    async def scenario(pilot):
        seen["running"] = (gc.isenabled(), sys.getswitchinterval(), gc.get_freeze_count() > 0)
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle: only a collection frees it
        probe = weakref.ref(_Probe(garbage))
        del garbage
        await wait_until(pilot, lambda: probe() is None, "a cycle collected by a refresh")
        seen["collected"] = True

    drive(app, scenario)

    assert seen["running"] == (False, SWITCH_INTERVAL_S, True)
    assert seen["collected"]
    assert (gc.isenabled(), sys.getswitchinterval(), gc.get_freeze_count()) == before


class _Probe:
    """An object in a reference cycle (through `ring`), watched by a weak reference."""

    def __init__(self, ring: list[object]) -> None:
        ring.append(self)


def test_each_tab_names_its_key(app: KvtopApp):
    """The tabs read `Overview [o]`, `Rooms [r]`, `Failures [f]`, `Events [e]`."""
    seen = {}

    async def scenario(pilot):
        seen["tabs"] = [text(app, f"Tab#{view}").strip() for view in FOCUS]

    drive(app, scenario)

    assert seen["tabs"] == ["Overview [o]", "Rooms [r]", "Failures [f]", "Events [e]"]


def test_view_keys_show_their_view_and_focus_its_list(app: KvtopApp):
    """o r f e and their aliases 1 2 3 4 each show one view and hand the keys to its list."""
    keys = {"r": "rooms", "f": "failures", "e": "events", "o": "overview", "2": "rooms", "3": "failures"}
    keys |= {"4": "events", "1": "overview"}
    seen = []

    async def scenario(pilot):
        for key, view in keys.items():
            await pilot.press(key)
            await wait_until(pilot, lambda view=view: focused_id(app) == FOCUS[view], f"{key} focuses {view}")
            seen.append((key, app.active_view, focused_id(app)))

    drive(app, scenario)

    assert [(key, view, FOCUS[view]) for key, view in keys.items()] == seen


def test_the_health_line_counts_what_the_model_holds(app: KvtopApp, source: FixtureSource):
    """Ranks alive, failure origins, open and stuck rooms on the health line are the model's own counts."""
    seen = {}

    async def scenario(pilot):
        seen["health"] = text(app, "#health")

    drive(app, scenario)

    model = source.model
    origins = len(model.groups(FIXED_NOW, WINDOW_S))
    ongoing = sum(i.ongoing(FIXED_NOW) and not i.client for i in model.incidents.incidents.values())
    health = seen["health"]
    assert health.startswith(f" {ongoing} incident{'' if ongoing == 1 else 's'} ongoing ")
    assert f"{len(model.ranks)}/{len(model.ranks)} ranks alive" in health
    assert f"in {WINDOW_S:g} s ({origins} origins)" in health
    assert f"{len(model.open_rooms(FIXED_NOW))} open" in health
    assert f"{len(model.stuck(FIXED_NOW, STUCK_AFTER_S))} stuck" in health
    assert origins > 0


def test_the_overview_lists_the_ongoing_incidents_with_their_rooms_and_start(app: KvtopApp, source: FixtureSource):
    """The overview's incidents panel is the model's ongoing cluster incidents, latest to grow first: rooms,
    what broke, since when."""
    seen = {}

    async def scenario(pilot):
        seen["incidents"] = [line.strip() for line in lines(app.query_one("#incidents")) if line.strip()]

    drive(app, scenario)

    ongoing = [i for i in source.model.incidents.newest_first() if i.ongoing(FIXED_NOW) and not i.client]
    assert 2 <= len(ongoing) <= INCIDENT_LINES // 2  # the synthetic cluster's corrupting prefill ranks
    expected = []
    for incident in ongoing:
        since = stamp(incident.first_seen)[:-4]
        what = incident.headline().removeprefix(incident.suspect.text).strip()
        expected += [f"{incident.room_count}  {incident.suspect.text}  since {since}", what]
    assert seen["incidents"] == expected


def test_the_overview_draws_the_link_heat_map(app: KvtopApp, source: FixtureSource):
    """Every prefill x decode pair the model knows has a cell, with its failed rooms."""
    seen = {}

    async def scenario(pilot):
        seen["links"] = text(app, "#links")

    drive(app, scenario)

    heat_map = seen["links"]
    for (prefill, decode), link in source.model.links.items():
        assert prefill in heat_map and decode in heat_map
        assert f"✗{link.failed_rooms}" in heat_map


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
        "title": f"1 rooms matching '{room}'",
        "focused": "rooms-list",
        "room": room,
    }


def test_filter_box_recalls_the_last_filter_clears_on_empty_and_closes_on_escape(app: KvtopApp, source: FixtureSource):
    """`/` again offers the last filter; an empty enter shows every room again; escape closes the box unchanged."""
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
        seen.append(("recalled after clearing", box.value, box.display))
        await pilot.press("escape")
        await wait_until(pilot, lambda: focused_id(app) == "rooms-list", "escape hands the keys back to the list")
        seen.append(("escaped", app.options.filter, box.display))
        seen.append(("some rooms matched", 0 < filtered < total))

    drive(app, scenario)

    assert [
        ("recalled", "decode-1/TP0", True),
        ("cleared", "", total, False),
        ("recalled after clearing", "decode-1/TP0", True),
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


def test_pause_freezes_the_views_until_pressed_again(source: FixtureSource):
    """`p` shows the PAUSED banner and no frame is drawn, even after an option changes; `p` again resumes."""
    app = make_app(source, refresh_s=0.05)
    seen = {}

    async def scenario(pilot):
        await pilot.press("p")
        await pilot.pause()
        seen["banner"] = text(app, "#banner")
        seen["paused class"] = app.query_one("#banner").has_class("paused")
        drawn = app.frames_drawn
        await pilot.press("x")
        app.request_frame()
        await pilot.pause(0.3)  # six refresh periods: nothing may be drawn in them
        seen["drawn while paused"] = app.frames_drawn - drawn
        await pilot.press("p")
        await wait_until(pilot, lambda: app.frames_drawn > drawn, "a frame after resuming")
        seen["banner after"] = text(app, "#banner")
        seen["paused class after"] = app.query_one("#banner").has_class("paused")

    drive(app, scenario)

    assert "PAUSED" in seen.pop("banner")
    assert "PAUSED" not in seen.pop("banner after")
    assert seen == {"paused class": True, "drawn while paused": 0, "paused class after": False}


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


def test_debug_in_the_events_view_shows_echoes_and_room_traffic(app: KvtopApp, source: FixtureSource):
    """Echoes are hidden at the info level; `d` shows every event, echoes included, and `d` again hides them."""
    seen = {}

    async def scenario(pilot):
        tail = app.query_one("#events-list", RowList)
        await pilot.press("e")
        await submit_filter(pilot, "echo of")
        await next_frame(pilot)
        seen["echoes at info"] = tail.count
        await pilot.press("d")
        await next_frame(pilot)
        seen["echoes at debug"] = tail.count
        seen["echo rows"] = [row for row in lines(tail) if row.strip()]
        await submit_filter(pilot, "")
        await next_frame(pilot)
        seen["debug"] = (app.options.level, tail.count, text(app, "#events-title"))
        await pilot.press("d")
        await next_frame(pilot)
        seen["info"] = (app.options.level, tail.count, text(app, "#events-title"))

    drive(app, scenario)

    events = journal_events(source)
    echoes = [e for _, e in events if isinstance(e, Failure) and e.origin != e.rank]
    at_info = sum(shown(e, "info") for _, e in events)
    assert (seen["echoes at info"], seen["echoes at debug"]) == (0, len(echoes))
    assert all(" DEBUG   failure " in row for row in seen["echo rows"])
    assert seen["debug"] == ("debug", len(events), f"{len(events):,} events at debug and above  (l: level)")
    assert seen["info"] == (
        "info",
        at_info,
        f"{at_info:,} events at info and above, echoes hidden (d shows them)  (l: level)",
    )
    assert 0 < len(echoes) < at_info < len(events)


def test_level_key_cycles_the_lowest_event_level(app: KvtopApp, source: FixtureSource):
    """`l` goes info, warning, error, debug, info; the events view counts exactly the events at or above it."""
    seen = []

    async def scenario(pilot):
        await pilot.press("e")
        await next_frame(pilot)
        for _ in range(5):
            seen.append((app.options.level, app.query_one("#events-list", RowList).count, text(app, "#banner")))
            await pilot.press("l")
            await next_frame(pilot)

    drive(app, scenario)

    events = journal_events(source)
    levels = ["info", "warning", "error", "debug", "info"]
    assert [(level, sum(shown(e, level) for _, e in events)) for level in levels] == [(lv, n) for lv, n, _ in seen]
    assert all(f"events >= {level}" in banner for level, _, banner in seen)
    assert set(LEVELS) == set(levels)


def test_debug_in_the_failures_view_toggles_the_detail_of_the_highlighted_row(app: KvtopApp):
    """`d` opens the detail pane on the highlighted incident (its suspect and evidence), then on a group (its room,
    origin and raw event) as the cursor moves; `d` again hides it."""
    seen = {}

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await pilot.press("f")
        await next_frame(pilot)
        seen["incident"] = view.highlighted.incident
        await pilot.press("d")
        await pilot.pause()
        seen["shown"] = app.query_one("#failure-detail").display
        seen["incident detail"] = text(app, "#failure-detail-text")
        await pilot.press("enter", "down")
        await pilot.pause()
        seen["detail"] = text(app, "#failure-detail-text")
        seen["group"] = view.highlighted.group
        await pilot.press("down")
        await pilot.pause()
        seen["next detail"] = text(app, "#failure-detail-text")
        seen["next group"] = view.highlighted.group
        await pilot.press("d")
        await pilot.pause()
        seen["shown after"] = app.query_one("#failure-detail").display

    drive(app, scenario)

    group, detail, incident = seen["group"], seen["detail"], seen["incident"]
    assert (seen["shown"], seen["shown after"]) == (True, False)
    assert seen["incident detail"].startswith(f"{incident.headline}\nongoing, ")
    assert f"Suspect\n  {incident.suspect}\n  {incident.evidence[0]}" in seen["incident detail"]
    assert detail.startswith(f"Room {group.room}: origin {group.origin_label}")
    assert "Raw origin event" in detail
    assert group.origin.reason in detail
    assert seen["next group"] is not group
    assert seen["next detail"].startswith(f"Room {seen['next group'].room}: origin {seen['next group'].origin_label}")


def test_theme_key_cycles_every_theme_and_recolours_the_rows(app: KvtopApp):
    """`t` moves through the themes kvtop found in name order; the row palette follows the theme."""
    seen = []

    async def scenario(pilot):
        for _ in range(4):
            await pilot.press("t")
            await pilot.pause()
            seen.append((app.theme, app.palette.error.color.triplet.hex, app.current_theme.error.lower()))

    drive(app, scenario)

    assert [name for name, _, _ in seen] == ["kvtop-high-contrast", "kvtop-light", "kvtop-colorblind", "kvtop-dark"]
    assert [theme_error for _, _, theme_error in seen] == [palette_error for _, palette_error, _ in seen]


def binding_keys(binding) -> str:
    names = {"question_mark": "?", "slash": "/", "comma": ",", "full_stop": ".", "less_than_sign": "<",
             "greater_than_sign": ">", "left_square_bracket": "[", "right_square_bracket": "]"}  # fmt: skip
    return " / ".join(names.get(key, key) for key in binding.key.split(","))


def test_help_lists_every_binding_and_escape_closes_it(app: KvtopApp):
    """`?` lists the key and description (the longer tooltip where one is given) of every binding of the app, the
    lists and the failures view."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        seen["help"] = [line.rstrip() for static in app.screen.query("Static") for line in lines(static)]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), "escape closes the help")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen again")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), "? closes the help too")

    drive(app, scenario)

    rows = {tuple(line.split()) for line in seen["help"]}
    bindings = [*KvtopApp.BINDINGS, *RowList.BINDINGS, *FailuresView.BINDINGS]
    shown = [
        (*binding_keys(binding).split(), *(binding.tooltip or binding.description).split()) in rows
        for binding in bindings
    ]
    assert shown == [True] * len(bindings)


def test_help_names_every_key_of_a_binding(app: KvtopApp):
    """A binding with two keys (o and 1) shows both in the help, so the digit aliases can be learnt there."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        seen["help"] = [line.strip() for static in app.screen.query("Static") for line in lines(static)]

    drive(app, scenario)

    overview = next(line for line in seen["help"] if line.endswith("Overview"))
    assert {"o", "1"} <= set(overview.replace("/", " ").split())


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


def model_group(source: FixtureSource, shown):
    """The model's own fold of the group a row of the failures view shows."""
    return next(g for g in source.model.groups() if (g.room, g.origin_label) == (shown.room, shown.origin_label))


def test_enter_expands_an_incident_into_its_groups_and_a_group_into_its_echoes(app: KvtopApp, source: FixtureSource):
    """The failures view leads with incidents: enter on the first shows exactly its failure groups under it,
    enter on a group its echoes under that; enter again folds the group."""
    seen = {}

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await pilot.press("f")
        await next_frame(pilot)
        seen["incident"] = view.highlighted.incident
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        seen["group"] = view.highlighted.group
        seen["groups"] = [row.group for row in view.rows if row.group is not None and row.echo is None]
        seen["rows"] = [row.strip() for row in lines(app.query_one("#failure-tree")) if row.strip()]
        seen["echoes"] = [row.echo for row in view.rows if row.group is seen["group"] and row.echo is not None]
        await pilot.press("enter")
        await pilot.pause()
        seen["rows folded"] = [row.strip() for row in lines(app.query_one("#failure-tree")) if row.strip()]

    drive(app, scenario)

    incident = source.model.incidents.incidents[seen["incident"].id]
    group = model_group(source, seen["group"])
    echo_rows = [row for row in seen["rows"] if row.startswith("└ echo ")]
    assert sorted(g.room for g in seen["groups"]) == sorted(incident.rooms)
    assert group.echo_count > 0 and seen["echoes"] == group.echoes
    assert sorted(row.split()[2] for row in echo_rows) == sorted(echo.rank for echo in group.echoes)
    assert seen["rows"][0].startswith(f"▼ ONGOING  {incident.headline()}  {incident.room_count} rooms")
    assert seen["rows"][1].startswith(f"▼ room {group.room} ")
    assert seen["rows"][2 : 2 + group.echo_count] == echo_rows
    assert seen["rows folded"][1].startswith(f"▶ room {group.room} ")
    assert not any(row.startswith("└ echo ") for row in seen["rows folded"])


def test_a_key_typed_right_after_the_view_key_goes_to_the_new_view(app: KvtopApp):
    """`f` then `enter` at once, as a quick hand types them: the enter expands the failures view's first incident
    (the view's list has focus before the next key, not after the next refresh)."""
    seen = {}

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await next_frame(pilot)
        for key, character in (("f", "f"), ("enter", "\r")):  # one read from the terminal: no wait between them
            app.post_message(Key(key, character))
        await pilot.pause()
        seen["focused"] = app.focused is app.query_one("#failure-tree", RowList)
        seen["opened"] = set(view.open_incidents)
        seen["incident"] = view.highlighted.incident

    drive(app, scenario)

    assert seen["focused"]
    assert seen["opened"] == {seen["incident"].id}


def test_a_group_whose_origin_comes_after_its_echo_stays_open_under_the_cursor(app: KvtopApp, source: FixtureSource):
    """Ranks' events reach the collector in any order: a group first seen by its echo, expanded, then joined by
    its origin (which moves the group's time, and its incident: the origin names the rank that broke) stays
    expanded with the cursor on it, in its new incident, opened for it."""
    from transport.plane.events import EVENT_SCHEMA, EventBatch

    room, origin = 4343001, "decode-0/TP0"
    echo = Failure(
        FIXED_NOW, room, "prefill-0/TP0", f"Aborted by decode peer {origin}", "propagated", "warning", False, origin
    )
    first = Failure(FIXED_NOW - 0.001, room, origin, "KV chunk 0 failed its checksum", "checksum", "error", False,
                    origin, "prefill-1/TP1")  # fmt: skip
    seen = {}

    def hear(instance: str, role: str, *failures: Failure) -> None:
        with source.lock:
            batch = EventBatch(EVENT_SCHEMA, role, instance, 0, 1, 30_000, FIXED_NOW, list(failures))
            source.model.apply(failures[0].rank, batch, FIXED_NOW)
            for _ in range(2):  # an echo alone waits one sweep for its origin, then joins an incident
                source.model.sweep(FIXED_NOW)

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        hear("prefill-0", "prefill", echo)
        await pilot.press("f")
        await next_frame(pilot)
        row = next(i for i, row in enumerate(view.rows) if row.incident.id == incident_of(source, room))
        app.query_one("#failure-tree", RowList).cursor = row
        await pilot.press("enter")
        await pilot.pause()
        row = next(i for i, row in enumerate(view.rows) if row.group is not None and row.group.room == room)
        app.query_one("#failure-tree", RowList).cursor = row
        await pilot.press("enter")
        await pilot.pause()
        seen["before"] = view.highlighted.group
        hear("decode-0", "decode", first)
        await next_frame(pilot)
        seen["after"] = view.highlighted
        seen["rows"] = [row.strip() for row in lines(app.query_one("#failure-tree")) if row.strip()]

    drive(app, scenario)

    after = seen["after"]
    assert (seen["before"].room, seen["before"].origin) == (room, None)
    assert (after.group.room, after.group.origin_label, after.group.origin.ts) == (room, origin, first.ts)
    assert after.incident.id == incident_of(source, room) and after.incident.suspect == "prefill-1/TP1"
    assert any(row.startswith(f"▼ room {room} ") for row in seen["rows"])
    assert any(row.startswith("└ echo prefill-0/TP0") for row in seen["rows"])


def incident_of(source: FixtureSource, room: int) -> int:
    with source.lock:
        group = next(g for g in source.model.groups() if g.room == room)
        return source.model.incidents.incident_of(group).id


def test_space_and_right_toggle_an_incident_and_left_folds_it(app: KvtopApp):
    """The tree keys of the failures view: space and right expand (or collapse), left collapses."""
    seen = []

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await pilot.press("f")
        await next_frame(pilot)
        for key in ("space", "space", "right", "left", "left"):
            await pilot.press(key)
            await pilot.pause()
            seen.append((key, sum(row.group is not None for row in view.rows)))

    drive(app, scenario)

    groups = seen[0][1]
    assert groups > 0
    assert seen == [("space", groups), ("space", 0), ("right", groups), ("left", 0), ("left", 0)]


def test_left_goes_back_up_a_level_from_an_echo_and_from_a_group(app: KvtopApp):
    """Collapsing from an echo puts the cursor on its group; from a group, on its incident, as the view's key
    table says."""
    seen = {}

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await pilot.press("f")
        await next_frame(pilot)
        await pilot.press("enter", "down")
        seen["group"] = view.highlighted.group
        await pilot.press("enter", "down")
        await pilot.pause()
        seen["on an echo"] = view.highlighted.echo is not None
        await pilot.press("left")
        await pilot.pause()
        seen["cursor"] = app.query_one("#failure-tree", RowList).cursor
        seen["after"] = view.highlighted
        await pilot.press("left")
        await pilot.pause()
        seen["then"] = (app.query_one("#failure-tree", RowList).cursor, view.highlighted.group, view.open_incidents)

    drive(app, scenario)

    assert seen["on an echo"]
    assert (seen["cursor"], seen["after"].group, seen["after"].echo) == (1, seen["group"], None)
    assert seen["then"] == (0, None, set())


def test_list_keys_move_the_cursor(app: KvtopApp):
    """up/down move a row, pageup/pagedown a page, home/end to the ends; the cursor never leaves the list."""
    seen = []

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        row_list = app.query_one("#rooms-list", RowList)
        seen.append(("page", row_list.scrollable_content_region.height - 1, row_list.count))
        for key in ("up", "down", "down", "up", "pagedown", "pagedown", "pageup", "end", "down", "home"):
            await pilot.press(key)
            await pilot.pause()
            seen.append((key, row_list.cursor))
        await pilot.press("end")
        await pilot.pause()
        seen.append(("last row shown", row_ids_shown_last(row_list)))

    drive(app, scenario)

    _, page, count = seen[0]
    assert [
        ("up", 0),
        ("down", 1),
        ("down", 2),
        ("up", 1),
        ("pagedown", 1 + page),
        ("pagedown", 1 + 2 * page),
        ("pageup", 1 + page),
        ("end", count - 1),
        ("down", count - 1),
        ("home", 0),
        ("last row shown", True),
    ] == seen[1:]


def row_ids_shown_last(row_list: RowList) -> bool:
    """The list scrolled so that its last row is on screen."""
    return row_list.scroll_offset.y + row_list.scrollable_content_region.height >= row_list.count


def test_clicking_a_tab_switches_the_view_and_clicking_a_row_moves_the_cursor(app: KvtopApp):
    """A click on the Rooms tab shows the rooms; a click on a row highlights it, a second click opens it."""
    seen = {}

    async def scenario(pilot):
        await pilot.click("Tab#rooms")
        await next_frame(pilot)
        seen["view"] = app.active_view
        await pilot.click("#rooms-list", offset=(3, 4))
        await pilot.pause()
        seen["cursor"] = app.query_one("#rooms-list", RowList).cursor
        seen["room"] = room_ids(lines(app.query_one("#rooms-list")))[4]
        await pilot.click("#rooms-list", offset=(3, 4))
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "a second click opens the room")
        seen["opened"] = app.screen.body.plain.splitlines()[0]
        await pilot.press("escape")
        await pilot.click("Tab#failures")
        await next_frame(pilot)
        seen["then"] = app.active_view

    drive(app, scenario)

    room = seen["room"]
    assert seen == {"view": "rooms", "cursor": 4, "room": room, "opened": f"Room {room}", "then": "failures"}


def test_q_quits(app: KvtopApp):
    """`q` ends the app."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, "the app quits")
        seen["running"] = app.is_running

    drive(app, scenario)

    assert seen == {"running": False}


def test_a_key_pressed_while_a_frame_is_built_still_reaches_the_screen(source: FixtureSource):
    """`x` pressed while the worker builds a frame from the old options gets a frame of its own, timer or not."""
    building, release = threading.Event(), threading.Event()
    hold = []

    def clock() -> float:
        if hold:  # the worker has read the options; it now stalls as it would on a big model
            building.set()
            release.wait(FRAME_TIMEOUT_S)
        return FIXED_NOW

    app = make_app(source, refresh_s=3600, clock=clock)
    seen = {}

    async def scenario(pilot):
        await pilot.press("r")
        await next_frame(pilot)
        hold.append(True)
        app.request_frame()
        await wait_until(pilot, building.is_set, "the worker building a frame")
        await pilot.press("x")
        hold.clear()
        release.set()
        try:
            await wait_until(pilot, lambda: app.frame.options.faults_only, "a faults-only frame", timeout=1.0)
        finally:
            seen["title"] = text(app, "#rooms-title")

    drive(app, scenario)

    assert "failed or stuck rooms" in seen["title"]


def test_no_frame_is_built_while_the_last_one_is_painted(source: FixtureSource):
    """A frame asked for while the last one is painted is built after the paint: the two never share the GIL."""
    builds: list[float] = []

    def clock() -> float:
        builds.append(time.monotonic())
        return FIXED_NOW

    app = make_app(source, refresh_s=0.005, clock=clock)

    async def scenario(pilot):
        await wait_until(pilot, lambda: app.frames_drawn >= 20, "20 frames")

    drive(app, scenario)

    paints = [(painted - seconds, painted) for painted, seconds, _ in app.draws]
    assert len(paints) >= 20
    assert [b for b in builds if any(start < b < end for start, end in paints)] == []


def test_the_events_view_survives_hostile_events_and_counts_them(app: KvtopApp, source: FixtureSource):
    """A state of 7 and a NaN time reach the model by a path no decoder guards: counted, skipped, still drawn."""
    from transport.plane.events import EVENT_SCHEMA, EventBatch, RoomState

    hostile = [RoomState(float("nan"), 4242901, int(KVPoll.Transferring), 2), RoomState(FIXED_NOW, 4242902, 7, 0)]
    sound = RoomState(FIXED_NOW, 4242903, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
    seen = {}

    async def scenario(pilot):
        with source.lock:
            batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 10_000, FIXED_NOW, [*hostile, sound])
            source.model.apply("decode-0/TP0", batch, FIXED_NOW)
        await pilot.press("e", "d")
        await submit_filter(pilot, "room=42429")
        await next_frame(pilot)
        seen["rows"] = [row for row in lines(app.query_one("#events-list", RowList)) if row.strip()]
        seen["health"] = text(app, "#health")
        seen["running"] = app.is_running

    drive(app, scenario)

    assert seen["running"]
    assert [row.split("room=")[1].split()[0] for row in seen["rows"]] == ["4242903"]
    assert "2 rejected" in seen["health"]


class _BrokenLock:
    """A lock whose holder fails: every frame build raises."""

    def __enter__(self) -> None:
        raise RuntimeError("the model is gone")

    def __exit__(self, *_: object) -> None:
        return None


def test_a_dashboard_whose_frames_fail_exits_1_with_one_line(monkeypatch, capsys):
    """A frame that cannot be built ends the dashboard (no frozen screen) with exit 1 and one stderr line."""
    import functools

    import pytest
    import typer

    from kvtop.cli.top_cmd import run_dashboard
    from kvtop.tui.themes import load_themes

    monkeypatch.setattr(KvtopApp, "run", functools.partialmethod(KvtopApp.run, headless=True))
    source = FixtureSource(ClusterModel(), lock=_BrokenLock())  # type: ignore[arg-type]

    with pytest.raises(typer.Exit) as ended:
        run_dashboard(source, "broken", load_themes(), "kvtop-dark", quit_after=30)

    assert ended.value.exit_code == 1
    assert capsys.readouterr().err.splitlines() == ["kvtop: the dashboard failed: RuntimeError('the model is gone')"]
