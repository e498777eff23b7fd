"""The dashboard's overview: the health line, the ongoing incidents, the link heat map."""

from __future__ import annotations

import re

from tui_support import (
    CLUSTER,
    FIXED_NOW,
    FixtureSource,
    build_history_source,
    drive,
    lines,
    make_app,
    next_frame,
    submit_filter,
    text,
    wait_until,
)

from kvtop.model.cluster import STUCK_AFTER_S
from kvtop.model.intake import Refused
from kvtop.model.timeline import ECHOES, ORIGINS
from kvtop.tui.app import KvtopApp
from kvtop.tui.frame import INCIDENT_LINES, WINDOW_S, IncidentRow
from kvtop.tui.rows import Palette
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.themes import load_themes
from kvtop.tui.views.overview import OverviewView, _incident_lines
from kvtop.tui.widgets.line import Line
from kvtop.views.times import stamp


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


def test_an_80_column_health_line_keeps_the_failure_rate(app: KvtopApp, source: FixtureSource):
    """At 80x24 the health line said incidents, ranks, stuck and gaps, and not how bad: the failure rate left whole
    with the other rates. It now stays, without its origins' count, until the essentials alone fill the line."""
    seen = {}

    async def scenario(pilot):
        seen["health"] = text(app, "#health")

    drive(app, scenario, size=(80, 24))

    health = seen["health"]
    assert f"% failed in {WINDOW_S:g} s" in health and "origins)" not in health
    assert re.search(r" \d+ stuck  \d+ gaps$", health) and len(health) <= 80


def test_the_overview_lists_the_ongoing_incidents_with_their_rooms_and_start(app: KvtopApp, source: FixtureSource):
    """The overview's incidents panel is the model's ongoing cluster incidents, earliest start first: rooms,
    what broke, since when."""
    seen = {}

    async def scenario(pilot):
        seen["incidents"] = [line.strip() for line in lines(app.query_one("#incidents")) if line.strip()]

    drive(app, scenario)

    ongoing = [i for i in source.model.incidents.in_order(FIXED_NOW) if i.ongoing(FIXED_NOW) and not i.client]
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


def test_the_graphs_count_the_models_buckets_and_a_view_switch_keeps_the_layout():
    """The failures graph's scales are the largest origins and echoes of one 5 s bucket of the model's timeline;
    switching to another view and back keeps the panels laid out as they were (the hidden overview has no size:
    laying it out for none, then again on return, cost two layout passes per key)."""
    source = build_history_source()
    app = make_app(source, refresh_s=3600)
    seen = {}

    async def scenario(pilot):
        view = app.query_one(OverviewView)
        seen["graph"] = text(app, "#failures-graph")
        seen["axis"] = text(app, "#time-axis")
        layout = view.layout_shown
        for key in "rfeo":
            await pilot.press(key)
            await pilot.pause()
        await next_frame(pilot)
        seen["kept"] = view.layout_shown is layout and layout is not None

    drive(app, scenario, size=(160, 45))

    series = source.model.timeline.series(FIXED_NOW)
    origins, echoes = int(series[:, ORIGINS].max()), int(series[:, ECHOES].max())
    graph = seen["graph"].splitlines()
    rows = len(graph) // 2
    assert graph[0].split("│")[0].strip() == f"max {origins}" and graph[rows].split("│")[0].strip() == f"max {echoes}"
    assert graph[rows - 1].split("│")[0].strip() == "origins" and graph[-1].split("│")[0].strip() == "echoes"
    assert seen["axis"].split() == ["-5m", "-4m", "-3m", "-2m", "-1m", "now"]
    assert seen["kept"]


def test_more_incidents_than_the_panel_holds_are_listed_whole_and_counted_once():
    """Five ongoing in four places: it listed four and `and 2 more` (the fourth's description cut, the fourth
    counted twice)."""
    rows = [
        IncidentRow(i, f"prefill-{i}/TP0 stopped answering (peer_lost)", f"prefill-{i}/TP0", "unresponsive",
                    "peer_lost", 1, 1, 0, FIXED_NOW, FIXED_NOW, True, False, (), ())
        for i in range(INCIDENT_LINES // 2 + 1)
    ]  # fmt: skip

    palette = Palette.from_theme(load_themes().themes["kvtop-dark"])

    shown = [line.plain.strip() for line in _incident_lines(rows, palette, INCIDENT_LINES, 0)]

    suspects = [line for line in shown if "/TP0" in line]
    descriptions = [line for line in shown if line == "stopped answering (peer_lost)"]
    assert len(suspects) == len(descriptions) == len(rows) - 2
    assert shown[-1] == "and 2 more (f: failures)"
    assert len(shown) <= INCIDENT_LINES


def test_what_broke_wider_than_the_panel_keeps_its_class():
    """Beside the grid at 120 columns (38 cells) `stopped answering (timeout_transfer)` was cut at the edge,
    `(timeout_tran`, nothing saying so: the prose gives way, marked `…`, and the class stays whole."""
    row = IncidentRow(1, "prefill-1 stopped answering (timeout_transfer)", "prefill-1", "unresponsive",
                      "timeout_transfer", 7, 7, 0, FIXED_NOW, FIXED_NOW, True, False, (), ())  # fmt: skip
    palette = Palette.from_theme(load_themes().themes["kvtop-dark"])

    who, what = (line.plain for line in _incident_lines([row], palette, 2, 38))

    assert who.split() == ["7", "prefill-1", "since", stamp(FIXED_NOW)[:-4]]
    assert len(what) <= 38 and what.strip() == "stopped ans… (timeout_transfer)"


def test_a_filter_names_itself_on_the_overview_s_incidents_panel(app: KvtopApp):
    """A filter typed in another view trimmed the overview's incidents panel with nothing saying so beside a
    health line counting them all."""
    seen = {}

    async def scenario(pilot):
        seen["before"] = text(app, "#incidents-title")
        await submit_filter(pilot, "prefill-0/TP1")
        await pilot.press("o")
        await next_frame(pilot)
        seen["after"] = text(app, "#incidents-title")

    drive(app, scenario)

    assert seen["before"].startswith("Incidents  ongoing: rooms, what broke")
    assert seen["after"].startswith("Incidents  ongoing matching 'prefill-0/TP1'")


def test_ranks_a_relay_keeps_from_its_dead_upstream_read_unheard_not_gone(source: FixtureSource):
    """The relay the dashboard subscribes through says its upstream stopped answering it and keeps the decode ranks
    it had from there; a minute on, every rank is silent. Those read `gone` in the rank list, as the prefill ranks
    nothing explains, and the health line said nothing of the relay. Now they read `unheard`, the health line counts
    them and names the upstream."""
    intake = source.model.intake
    intake.upstream_relay = "tcp://relay:7101"
    intake.upstream_errors = ["relay tcp://rack-1:7101 stopped answering (none within 1.0s)"]
    intake.upstream_kept = CLUSTER.labels("decode")
    app = make_app(source, clock=lambda: FIXED_NOW + 60.0)
    seen = {}

    async def scenario(pilot):
        seen["health"], seen["ranks"] = text(app, "#health"), text(app, "#ranks-list")

    drive(app, scenario, size=(220, 40))

    rows = [line.split() for line in seen["ranks"].splitlines() if line.strip()]
    states = {row[0]: next(cell for cell in row if cell in ("alive", "stale", "gone", "unheard")) for row in rows}
    prefill, decode = CLUSTER.labels("prefill"), CLUSTER.labels("decode")
    assert states == dict.fromkeys(prefill, "gone") | dict.fromkeys(decode, "unheard")
    assert f" 0/{len(rows)} ranks alive, {len(decode)} unheard " in seen["health"]
    assert seen["health"].endswith(
        "source: upstream stopped answering the relay at tcp://relay:7101: relay tcp://rack-1:7101 stopped answering "
        "(none within 1.0s)"
    )


def test_a_title_or_banner_cut_at_80_columns_ends_in_an_ellipsis(app: KvtopApp, source: FixtureSource):
    """Titles, banners and the health line cut at the screen's edge looked whole (`(enter:` ended the events title at
    80 columns), as list rows did before they were marked: each one cut ends in `…`."""
    seen: dict[str, list[tuple[str, str]]] = {}

    async def scenario(pilot):
        for view in ("o", "r", "f", "e", "i"):
            await pilot.press(view)
            await next_frame(pilot)
            seen[view] = [(str(line._shown), lines(line)[0]) for line in app.screen.query(Line) if line.size.width > 0]

    drive(app, scenario, size=(80, 24))

    cut = [(view, full, shown) for view, shown_lines in seen.items() for full, shown in shown_lines
           if len(full.rstrip()) > len(shown.rstrip())]  # fmt: skip
    assert cut, "no title is cut at 80 columns: the test shows nothing"
    assert all(shown.rstrip().endswith("…") for _, _, shown in cut), cut


def test_an_unlisted_rank_and_the_bootstrap_s_refusals_show_on_the_overview_and_in_its_history(source: FixtureSource):
    """prefill-0/TP1's refresh was refused (its entry taken once it expired): its heartbeat says so, and the service
    lists the refusal. The dashboard showed an alive rank and a healthy line; now its row reads `unlisted`, the
    health line counts it and the refusal (naming the latest where there is room), and its history says why."""
    why = (
        "registration of prefill-0/TP1 refused: registered from 10.0.0.9, but incarnation 7 (tcp://10.0.0.3:40123) "
        "from 10.0.0.3 holds it live; it is taken only once that expires"
    )
    source.model.ranks["prefill-0/TP1"].registration = why
    refusal = "prefill-0/TP1: registered from 10.0.0.9, but incarnation 7 holds it live (from 10.0.0.9)"
    source.model.intake.bootstrap_refusals = [
        Refused("decode-0/TP0: an hour ago (from 10.0.0.7)", "decode", FIXED_NOW - 3600.0),
        Refused(refusal, "prefill", FIXED_NOW - 5.0),
    ]
    app = make_app(source)
    seen = {}

    async def scenario(pilot):
        seen["health"], seen["ranks"] = text(app, "#health"), text(app, "#ranks-list")
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        seen["history"] = app.screen.body.plain

    drive(app, scenario, size=(400, 40))

    rows = {row.split()[0]: row.split() for row in seen["ranks"].splitlines() if row.strip()}
    assert {label for label, cells in rows.items() if "unlisted" in cells} == {"prefill-0/TP1"}
    assert f" {len(rows)}/{len(rows)} ranks alive, 1 unlisted " in seen["health"]
    assert f"  1 registration refused, latest {refusal}" in seen["health"]
    heard = "another client holds its entry: no peer finds it; new views hear it as taken"
    assert f"unlisted prefill-0/TP1 ({heard}): {why}" in seen["history"]


def test_the_health_line_keeps_the_count_of_refusals_where_their_reason_does_not_fit(source: FixtureSource):
    """At 100 columns the latest refusal's reason leaves the line; how many were refused stays where it fits."""
    source.model.intake.bootstrap_refusals = [Refused("flood-9/TP0: " + "x" * 200, "prefill", FIXED_NOW - 1.0)]
    app = make_app(source)
    seen = {}

    async def scenario(pilot):
        seen["health"] = text(app, "#health")

    drive(app, scenario, size=(160, 40))

    assert "1 registration refused" in seen["health"] and "flood-9" not in seen["health"]
