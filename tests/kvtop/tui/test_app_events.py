"""The dashboard's events view: debug lines, the level key, hostile events."""

from __future__ import annotations

import re
from dataclasses import replace

from tui_support import (
    CLUSTER,
    FIXED_NOW,
    FixtureSource,
    PagedFrames,
    drive,
    journal_events,
    lines,
    make_app,
    next_frame,
    submit_filter,
    text,
)

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.tui.app import KvtopApp
from kvtop.tui.frame import EVENTS_SHOWN, RoomSort
from kvtop.tui.widgets.row_list import RowList
from kvtop.views.event_lines import LEVELS, shown, to_line
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, RoomState


def test_debug_in_the_events_view_shows_echoes_and_room_traffic(app: KvtopApp, source: FixtureSource):
    """Echoes are hidden at the info level; `l` steps down to debug and shows every event, echoes included; round
    the cycle (warning, error) back at info they are hidden again."""
    seen = {}

    async def scenario(pilot):
        tail = app.query_one("#events-list", RowList)
        await pilot.press("e")
        await submit_filter(pilot, "echo of")
        await next_frame(pilot)
        seen["echoes at info"] = tail.count
        await pilot.press("l")
        await next_frame(pilot)
        seen["echoes at debug"] = tail.count
        seen["echo rows"] = [row for row in lines(tail) if row.strip()]
        await submit_filter(pilot, "")
        await next_frame(pilot)
        seen["debug"] = (app.options.level, tail.count, text(app, "#events-title"))
        await pilot.press("l", "l", "l")
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
        f"{at_info:,} events at info and above, echoes hidden  (l: level, debug shows echoes)",
    )
    assert echoes and 0 < at_info < len(events)


def test_a_view_s_own_keys_mean_one_thing_each_and_show_only_where_they_act(app: KvtopApp):
    """`x` and `s` are the rooms view's faults only and order, `d` the failures view's detail pane, `l` the events
    view's level: each is in the footer of its own view only, and pressed elsewhere changes nothing (`x` and `s`
    were in every view's footer, and elsewhere changed only a flag in the banner)."""
    seen: dict[str, object] = {}
    shown: dict[str, set[str]] = {}

    async def scenario(pilot):
        pane = app.query_one("#failure-detail")
        for view in ("o", "r", "f", "e"):
            await pilot.press(view)
            await pilot.pause()
            active = {binding.key for _, binding, on, _ in app.active_bindings.values() if on}
            shown[view] = {"x", "s", "d", "l"} & active
        await pilot.press("e", "d")
        seen["d in events"] = (pane.display, app.options.level)
        await pilot.press("f", "l")
        seen["l in failures"] = app.options.level
        await pilot.press("d")
        seen["d in failures"] = pane.display
        await pilot.press("o", "x", "s", "f", "x", "s", "e", "x", "s")
        seen["x, s elsewhere"] = (app.options.faults_only, app.options.sort)
        await pilot.press("r", "x", "s")
        seen["x, s in rooms"] = (app.options.faults_only, app.options.sort)

    drive(app, scenario)

    assert shown == {"o": set(), "r": {"x", "s"}, "f": {"d"}, "e": {"l"}}
    assert seen["d in events"] == (False, "info")
    assert seen["l in failures"] == "info"
    assert seen["d in failures"] is True
    assert seen["x, s elsewhere"] == (False, RoomSort.AGE)
    assert seen["x, s in rooms"] == (True, RoomSort.IDLE)


def test_level_key_cycles_the_lowest_event_level(app: KvtopApp, source: FixtureSource):
    """`l` goes info, debug, warning, error, info; the events view counts exactly the events at or above it."""
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
    levels = ["info", "debug", "warning", "error", "info"]
    assert [(level, sum(shown(e, level) for _, e in events)) for level in levels] == [(lv, n) for lv, n, _ in seen]
    assert all(f"events >= {level}" in banner for level, _, banner in seen)
    assert set(LEVELS) == set(levels)


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
        await pilot.press("e", "l")
        await submit_filter(pilot, "room=42429")
        await next_frame(pilot)
        seen["rows"] = [row for row in lines(app.query_one("#events-list", RowList)) if row.strip()]
        seen["health"] = text(app, "#health")
        seen["running"] = app.is_running

    drive(app, scenario)

    assert seen["running"]
    assert [row.split("room=")[1].split()[0] for row in seen["rows"]] == ["4242903"]
    assert "2 rejected" in seen["health"]


def test_a_full_event_tail_shows_its_rows_after_the_level_steps_down():
    """Eight hellos at info fit the screen; `l` to debug brings a tail at its cap, whose row count then never
    changes: the list follows it to its newest row at once (its scrollbar appears with it), and the rows
    there arrive in the next frames, not `…` for good."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    quiet = replace(CLUSTER, failure_rate=0.0, open_rate=0.0)
    for label, batch in quiet.hello() + quiet.rooms(1500):
        model.apply(label, batch, FIXED_NOW - 1.0)
    app = make_app(PagedFrames(FixtureSource(model), lambda: FIXED_NOW))
    seen = {}

    async def scenario(pilot):
        rows = app.query_one("#events-list", RowList)
        await pilot.press("e")
        await next_frame(pilot)
        seen["info"] = rows.count
        await pilot.press("l")
        for _ in range(3):
            await next_frame(pilot)
        seen["debug"] = (rows.count, rows.cursor, rows.scroll_offset.y + rows.size.height, lines(rows))

    drive(app, scenario)

    count, cursor, below, shown = seen["debug"]
    assert all(" DEBUG " in row or " INFO " in row for row in shown), shown
    assert (seen["info"], count, cursor, below) == (8, EVENTS_SHOWN, EVENTS_SHOWN - 1, EVENTS_SHOWN)


def test_the_events_view_lists_events_in_time_order_not_in_the_order_they_arrived(app: KvtopApp, source: FixtureSource):
    """The fixture's ten-minute-old rooms arrive last, as a restarted collector's first snapshot brings an agent's
    past after the others' live batches: they were listed below newer events, times jumping back and forth. Every
    row is at or after the one above it, at info and at debug, and a batch older than the tail's newest event lands
    in its place."""
    late = RoomState(CLUSTER.start + 1.0, 4242904, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
    seen: dict[str, list[str]] = {}

    def stamps(rows: list[str]) -> list[str]:
        return [_when(row) for row in rows if row.strip()]

    async def scenario(pilot):
        tail = app.query_one("#events-list", RowList)
        await pilot.press("e")
        await next_frame(pilot)
        seen["info"] = [to_line(*shown) for shown in app.frame.events]
        seen["info rows"] = stamps(lines(tail))
        await pilot.press("l")
        await next_frame(pilot)
        with source.lock:
            batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 10_000, FIXED_NOW, [late])
            source.model.apply("decode-0/TP0", batch, FIXED_NOW)
        await next_frame(pilot)
        seen["debug"] = [to_line(*shown) for shown in app.frame.events]
        seen["debug rows"] = stamps(lines(tail))

    drive(app, scenario)

    events = journal_events(source)
    assert len(seen["info"]) == sum(shown(e, "info") for _, e in events) and len(seen["debug"]) == len(events)
    for name, lines_seen in seen.items():
        assert lines_seen == sorted(lines_seen, key=_when), name
    assert any("room=4242904" in line for line in seen["debug"][:-1])  # not at the end, where it arrived


def _when(line: str) -> str:
    """An event line's time (`2026-11-30 12:01:22.123`, or `12:01:22.123` where the list leaves the day out)."""
    stamp = re.match(r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d\.\d{3}", line)
    assert stamp is not None, line
    return stamp.group()


def test_the_events_view_leaves_the_date_out_while_every_line_is_of_one_day(app: KvtopApp, source: FixtureSource):
    """At 80 columns the date, rank, level and kind left a line ~20 columns of what happened; a tail whose lines
    and now fall on one day shows the time alone, and once a line of another day is in it every line is dated."""
    yesterday = RoomState(FIXED_NOW - 86_400 * 2, 4242905, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
    seen: dict[str, list[str]] = {}

    async def scenario(pilot):
        tail = app.query_one("#events-list", RowList)
        await pilot.press("e", "l")
        await next_frame(pilot)
        seen["one day"] = [row for row in lines(tail) if row.strip()]
        with source.lock:
            batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 10_001, FIXED_NOW, [yesterday])
            source.model.apply("decode-0/TP0", batch, FIXED_NOW)
        await next_frame(pilot)
        seen["two days"] = [row for row in lines(tail) if row.strip()]

    drive(app, scenario)

    assert seen["one day"] and all(re.match(r"\d\d:\d\d:\d\d\.\d{3} ", row) for row in seen["one day"])
    assert seen["two days"] and all(re.match(r"\d{4}-\d\d-\d\d \d\d:", row) for row in seen["two days"])


def test_at_80_columns_a_failure_line_keeps_its_class(app: KvtopApp, source: FixtureSource):
    """At 80 columns the time, rank, level and kind columns left a failure line 8 cells of its text: `room=...
    timeo…`, the class cut. Under 100 columns the level is one letter and the kind leaves (the text says it), so
    the room and its class show; wide, the line is the line views' own."""
    failures = [(label, e) for label, e in journal_events(source) if isinstance(e, Failure) and e.origin == e.rank]
    seen: dict[int, list[str]] = {}

    async def scenario(pilot):
        await pilot.press("e", "l", "l", "l")  # error and above: the failure groups' lines
        await next_frame(pilot)
        tail = pilot.app.query_one("#events-list", RowList)
        seen[pilot.app.size.width] = [row for row in lines(tail) if row.strip()]

    drive(app, scenario, size=(80, 24))
    wide = make_app(source)
    drive(wide, scenario, size=(140, 40))

    classes = {e.reason_class for _, e in failures}
    narrow_rows, wide_rows = seen[80], seen[140]
    assert narrow_rows and all(re.search(r" E room=\d+ (\w+):", row) for row in narrow_rows), narrow_rows
    assert {re.search(r" E room=\d+ (\w+):", row).group(1) for row in narrow_rows} <= classes  # type: ignore[union-attr]
    assert all(" ERROR   failure   room=" in row for row in wide_rows), wide_rows


def test_the_banner_at_120_columns_keeps_the_options_whole_and_cuts_the_source_after_its_address():
    """Bare `kvtop` at 120 columns showed `bootstrap tcp://..., embedded cluster 2P2D TP2, 20 rooms/s   […`: its
    long source took the room and the option list was cut to `[…` (a filter could hide rows unseen). The source
    is cut now, after its address; the options stay whole."""
    app = make_app()
    app.sub_title = "bootstrap tcp://127.0.0.1:41234, embedded cluster 2P2D TP2, 20 rooms/s"
    seen = {}

    async def scenario(pilot):
        seen["banner"] = text(app, "#banner")
        await submit_filter(pilot, "decode-1")
        await next_frame(pilot)
        seen["filtered"] = text(app, "#banner")

    drive(app, scenario, size=(120, 36))

    banner, filtered = seen["banner"], seen["filtered"]
    assert "bootstrap tcp://127.0.0.1:41234, embedded clu…   [sort age, events >= info]   as of " in banner, banner
    assert "bootstrap tcp://127.0.0.1:41234, …   [filter 'decode-1', sort age, " in filtered, filtered
    assert banner.rstrip().endswith("? help") and filtered.rstrip().endswith("? help"), filtered


def test_the_banner_keeps_the_options_whole_beside_long_log_paths():
    """`kvtop top --sglang-log A --sglang-log B` at 120 columns: the first log's path took the banner and left the
    options `…`; a path is cut now, the options whole."""
    app = make_app()
    app.sub_title = (
        "sglang logs: tests/kvtop/fixtures/sglang/lost-prefill/decode.log, "
        "tests/kvtop/fixtures/sglang/lost-prefill/prefill.log"
    )
    seen = {}

    async def scenario(pilot):
        seen["banner"] = text(app, "#banner")

    drive(app, scenario, size=(120, 36))

    assert " kvtop  sglang logs: tests/kvtop/fixtures/" in seen["banner"], seen["banner"]
    assert "…   [sort age, events >= info]   as of " in seen["banner"], seen["banner"]
