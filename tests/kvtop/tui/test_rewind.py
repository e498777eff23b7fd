"""The rewind keys on a recording of the synthetic cluster: step back, origins, jump, play, back to live.

One recording per module (30 s of collector passes with failures); the live side is the model the
recording's collector held at its end, judged 0.5 s later.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets._footer import FooterKey
from tui_support import SIZE, FixtureSource, binding_keys, drive, lines, next_frame, text, wait_until

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.replay import Replay
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.tui.app import REWIND_ACTIONS, KvtopApp
from kvtop.tui.details import rank_history
from kvtop.tui.frame import Frame, FrameBuilder, Options
from kvtop.tui.rewind import Rewind, since
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.screens.help import HelpScreen
from kvtop.tui.themes import load_themes
from kvtop.tui.widgets.footer import NARROW_BELOW
from kvtop.views.times import stamp

PASS_S = 0.5
ROOMS_PER_PASS = 4
PASSES = 60
CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2, spacing_s=PASS_S / ROOMS_PER_PASS, failure_rate=0.08, seed=5)
LIVE_NOW = CLUSTER.start + PASSES * PASS_S + 0.5


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ClusterModel]:
    """The recording's folder, and the model its collector held at the end (the live model)."""
    folder = tmp_path_factory.mktemp("ring")
    recorder = Recorder(folder, keyframe_events=2000, flush_s=3600.0)
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    feed(recorder, model, CLUSTER, PASSES, ROOMS_PER_PASS, pass_s=PASS_S)
    recorder.close()
    return folder, model


def _live_app(recorded: tuple[Path, ClusterModel], theme: str = "kvtop-dark", refresh_s: float = 0.5) -> KvtopApp:
    folder, model = recorded
    rewind = Rewind(folder, live=True, clock=lambda: LIVE_NOW)
    return KvtopApp(FixtureSource(model), title="synthetic", themes=load_themes(), theme=theme,
                    clock=lambda: LIVE_NOW, refresh_s=refresh_s, rewind=rewind)  # fmt: skip


def _as_of(folder: Path, at: float) -> Frame:
    """The frame a fresh seek to `at` gives (what the dashboard must show there)."""
    model = Replay(str(folder), journal_events=JOURNAL_EVENTS_KEPT).at(at).model
    return FrameBuilder(model).build(Options(), now=at)


def _rooms(frame: Frame | None) -> list[int]:
    assert frame is not None
    return [room.room for room in frame.rooms]


async def _replayed_at(pilot, when: float) -> Frame:
    app = pilot.app
    await wait_until(pilot, lambda: app.frame.replay is not None and app.frame.replay.time == when, f"replay at {when}")
    return app.frame


def test_step_back_shows_the_recorded_past_and_live_restores_the_present(recorded):
    """`,` shows the model of 10 s ago (fewer rooms, as a seek there has them), `L` the live model again."""
    folder, _ = recorded
    app = _live_app(recorded)
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        live = _rooms(app.frame)
        await pilot.press("comma")
        frame = await _replayed_at(pilot, LIVE_NOW - 10.0)
        expected = _as_of(folder, LIVE_NOW - 10.0)
        seen["rooms as a seek has them"] = _rooms(frame) == _rooms(expected)
        seen["fewer rooms than live"] = len(frame.rooms) < len(live)
        seen["origins as a seek has them"] = len(frame.groups) == len(expected.groups)
        await pilot.pause()
        seen["banner"] = text(app, "#banner").split(" — ")[0].strip()
        seen["replay class"] = app.query_one("#banner").has_class("replay")
        await pilot.press("L")
        await wait_until(pilot, lambda: app.frame.replay is None, "live again")
        seen["live rooms again"] = _rooms(app.frame) == live
        seen["replay class after"] = app.query_one("#banner").has_class("replay")

    drive(app, scenario)
    assert seen == {
        "rooms as a seek has them": True,
        "fewer rooms than live": True,
        "origins as a seek has them": True,
        "banner": "REPLAY 20:27:00 (10s ago)",
        "replay class": True,
        "live rooms again": True,
        "replay class after": False,
    }


def test_origin_keys_land_on_the_recorded_failure_origins(recorded):
    """From the recording's start, `]` lands on the first origin's arrival, `]` again on the next, `[` back."""
    folder, _ = recorded
    marks = Replay(str(folder)).marks()
    assert len(marks) >= 2, "the recording wants failure origins"
    app = _live_app(recorded)
    landed: list[tuple[float, set[int]]] = []

    async def scenario(pilot) -> None:
        await pilot.press("b")
        app.query_one("#jump").value = str(CLUSTER.start - 100)  # before the recording: its start
        await pilot.press("enter")
        start = (await _replayed_at(pilot, Replay(str(folder)).start)).replay
        assert start is not None and "the recording starts at" in start.note
        for key in ("right_square_bracket", "right_square_bracket", "left_square_bracket"):
            before = app.frame.replay.time
            await pilot.press(key)
            await wait_until(pilot, lambda before=before: app.frame.replay.time != before, f"{key} moved")
            landed.append((app.frame.replay.time, {group.room for group in app.frame.groups}))

    drive(app, scenario)
    later = next(m for m in marks if m.arrived > marks[0].arrived)
    assert [at for at, _ in landed] == [marks[0].arrived, later.arrived, marks[0].arrived]
    assert later.room in landed[1][1], "the origin jumped to is in the model shown"
    assert later.room not in landed[2][1], "an origin that arrived later is not"


def test_jump_and_play_reach_live(recorded):
    """`b 2s ago` replays 2 s back; `p` plays it forward until the recording's end, then the live model shows."""
    app = _live_app(recorded)

    async def scenario(pilot) -> None:
        await pilot.press("b")
        app.query_one("#jump").value = "2s ago"
        await pilot.press("enter")
        await _replayed_at(pilot, LIVE_NOW - 2.0)
        await pilot.press("p")
        await wait_until(pilot, lambda: app.frame.replay is None or app.frame.replay.playing, "playing")
        await wait_until(pilot, lambda: app.frame.replay is None, "live once the recording's end is reached", 15)
        assert not app.paused

    drive(app, scenario)


def test_a_bad_time_is_refused_and_the_view_stays_live(recorded):
    """`b` with text that names no time: an error notice, the live view unchanged."""
    app = _live_app(recorded)
    notices: list[str] = []

    async def scenario(pilot) -> None:
        await pilot.press("b")
        app.query_one("#jump").value = "yesterday-ish"
        await pilot.press("enter")
        await next_frame(pilot)
        notices.extend(n.message for n in app._notifications)
        assert app.frame.replay is None

    drive(app, scenario, notifications=True)
    assert any("is not a time" in notice for notice in notices)


def test_rewinding_before_anything_was_recorded_says_so_and_the_view_stays_live(recorded, tmp_path: Path):
    """`,` in a live session's first second, its recording's folder still empty: a notice that nothing is
    recorded yet (not an error about segments), the live view unchanged."""
    _, model = recorded
    rewind = Rewind(tmp_path, live=True, clock=lambda: LIVE_NOW)
    app = KvtopApp(FixtureSource(model), title="synthetic", themes=load_themes(), clock=lambda: LIVE_NOW,
                   refresh_s=0.5, rewind=rewind)  # fmt: skip
    notices: list[str] = []

    async def scenario(pilot) -> None:
        live = _rooms(app.frame)
        await pilot.press("comma")
        await wait_until(pilot, lambda: bool(app._notifications), "a notice")
        notices.extend(n.message for n in app._notifications)
        assert app.frame.replay is None and _rooms(app.frame) == live

    drive(app, scenario, notifications=True)
    assert notices == ["nothing recorded yet: try again in a second"]


def test_a_recording_alone_opens_at_its_end_and_live_means_its_end(recorded):
    """Without a live source the dashboard shows the recording's end; `,` steps back, `L` returns to the end,
    and the footer and the help call it what the banner does (`L end`), not `Live`."""
    folder, _ = recorded
    rewind = Rewind(folder, live=False, clock=lambda: LIVE_NOW)
    app = KvtopApp(rewind, title="recording", themes=load_themes(), clock=lambda: LIVE_NOW, rewind=rewind)
    end = Replay(str(folder)).end
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        await _replayed_at(pilot, end)
        seen["banner"] = text(app, "#banner")
        seen["footer"] = [
            b.description for key, (_, b, on, _) in app.screen.active_bindings.items() if key == "L" and on
        ]
        await pilot.press("comma")
        await _replayed_at(pilot, end - 10.0)
        await pilot.press("L")
        await _replayed_at(pilot, end)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        seen["help"] = [" ".join(line.split()) for static in app.screen.query("Static") for line in lines(static)
                        if line.split()[:1] == ["L"]]  # fmt: skip

    drive(app, scenario, size=SIZE)
    assert "— the recording's end, paused (p plays, b jumps, L end)" in str(seen["banner"])
    assert seen["footer"] == ["End"]
    assert seen["help"] == ["L The recording's end (a recording alone: no live to go back to)"]


def test_a_rewind_between_two_recorder_runs_says_it_was_not_recorded_not_ranks_gone(tmp_path: Path):
    """A folder recorded into twice, 100 s apart: at an instant between the runs the dashboard showed every rank
    gone (their last news before the pause), where the one-shot views refuse that instant. Now the banner and
    the status bar say it was not recorded, and the ranks are as the first run left them."""
    folder = tmp_path / "rec"
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    first = Recorder(folder, keyframe_events=2000, flush_s=3600.0)
    stopped = feed(first, model, CLUSTER, 20, ROOMS_PER_PASS, pass_s=PASS_S)
    first.close()
    second = Recorder(folder, keyframe_events=2000, flush_s=3600.0)
    started = stopped + 100.0
    second.tick(model, started)
    feed(second, model, CLUSTER, 20, ROOMS_PER_PASS, pass_s=PASS_S, start=started)
    second.close()
    replay = Replay(str(folder), journal_events=JOURNAL_EVENTS_KEPT)
    gap = replay.unrecorded(stopped + 50.0)
    assert gap is not None
    rewind = Rewind(folder, live=False, clock=lambda: started + 60.0, cursor=replay.at(stopped + 50.0))
    app = KvtopApp(rewind, title="recording", themes=load_themes(), clock=lambda: started + 60.0, rewind=rewind)
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        frame = await _replayed_at(pilot, stopped + 50.0)
        await pilot.pause()
        seen["ranks alive"] = (frame.health.ranks_alive, frame.health.ranks_total)
        seen["banner"] = text(app, "#banner")
        seen["health"] = text(app, "#health").strip()

    drive(app, scenario, size=SIZE)
    first_stopped, next_started = (stamp(t)[:-4] for t in gap)
    assert seen["ranks alive"] == (8, 8)
    assert f"not recorded (the recorder did not run from {first_stopped} to {next_started})" in str(seen["banner"])
    assert str(seen["health"]).startswith(f"not recorded: as of {first_stopped}  ")


@pytest.mark.parametrize("theme", ["kvtop-dark", "kvtop-light"])
def test_replay_banner_snapshot(snap_compare, recorded, theme: str):
    """A live session stepped back 10 s: the replay banner, the model of then, the rewound footer."""

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.frames_drawn > 0, "the first frame")
        await pilot.press("comma")
        await _replayed_at(pilot, LIVE_NOW - 10.0)
        await pilot.pause()

    app = _live_app(recorded, theme, refresh_s=3600)  # frames come when asked for, never during the screenshot
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize(
    ("seconds", "said"), [(0.2, "now"), (12, "12s ago"), (1205, "20m 5s ago"), (11_040, "3h 4m ago"), (-5, "in 5s")]
)
def test_since_says_how_long_ago_for_people(seconds: float, said: str):
    assert since(seconds) == said


def test_help_lists_the_rewind_keys_when_there_is_a_recording_to_rewind_into(recorded):
    app = _live_app(recorded)
    seen: list[str] = []

    async def scenario(pilot) -> None:
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        seen.extend(line.strip() for static in app.screen.query("Static") for line in lines(static))

    drive(app, scenario, size=SIZE)
    rows = {tuple(line.split()) for line in seen}
    rewinds = [binding for binding in KvtopApp.BINDINGS if binding.action.partition("(")[0] in REWIND_ACTIONS - {"end"}]
    assert {binding_keys(b) for b in rewinds} == {",", ".", "<", ">", "[", "]", "b", "L"}
    assert ("L", "Back", "to", "live") in rows and not any(row[:3] == ("L", "The", "recording's") for row in rows)
    assert all((*binding_keys(b).split(), *(b.tooltip or b.description).split()) in rows for b in rewinds)


def test_a_rewound_instant_folds_the_failures_it_shows_into_incidents(tmp_path: Path):
    """A collector folds failures into incidents at its sweep, every half second (at a session's start only once
    every agent's snapshot is in): rewound to an instant between two sweeps, the failures view put the newest groups
    under `not in an incident` and the header counted too few incidents ongoing (none, at a recording's start, over
    a hundred origins). A rewound instant folds what it holds, as `kvtop incidents --replay DIR --at T` does."""
    cluster = SyntheticCluster(prefill=1, decode=1, tp=2, spacing_s=0.01, failure_rate=0.5, seed=7)
    recorder = Recorder(tmp_path, keyframe_events=100_000, flush_s=3600.0)
    feed(recorder, ClusterModel(JOURNAL_EVENTS_KEPT), cluster, passes=8, rooms_per_pass=5)  # swept at pass 1 only
    recorder.close()
    replay = Replay(str(tmp_path))
    when = replay.marks()[-1].arrived
    unfolded, folded = replay.at(when).model, replay.at(when).model
    folded.update_incidents()
    gap = folded.incidents.quiet_gap_s
    ongoing = sum(i.ongoing(when, gap) and not i.client for i in folded.incidents.incidents.values())
    origins = [sum(i.origins for i in model.incidents.incidents.values()) for model in (unfolded, folded)]
    assert origins[0] < origins[1] and ongoing  # (both ranks of its prefill corrupt: one incident of the instance)
    rewind = Rewind(tmp_path, live=False, clock=lambda: when + 1.0, cursor=replay.at(when))
    app = KvtopApp(rewind, title="recording", themes=load_themes(), clock=lambda: when + 1.0, rewind=rewind)
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        frame = await _replayed_at(pilot, when)
        seen["ongoing"] = frame.health.incidents_ongoing
        seen["groups outside an incident"] = sum(not incident for incident in frame.group_incidents)
        seen["groups"] = len(frame.groups)

    drive(app, scenario, size=SIZE)
    assert (seen["ongoing"], seen["groups outside an incident"]) == (ongoing, 0) and seen["groups"]


def test_an_open_ranks_panel_follows_a_playing_replay_into_live(recorded):
    """A rank's history opened on a replay 2 s back shows the rank as the replayed model holds it; while the replay
    plays on into live (`p` before `enter`: the panel takes the keys), the panel follows it to the live rank."""
    _, model = recorded
    app = _live_app(recorded)
    label = "prefill-0/TP0"
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        await pilot.press("b")
        app.query_one("#jump").value = "2s ago"
        await pilot.press("enter")
        await _replayed_at(pilot, LIVE_NOW - 2.0)
        await pilot.press("p", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        seen["replayed"] = app.screen.body.plain
        await wait_until(pilot, lambda: app.frame.replay is None, "live once the recording's end is reached", 15)
        live = rank_history(model, label, LIVE_NOW, app.palette).plain
        await wait_until(pilot, lambda: app.screen.body.plain == live, "the panel shows the live rank")
        seen["live"] = live

    drive(app, scenario)
    assert seen["replayed"] != seen["live"]
    assert str(seen["replayed"]).startswith(f"{label}  ")


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
def test_the_footer_shows_each_views_keys_whole_live_and_rewound(recorded, size: tuple[int, int]):
    """At 80 columns the rooms view's `x` and `s` were cut off the footer (and rewound, its `d` and `l` too):
    live and rewound, in every view, each key the footer shows lies whole on screen, clear of the palette's key,
    and the view's own keys are among them. Under 100 columns the palette's key leaves the footer for the help."""
    app = _live_app(recorded)
    own = {"o": set(), "r": {"x", "s"}, "f": {"d"}, "e": {"l"}}
    seen: dict[str, tuple[set[str], list[str], bool]] = {}

    def footer(tag: str) -> None:
        keys = list(app.screen.query(FooterKey))
        palette = [key for key in keys if key.has_class("-command-palette")]
        room = palette[0].region.x if palette else size[0]
        cut = [key.key_display for key in keys if key not in palette and (key.region.right > room or not key.region)]
        seen[tag] = ({key.key_display for key in keys}, cut, bool(palette))

    async def scenario(pilot) -> None:
        for mode in ("live", "rewound"):
            if mode == "rewound":
                await pilot.press("comma")
                await wait_until(pilot, lambda: app.frame.replay is not None, "rewound")
            for view in own:
                await pilot.press(view)
                await pilot.pause()
                await pilot.pause()
                footer(f"{mode} {view}")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        help_text = app.screen.sections["Everywhere"]
        seen["help"] = ({binding.key for binding in help_text}, [], False)

    drive(app, scenario, size=size)
    assert "ctrl+p" in seen.pop("help")[0]
    for tag, (shown, cut, palette) in seen.items():
        assert cut == [], tag
        assert {"?", "q", "/", "p", ",", *own[tag[-1]]} <= shown, tag
        assert palette is (size[0] >= NARROW_BELOW), tag
    assert {".", "[", "]", "L"} <= seen["rewound r"][0]


def test_the_rewind_keys_move_an_open_panel_through_the_recording(recorded):
    """With a rank's history open, `,` and the other rewind keys did nothing (the panel, a modal screen, stopped the
    app's keys): close it, step, reopen. Now `,` steps the replay under the open panel, which shows the rank as a
    seek there has it and says on its border that it is a replay (the banner lies under it); `]` takes it to the
    next origin, `L` brings the panel back to the live rank; it stays open throughout."""
    folder, _ = recorded
    app = _live_app(recorded)
    label = "prefill-0/TP0"
    seen: dict[str, object] = {}

    def as_of(at: float) -> str:
        replayed = Replay(str(folder), journal_events=JOURNAL_EVENTS_KEPT).at(at).model
        return rank_history(replayed, label, at, app.palette).plain

    async def scenario(pilot) -> None:
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        seen["live"] = app.screen.body.plain
        await pilot.pause()
        seen["border"] = [border()]
        await pilot.press("comma")
        await _replayed_at(pilot, LIVE_NOW - 10.0)
        expected = as_of(LIVE_NOW - 10.0)
        await wait_until(pilot, lambda: app.screen.body.plain == expected, "the panel as of 10 s ago")
        seen["10 s back"] = app.screen.body.plain
        seen["border"].append(border())
        await pilot.press("comma")
        await _replayed_at(pilot, LIVE_NOW - 20.0)
        await pilot.press("right_square_bracket")
        await wait_until(pilot, lambda: app.frame.replay.time > LIVE_NOW - 20.0, "the next origin after 20 s ago")
        with app.rewind.lock:  # (a fresh seek there may journal less: what the keyframe left out)
            expected = rank_history(app.rewind.model, label, app.rewind.time, app.palette).plain
        await wait_until(pilot, lambda: app.screen.body.plain == expected, "the panel at that origin")
        seen["at the origin"] = app.screen.body.plain
        await pilot.press("L")
        await wait_until(pilot, lambda: app.frame.replay is None, "live again")
        await wait_until(pilot, lambda: app.screen.body.plain == seen["live"], "the panel of the live rank again")
        seen["open throughout"] = isinstance(app.screen, DetailScreen)
        seen["border"].append(border())

    def border() -> str:  # the banner saying which model the views show lies under the panel
        return str(app.screen.query_one("#detail").border_title)

    drive(app, scenario)
    assert seen["border"] == ["live", "REPLAY 20:27:00 (10s ago), paused: , . step  L live", "live"]
    assert len({seen["10 s back"], seen["at the origin"], seen["live"]}) == 3
    assert seen["open throughout"]


def test_a_views_key_closes_an_open_panel_on_that_view(recorded):
    """`f` with a rank's history open did nothing; now the panel closes and the failures view shows, its list
    taking the keys."""
    app = _live_app(recorded)
    seen: dict[str, object] = {}

    async def scenario(pilot) -> None:
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank history")
        await pilot.press("f")
        await wait_until(pilot, lambda: not isinstance(app.screen, DetailScreen), "the panel closed")
        await pilot.pause()
        seen["view"] = app.active_view
        seen["focused"] = app.focused.id if app.focused is not None else None

    drive(app, scenario)
    assert seen == {"view": "failures", "focused": "failure-tree"}
