"""The dashboard's life: it opens, tunes the interpreter, builds and paints frames, quits, fails."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import pytest
from tui_support import (
    CLUSTER,
    FIXED_NOW,
    FRAME_TIMEOUT_S,
    FixtureSource,
    drive,
    focused_id,
    lines,
    make_app,
    next_frame,
    text,
    wait_until,
)

from kvtop.model.cluster import ClusterModel
from kvtop.tui.app import KvtopApp
from kvtop.tui.process import SWITCH_INTERVAL_S
from kvtop.tui.themes import load_themes


class _Probe:
    """An object in a reference cycle (through `ring`), watched by a weak reference."""

    def __init__(self, ring: list[object]) -> None:
        ring.append(self)


class _BrokenLock:
    """A lock whose holder fails: every frame build raises."""

    def __enter__(self) -> None:
        raise RuntimeError("the model is gone")

    def __exit__(self, *_: object) -> None:
        return None


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


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
def test_q_and_ctrl_c_quit(app: KvtopApp, key: str):
    """`q` ends the app, and Ctrl-C as the README says (Textual only told how to quit)."""
    seen = {}

    async def scenario(pilot):
        await pilot.press(key)
        await wait_until(pilot, lambda: not app.is_running, "the app quits")
        seen["running"] = app.is_running

    drive(app, scenario)

    assert seen == {"running": False}


def test_a_key_pressed_while_a_frame_is_built_still_reaches_the_screen(source: FixtureSource):
    """`x` pressed while the worker builds a frame from the old options gets a frame of its own, timer or not."""
    building, release = threading.Event(), threading.Event()
    hold = []

    def clock() -> float:
        if hold and threading.current_thread() is not threading.main_thread():  # the worker (the app asks the
            # clock too, for the banner): it has read the options, and now stalls as it would on a big model
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


def test_a_live_frame_no_newer_one_follows_is_said_to_be_stale(source: FixtureSource):
    """The model stops answering (its process stopped, its lock held): the banner said `<1 s old` over the last
    frame for as long as it lasted; now its age grows with the clock and, past `STALE_AFTER_S`, the health line
    starts with `no new data for 10 s` and the banner takes the error colour."""
    now = [FIXED_NOW]
    app = make_app(source, refresh_s=0.05, clock=lambda: now[0])
    seen = {}

    async def scenario(pilot):
        await next_frame(pilot)
        seen["fresh"] = text(app, "#banner")
        with source.lock:  # every frame's build waits on it from now on
            now[0] += 10.0
            await wait_until(pilot, lambda: "10 s old" in text(app, "#banner"), "the banner to age")
            seen["stale"] = (text(app, "#health"), app.query_one("#banner").has_class("stale"))

    drive(app, scenario)

    assert "<1 s old" in seen["fresh"]
    assert seen["stale"][0].startswith(" no new data for 10 s ")
    assert seen["stale"][1]


def test_an_alert_is_shown_when_it_happens(source: FixtureSource):
    """An embedded cluster's rank killed under the dashboard was said only once the user quit; the dashboard
    showed it `gone`, as a network loss."""
    pending = ["rank decode-0/TP0 (pid 4242) killed by SIGKILL; its stderr was empty"]
    app = KvtopApp(source, title="t", themes=load_themes(), clock=lambda: FIXED_NOW, refresh_s=0.05,
                   alerts=lambda: [pending.pop()] if pending else [])  # fmt: skip
    seen = {}

    async def scenario(pilot):
        await wait_until(pilot, lambda: app._notifications, "the alert shown")
        seen["shown"] = [(n.message, n.severity) for n in app._notifications]

    drive(app, scenario)

    assert seen["shown"] == [("rank decode-0/TP0 (pid 4242) killed by SIGKILL; its stderr was empty", "error")]


def test_no_frame_is_built_while_the_last_one_is_painted(source: FixtureSource):
    """A frame asked for while the last one is painted is built after the paint: the two never share the GIL."""
    builds: list[float] = []
    app = make_app(source, refresh_s=0.005)
    build = app.frames.build

    def timed(*args, **kwargs):
        builds.append(time.monotonic())
        return build(*args, **kwargs)

    app.frames.build = timed  # type: ignore[method-assign]

    async def scenario(pilot):
        await wait_until(pilot, lambda: app.frames_drawn >= 20, "20 frames")

    drive(app, scenario)

    paints = [(painted - seconds, painted) for painted, seconds, _ in app.draws]
    assert len(paints) >= 20
    assert [b for b in builds if any(start < b < end for start, end in paints)] == []


def test_a_dashboard_whose_frames_fail_exits_1_with_one_line(monkeypatch, capsys):
    """A frame that cannot be built ends the dashboard (no frozen screen) with exit 1 and one stderr line."""
    import functools

    import pytest
    import typer

    from kvtop.cli.top_cmd import run_dashboard

    monkeypatch.setattr(KvtopApp, "run", functools.partialmethod(KvtopApp.run, headless=True))
    source = FixtureSource(ClusterModel(), lock=_BrokenLock())  # type: ignore[arg-type]

    with pytest.raises(typer.Exit) as ended:
        run_dashboard(source, "broken", load_themes(), "kvtop-dark", quit_after=30)

    assert ended.value.exit_code == 1
    assert capsys.readouterr().err.splitlines() == ["kvtop: the dashboard failed: RuntimeError: the model is gone"]
