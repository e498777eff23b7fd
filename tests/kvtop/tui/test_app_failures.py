"""The dashboard's failures view: incidents, groups and echoes folded and unfolded."""

from __future__ import annotations

import pytest
from tui_support import (
    FIXED_NOW,
    FixtureSource,
    drive,
    lines,
    make_app,
    next_frame,
    submit_filter,
    text,
    wait_until,
)

from kvtop.tui.app import KvtopApp
from kvtop.tui.rows import clock
from kvtop.tui.views.failures import FailuresView
from kvtop.tui.widgets.row_list import RowList
from transport.plane.events import Failure


def model_group(source: FixtureSource, shown):
    """The model's own fold of the group a row of the failures view shows."""
    return next(g for g in source.model.groups() if (g.room, g.origin_label) == (shown.room, shown.origin_label))


def incident_of(source: FixtureSource, room: int) -> int:
    with source.lock:
        group = next(g for g in source.model.groups() if g.room == room)
        return source.model.incidents.incident_of(group).id


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


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
def test_beside_the_detail_pane_each_row_keeps_its_origin_class_and_time(size: tuple[int, int]):
    """With the pane open at 80 columns the tree's rows were 19 columns (`    ▶ room …`: the room's 19 digits
    first); at 80 and 100 columns each group row still shows its start, origin and class, each echo its time,
    rank and class, and the incident its state, start and who broke."""
    app, seen = make_app(), {}

    async def scenario(pilot):
        view = app.query_one(FailuresView)
        await pilot.press("f")
        await next_frame(pilot)
        await pilot.press("d", "enter", "down", "enter")
        await wait_until(pilot, lambda: view.highlighted.group is not None and len(view.rows) > 5, "a group opened")
        await next_frame(pilot)
        seen["rows"] = view.rows[:]
        seen["shown"] = lines(app.query_one("#failure-tree", RowList))

    drive(app, scenario, size=size)

    rows, shown = seen["rows"], seen["shown"]
    incident, group, echo = rows[0].incident, rows[1].group, rows[2].echo
    assert shown[0].split()[1:4] == ["ONGOING", clock(incident.first_seen)[:-4], incident.headline.split()[0]]
    assert shown[1].split()[1:4] == [clock(group.first_ts)[:-4], group.origin_label, group.origin.reason_class]
    assert shown[2].split()[1:4] == [clock(echo.ts), echo.rank, echo.reason_class]
    assert len([row for row in shown if row.strip()]) == min(len(rows), len(shown))


def test_a_filter_that_matches_nothing_leaves_no_detail_of_a_row_no_longer_listed(app: KvtopApp):
    """The detail pane showed the incident highlighted before the filter emptied the list."""
    seen = {}

    async def scenario(pilot):
        await pilot.press("f")
        await next_frame(pilot)
        await pilot.press("d")
        await pilot.pause()
        seen["before"] = text(app, "#failure-detail-text")
        await submit_filter(pilot, "no-such-rank-anywhere")
        await next_frame(pilot)
        seen["after"] = text(app, "#failure-detail-text")

    drive(app, scenario)

    assert seen["before"] != "nothing highlighted"
    assert seen["after"] == "nothing highlighted"


def test_enter_expands_an_incident_into_its_groups_and_a_group_into_its_echoes(app: KvtopApp, source: FixtureSource):
    """The failures view leads with incidents: enter on the first shows exactly its failure groups under it, by
    start, the earliest on top (as every list of incidents is ordered; they were newest first, so each new group
    moved the rows under the cursor), enter on a group its echoes under that; enter again folds the group."""
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
    starts = [g.first_ts for g in seen["groups"]]
    assert starts == sorted(starts) and starts[0] < starts[-1] and seen["group"] is seen["groups"][0]
    assert group.echo_count > 0 and seen["echoes"] == group.echoes
    assert sorted(row.split()[2] for row in echo_rows) == sorted(echo.rank for echo in group.echoes)
    assert seen["rows"][0].startswith(f"▼ ONGOING  {incident.headline()}  {incident.room_count} rooms")
    assert seen["rows"][1].startswith(f"▼ room {group.room} ")
    assert seen["rows"][2 : 2 + group.echo_count] == echo_rows
    assert seen["rows folded"][1].startswith(f"▶ room {group.room} ")
    assert not any(row.startswith("└ echo ") for row in seen["rows folded"])


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
    assert after.incident.id == incident_of(source, room) and after.incident.suspect == "prefill-1"  # TP1's: both
    # ranks of prefill-1 corrupt in the fixture, one incident of the instance
    assert any(row.startswith(f"▼ room {room} ") for row in seen["rows"])
    assert any(row.startswith("└ echo prefill-0/TP0") for row in seen["rows"])


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
