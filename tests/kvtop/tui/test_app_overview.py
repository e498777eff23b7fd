"""The dashboard's overview: the health line, the ongoing incidents, the link heat map."""

from __future__ import annotations

from tui_support import (
    FIXED_NOW,
    FixtureSource,
    drive,
    lines,
    text,
)

from kvtop.model.cluster import STUCK_AFTER_S
from kvtop.tui.app import KvtopApp
from kvtop.tui.frame import INCIDENT_LINES, WINDOW_S
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
