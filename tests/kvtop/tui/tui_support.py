"""A deterministic dashboard for tests: a synthetic cluster's model, a fixed clock, and frame waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.tui.app import KvtopApp
from kvtop.tui.frame import Frame, Options
from kvtop.tui.frame_source import LocalFrames
from kvtop.tui.model_server import paged
from kvtop.tui.pages import PageRequest
from kvtop.tui.themes import load_themes

if TYPE_CHECKING:
    from textual.pilot import Pilot

CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2)
"""Two prefill and two decode instances of TP2: eight ranks."""
FIXED_NOW = CLUSTER.start + 10.0
"""The dashboard's clock: every age, rate and liveness is computed as of this instant."""
ROOMS_RETIRED = 300
"""Rooms applied early enough to be retired by the sweep (they show as finished)."""
ROOMS_LIVE = 100
"""Rooms applied after the sweep (still in `model.rooms`; a few of them open)."""
OLD = SyntheticCluster(prefill=2, decode=2, tp=2, start=CLUSTER.start - 600.0, open_rate=0.1, seed=11)
"""The same cluster ten minutes earlier: its open rooms have made no progress since (stuck)."""
ROOMS_OLD = 40
HISTORY = (
    SyntheticCluster(prefill=2, decode=2, tp=2, start=FIXED_NOW - 290.0, spacing_s=0.5, open_rate=0.0, seed=21),
    SyntheticCluster(prefill=2, decode=2, tp=2, start=FIXED_NOW - 170.0, spacing_s=0.2, failure_rate=0.4,
                     open_rate=0.0, seed=23),
)  # fmt: skip
"""The same cluster over the five minutes before: a room every 0.5 s, 5 % failing, and a burst of failures
(40 % of a room every 0.2 s for 20 s) about three minutes before `FIXED_NOW`."""
HISTORY_ROOMS = (560, 100)
SIZE = (140, 40)
FRAME_TIMEOUT_S = 10.0


@dataclass
class FixtureSource:
    """What the dashboard reads (the app's `Source` protocol), filled once and never written again."""

    model: ClusterModel
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: str = ""


def build_model() -> ClusterModel:
    """The synthetic cluster as the collector would hold it at `FIXED_NOW`: alive, some rooms failed or stuck.

    Old rooms (stuck ones among them) arrive last, as a restarted collector's first snapshot would bring them.
    """
    model = ClusterModel(JOURNAL_EVENTS_KEPT)  # as the dashboard's sources keep it: with an event tail
    for label, batch in CLUSTER.hello() + CLUSTER.rooms(ROOMS_RETIRED):
        model.apply(label, batch, FIXED_NOW - 2.0)
    model.sweep(FIXED_NOW)
    for label, batch in CLUSTER.rooms(ROOMS_LIVE, first=ROOMS_RETIRED) + OLD.rooms(ROOMS_OLD):
        model.apply(label, batch, FIXED_NOW - 1.0)
    model.update_incidents()  # as the collector's next sweep would
    return model


def build_source() -> FixtureSource:
    return FixtureSource(build_model())


def build_history_source() -> FixtureSource:
    """`build_model()`'s cluster after five minutes of traffic and failures (`HISTORY`): the overview's graphs
    of failures and throughput over time have something to show."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, FIXED_NOW - 300.0)
    for cluster, rooms in zip(HISTORY, HISTORY_ROOMS, strict=True):
        for label, batch in cluster.rooms(rooms):
            model.apply(label, batch, cluster.start + rooms * cluster.spacing_s)
        model.sweep(cluster.start + rooms * cluster.spacing_s + 2.0)
    for label, batch in CLUSTER.rooms(ROOMS_RETIRED):
        model.apply(label, batch, FIXED_NOW - 2.0)
    model.sweep(FIXED_NOW)
    for label, batch in CLUSTER.rooms(ROOMS_LIVE, first=ROOMS_RETIRED) + OLD.rooms(ROOMS_OLD):
        model.apply(label, batch, FIXED_NOW - 1.0)
    model.update_incidents()
    return FixtureSource(model)


class PagedFrames(LocalFrames):
    """Frames of a model in this process cut to the windows the app asks for, as the model process sends
    them: a row scrolled to outside its frame's window is not at hand (`…`) until a frame carries it."""

    def build(self, options: Options, pages: Mapping[str, PageRequest]) -> Frame:
        return paged(super().build(options, pages), pages)


def make_app(
    source: FixtureSource | LocalFrames | None = None,
    theme: str = "kvtop-dark",
    refresh_s: float = 0.5,
    clock: Callable[[], float] = lambda: FIXED_NOW,
) -> KvtopApp:
    """The dashboard over `source` (a fresh fixture model by default, or frames of one) with the fixed clock."""
    return KvtopApp(
        source or build_source(),
        title="synthetic 2P2D TP2",
        themes=load_themes(),
        theme=theme,
        clock=clock,
        refresh_s=refresh_s,
    )


async def wait_until(
    pilot: Pilot[None], predicate: Callable[[], object], what: str, timeout: float = FRAME_TIMEOUT_S
) -> None:
    """Let the app run until `predicate()` is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if not pilot.app.is_running:
            raise AssertionError(f"the app stopped while waiting for: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:.1f}s: {what}")
        await pilot.pause(0.01)


async def next_frame(pilot: Pilot[None], timeout: float = FRAME_TIMEOUT_S) -> None:
    """Wait until the app drew a frame it had not drawn yet (frames are built in a worker thread)."""
    app = pilot.app
    assert isinstance(app, KvtopApp)
    drawn = app.frames_drawn
    app.request_frame()
    await wait_until(
        pilot,
        lambda: app.frames_drawn > drawn and app.frame is not None and app.frame.options == app.options,
        "a new frame drawn with the current options",
        timeout,
    )
    await pilot.pause()


async def submit_filter(pilot: Pilot[None], text: str) -> None:
    """`/`, the box's text replaced by `text` at once (typing it key by key costs ~0.1 s a key), enter."""
    await pilot.press("slash")
    pilot.app.query_one("#filter").value = text
    await pilot.press("enter")


def lines(widget: Any) -> list[str]:
    """What `widget` shows on screen, one string per line (trailing blanks kept)."""
    return [widget.render_line(y).text for y in range(widget.size.height)]


def text(app: KvtopApp, selector: str) -> str:
    """The text of the widget `selector` on the current screen, lines joined by newlines."""
    return "\n".join(line.rstrip() for line in lines(app.screen.query_one(selector)))


def drive(
    app: KvtopApp,
    scenario: Callable[[Pilot[None]], Awaitable[None]],
    size: tuple[int, int] = SIZE,
    notifications: bool = False,
) -> None:
    """Run the app headless at `size`, wait for its first frame, then play `scenario` on it."""

    async def run() -> None:
        async with app.run_test(size=size, notifications=notifications) as pilot:
            await next_frame(pilot)
            await scenario(pilot)
            if app.is_running:  # no frame may land while the test harness tears the widgets down
                app.paused = True
                await app.workers.wait_for_complete()

    asyncio.run(run())


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


def focused_id(app: KvtopApp) -> str | None:
    return app.focused.id if app.focused is not None else None


def binding_keys(binding: Any) -> str:
    """A binding's keys as the help screen names them (`, / .`)."""
    names = {"question_mark": "?", "slash": "/", "comma": ",", "full_stop": ".", "less_than_sign": "<",
             "greater_than_sign": ">", "left_square_bracket": "[", "right_square_bracket": "]"}  # fmt: skip
    return " / ".join(names.get(key, key) for key in binding.key.split(","))
