"""The dashboard's keys and mouse: tabs, view keys, help, themes, pause, list keys, clicks."""

from __future__ import annotations

from textual.events import Key
from tui_support import (
    FixtureSource,
    binding_keys,
    drive,
    focused_id,
    lines,
    make_app,
    next_frame,
    room_ids,
    text,
    wait_until,
)

from kvtop.tui.app import REWIND_ACTIONS, KvtopApp
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.screens.help import HelpScreen
from kvtop.tui.views.failures import FailuresView
from kvtop.tui.widgets.row_list import RowList

FOCUS = {"overview": "ranks-list", "rooms": "rooms-list", "failures": "failure-tree", "events": "events-list"}
"""The widget that takes the keys in each view."""


def row_ids_shown_last(row_list: RowList) -> bool:
    """The list scrolled so that its last row is on screen."""
    return row_list.scroll_offset.y + row_list.scrollable_content_region.height >= row_list.count


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


def test_pause_freezes_the_views_until_pressed_again(source: FixtureSource):
    """`p` shows the PAUSED banner and no frame is drawn, even after an option changes; `p` again resumes."""
    app = make_app(source, refresh_s=0.05)
    seen = {}

    async def scenario(pilot):
        await pilot.press("r", "p")  # the rooms view, where `x` acts
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


def test_help_lists_every_binding_and_escape_closes_it(app: KvtopApp):
    """`?` lists the key and description (the longer tooltip where one is given) of every binding of the app, the
    lists and the failures view; with nothing to rewind into (no recording, as on SGLang logs), not the rewind keys:
    neither `b` and `L` nor the step and origin keys (`,` `.` `<` `>` `[` `]`), which would do nothing."""
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
    rewinds = [
        binding in KvtopApp.BINDINGS and binding.action.partition("(")[0] in REWIND_ACTIONS for binding in bindings
    ]
    assert {",", ".", "<", ">", "[", "]", "b", "L"} <= {
        binding_keys(b) for b, r in zip(bindings, rewinds, strict=True) if r
    }
    assert shown == [not rewind for rewind in rewinds]


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
