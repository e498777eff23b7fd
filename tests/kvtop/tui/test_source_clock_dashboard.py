"""The dashboard on past SGLang logs speaks of the logs' time: health line, overview, rooms and failure times."""

from __future__ import annotations

from pathlib import Path

from tui_support import FixtureSource, build_model, drive, make_app, next_frame, text, wait_until

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.follow import LogFollower
from kvtop.tui.app import KvtopApp
from kvtop.tui.details import rank_history
from kvtop.tui.frame import FrameBuilder, Options
from kvtop.tui.rows import Palette
from kvtop.tui.themes import load_themes
from kvtop.views.tables import status_json
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, RoomState, Snapshot

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sglang" / "new-era"
SPECS = [f"prefill={FIXTURES / 'prefill.log'}", f"decode={FIXTURES / 'decode.log'}"]
T0 = 1_000_000.0
TWO_DAYS = (("2026-01-01 10:00:00", 101), ("2026-01-03 09:00:00", 202))
"""(stamp, room) of two failures two days apart."""


def failure_line(stamp: str, room: int) -> str:
    return (
        f"[{stamp} TP0] Prefill transfer failed for request rank=0 req.rid='r{room}' req.bootstrap_room={room} with "
        f"exception KVTransferError(bootstrap_room={room}): Failed to send kv chunk of {room} to 10.0.0.7:15004\n"
    )


def run_on_logs(specs: list[str], views: tuple[str, ...]) -> dict[str, str]:
    """The dashboard on `specs` as `kvtop top --sglang-log` wires it; the text of each view's widgets once read."""
    follower = LogFollower(SGLangLogs(specs)).start()
    app = KvtopApp(follower, title="sglang logs", themes=load_themes(), clock=follower.now)
    seen: dict[str, str] = {}

    async def scenario(pilot):
        await wait_until(pilot, lambda: all(f.reader.at_end() for f in follower.logs.files), "the logs read")
        for view in views:
            await pilot.press(view[0])
            await next_frame(pilot)
            seen["health"], seen["banner"] = text(app, "#health"), text(app, "#banner")
            for selector in {"overview": ("#incidents",), "rooms": ("#rooms-title", "#rooms-list")}.get(view, ()):
                seen[selector] = text(app, selector)
            if view == "failures":
                seen["#failure-tree"] = text(app, "#failure-tree")

    try:
        drive(app, scenario, size=(200, 40))  # wide enough for a room row with three ranks
    finally:
        follower.close()
    return seen


def test_the_dashboard_on_past_logs_shows_their_last_minute_in_the_health_line_and_overview():
    """Failed rooms and origins of the minute before the logs' last line, as `kvtop status` counts them there;
    the overview names the incidents ongoing at the logs' last line."""
    model = ClusterModel()
    logs = load(SPECS, model)
    status = status_json(model, logs.now, 60.0)

    seen = run_on_logs(SPECS, ("overview",))

    assert status["rooms_failed"] > 0 and status["failures"] > 0
    assert f"{status['rooms_failed']} rooms failed ({status['failures']} origins) in the last 60 s" in seen["health"]
    assert "logs as of 2026-01-02 03:05:43" in seen["banner"]
    ongoing = [incident for incident in status["incidents"] if incident["state"] == "ongoing"]
    assert ongoing and "no incident" not in seen["#incidents"]
    for incident in ongoing[:3]:  # two lines each: four fit, three when a line says how many more
        roomless = incident["roomless"]  # failures that named no room, after a `+` (as `kvtop incidents`)
        rooms = f"{incident['room_count']}+{roomless}" if roomless else incident["room_count"]
        assert f"{rooms}  {incident['suspect_text']}  since " in seen["#incidents"]


def test_the_dashboards_rooms_view_lists_the_rooms_the_logs_name_failed_on_the_ranks_that_logged_them():
    """Every room a log names is listed, FAILED, with FAIL on each rank that logged its failure."""
    model = ClusterModel()
    load(SPECS, model)
    named = {group.room for group in model.groups()}

    seen = run_on_logs(SPECS, ("rooms",))

    rows = {line.split()[0]: line for line in seen["#rooms-list"].splitlines() if line.strip()}
    assert seen["#rooms-title"].startswith(f"{len(named)} rooms")
    assert set(rows) == {str(room) for room in named}
    assert "FAILED" in rows["1111"] and rows["1111"].endswith("prefill-0 TP1=FAIL -> decode-0 TP0,TP1=FAIL")


def test_the_failures_view_dates_its_times_when_the_logs_span_days(tmp_path: Path):
    """Groups two days apart show their dates; the one-day fixture shows times of day alone."""
    log = tmp_path / "prefill.log"
    log.write_text("".join(failure_line(stamp, room) for stamp, room in TWO_DAYS))

    two_days = run_on_logs([f"prefill={log}"], ("failures",))["#failure-tree"]
    one_day = run_on_logs(SPECS, ("failures",))["#failure-tree"]

    assert "since 2026-01-03 09:00:00 " in two_days and "since 2026-01-01 10:00:00 " in two_days
    assert "since 03:04:05 " in one_day and "2026-01-02" not in one_day


def test_a_frame_is_as_of_the_builders_clock():
    """Without an explicit time, a frame's now is the source's clock, not the wall clock."""
    frame = FrameBuilder(build_model(), clock=lambda: 1_767_323_145.0).build(Options())

    assert frame.now == 1_767_323_145.0


def test_the_health_line_names_the_span_when_the_agents_snapshots_hold_less_than_the_window():
    """A snapshot whose history starts 30 s back: the failure rate is over the last 30 s, and says so."""
    model = ClusterModel()
    done = [RoomState(T0 + second, second, int(KVPoll.Success), int(KVPoll.Transferring)) for second in range(30, 60)]
    model.apply("decode-0/TP0", Snapshot(1, EVENT_SCHEMA, 1, 1, None, None, [], done, [], history_since=T0 + 30), T0)
    app = make_app(FixtureSource(model), clock=lambda: T0 + 60)
    seen: dict[str, str] = {}

    async def scenario(pilot):
        seen["health"] = text(app, "#health")

    drive(app, scenario)

    assert FrameBuilder(model).build(Options(), T0 + 60).health.span_s == 30.0
    assert "0.0% failed in the last 30 s (0 origins)" in seen["health"]


def test_a_ranks_history_dates_its_failures_when_they_fall_on_several_days(tmp_path: Path):
    """The rank history of a log rank whose failures are two days apart shows each with its date."""
    log = tmp_path / "prefill.log"
    log.write_text("".join(failure_line(stamp, room) for stamp, room in TWO_DAYS))
    model = ClusterModel()
    logs = load([f"prefill={log}"], model)

    history = rank_history(model, "prefill-0/TP0", logs.now, Palette.from_theme(load_themes().themes["kvtop-dark"]))

    assert "2026-01-01 10:00:00.000  room 101" in history.plain and "2026-01-03 09:00:00.000  room 202" in history.plain
