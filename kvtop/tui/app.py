"""The kvtop dashboard: views over the cluster model, drawn from frames built off the UI thread."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Input, Tab, Tabs
from textual.worker import Worker, WorkerState

from kvtop.tui.fit import ESSENTIAL, fit, squeeze
from kvtop.tui.frame import WINDOW_S, Frame, Options, Replayed, RoomSort
from kvtop.tui.frame_source import FrameSource, LocalFrames, Source
from kvtop.tui.model_client import ModelProcess
from kvtop.tui.pages import PageRequest
from kvtop.tui.panels import PanelBody, PanelFollower, PanelRequest
from kvtop.tui.process import DashboardTuning, terminal_lost
from kvtop.tui.rewind import BIG_STEP_S, STEP_S, Rewind, since
from kvtop.tui.rows import Palette
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.screens.help import HelpScreen
from kvtop.tui.themes import DEFAULT_THEME, ThemeSet
from kvtop.tui.views.events import EventsView
from kvtop.tui.views.failures import FailuresView
from kvtop.tui.views.overview import OverviewView
from kvtop.tui.views.rooms import RoomsView
from kvtop.tui.widgets.footer import KeyFooter
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList
from kvtop.views import units
from kvtop.views.incidents import plural
from kvtop.views.times import stamp

REFRESH_S = 0.5
"""How often the views redraw from the model (events arrive far faster: they are coalesced)."""
ALERT_S = 20.0
"""An alert (a rank of the embedded cluster exited) stays on screen this long, or until clicked away: long enough
to be read, not so long that stacked alerts hide the incidents (the rank's row says gone, the incident names it,
and the alert is printed again on exit)."""
STALE_AFTER_S = 3.0
"""A live frame this old by the clock, not paused: no newer one came (the model process stopped or hangs), and
the health line says so first, the banner on the error colour."""
VIEWS = ("overview", "rooms", "failures", "events")
_VIEW_HELP = {
    "overview": "Failures and throughput over time, ranks, links, incidents",
    "rooms": "Every live and recent room",
    "failures": "Origins with their echoes folded under them",
    "events": "The live event tail",
}
REWIND_ACTIONS = frozenset({"step", "origin", "jump", "live", "end"})
"""Actions that need a recording (hidden, and doing nothing, without one: --no-record, SGLang logs)."""
_VIEW_ACTIONS = {"faults_only": "rooms", "sort": "rooms", "detail": "failures", "level": "events"}
"""Keys of one view: shown in the footer, and acting, only there (one meaning per key)."""
LEVEL_CYCLE = ("info", "debug", "warning", "error")
"""The order `l` steps through: from the default, debug (echoes, room traffic) first."""
_STEP = Binding.Group("Step")
_ORIGIN = Binding.Group("Origin")
_FOCUS = {"overview": "#ranks-list", "rooms": "#rooms-list", "failures": "#failure-tree", "events": "#events-list"}
"""The widget that takes the keys in each view."""


PALETTE_KEY = Binding("ctrl+p", "command_palette", "Command palette", tooltip="Every view, toggle and theme by name")
"""Textual's own key, named in the help."""


class FrameReady(Message):
    """A frame was built by the worker (a newer one replaces one not yet drawn), with a rewind's news and the open
    detail panel's new text (None: unchanged, or no panel)."""

    def __init__(self, frame: Frame, note: str = "", panel: PanelBody | None = None) -> None:
        super().__init__()
        self.frame = frame
        self.note = note
        self.panel = panel

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady)


FILTER_HINT = "filter: room id, rank, instance, suspect, peer, echo, state, reason, class (enter applies, empty clears)"


ADDRESS_KEPT = 40
"""A banner's source keeps its first part whole when it is this short (`bootstrap tcp://HOST:PORT`)."""
SOURCE_KEPT = 12
"""Else it keeps this many cells at least before the options are cut."""


def _source_and_options(source: str, options: str, room: int) -> str:
    """The source and the view's options in `room` cells: the source cut first, down to its first part when short
    (a live one's address, which other commands take; a log's path is no such part), so the options stay whole
    where they fit, else cut at their end (a filter, which hides rows, comes first)."""
    if len(source) + 3 + len(options) <= room:
        return f"{source}   {options}"
    first = source.split(",")[0]
    whole = len(first) + 3 if first != source else len(first)  # `ADDR, …`: its end seen, so the address is whole
    kept = whole if len(first) <= ADDRESS_KEPT else SOURCE_KEPT
    title = squeeze(source, max(room - 3 - len(options), min(kept, room)))
    rest = room - len(title) - 3
    return f"{title}   {squeeze(options, rest)}" if rest > 0 else title


class KvtopApp(App[None]):
    """`top` for KV transfers.

    | Key | Action |
    | :- | :- |
    | o 1 / r 2 / f 3 / e 4 | Overview / rooms / failures / events |
    | / | Filter (recalls the last one; empty clears it) |
    | p | Pause (the model keeps collecting); rewound: play / pause the replay |
    | , / . | Step back / forward 10 s (rewinds a live session into its recording) |
    | < / > | Step back / forward 1 minute |
    | [ / ] | Previous / next failure origin in the recording |
    | b | Jump to a time (03:00, an ISO time, "5 minutes ago") |
    | L | Back to live (a recording: its end) |
    | x | Faults only (failed or stuck rooms; rooms view) |
    | s | Cycle the rooms' order (rooms view) |
    | d | Detail pane of the highlighted failure row (failures view) |
    | l | Lowest event level: info, debug (echoes, room traffic), warning, error (events view) |
    | enter | Room timeline / rank history / expand an origin |
    | t | Next theme |
    | ? | Help |
    | q | Quit |
    """

    CSS_PATH = "kvtop.tcss"
    TITLE = "kvtop"
    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?"),  # first: the footer keeps them at any width
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # a terminal's quit key (Textual: copy)
        Binding("o,1", "view('overview')", "Overview", key_display="o", show=False),  # the tabs name them
        Binding("r,2", "view('rooms')", "Rooms", key_display="r", show=False),
        Binding("f,3", "view('failures')", "Failures", key_display="f", show=False),
        Binding("e,4", "view('events')", "Events", key_display="e", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("p", "pause", "Pause"),
        Binding(
            "comma",
            "step(-1)",
            "Rewind",
            key_display=",",
            group=_STEP,
            tooltip="Step back 10 s (a live session: into its recording)",
        ),
        Binding("full_stop", "step(1)", "Forward", key_display=".", group=_STEP, tooltip="Step forward 10 s"),
        Binding("less_than_sign", "step(-6)", "Step back 1 minute", key_display="<", show=False),
        Binding("greater_than_sign", "step(6)", "Step forward 1 minute", key_display=">", show=False),
        Binding(
            "left_square_bracket",
            "origin(-1)",
            "Previous origin",
            key_display="[",
            group=_ORIGIN,
            tooltip="Previous failure origin in the recording",
        ),
        Binding(
            "right_square_bracket",
            "origin(1)",
            "Next origin",
            key_display="]",
            group=_ORIGIN,
            tooltip="Next failure origin in the recording",
        ),
        Binding(
            "b", "jump", "Jump to", show=False, tooltip="Jump to a time: 03:00, 2026-12-01T03:00:00, 5 minutes ago, now"
        ),
        Binding("L", "live", "Live", tooltip="Back to live"),
        Binding("L", "end", "End", tooltip="The recording's end (a recording alone: no live to go back to)"),
        Binding("x", "faults_only", "Faults only", tooltip="Faults only: failed or stuck rooms"),
        Binding("s", "sort", "Sort", tooltip="Sort the rooms: by age, idle time, bytes, room id"),
        Binding("d", "detail", "Detail", tooltip="The highlighted row's raw detail, in a side pane"),
        Binding(
            "l", "level", "Level", tooltip="Lowest event level: info, debug (echoes, room traffic), warning, error"
        ),
        Binding("t", "next_theme", "Next theme", show=False),
    ]

    paused: reactive[bool] = reactive(False)
    """Frozen views (a PAUSED banner shows); the source keeps collecting."""

    def __init__(
        self,
        source: Source | LocalFrames | ModelProcess,
        *,
        title: str = "",
        themes: ThemeSet | None = None,
        theme: str = DEFAULT_THEME,
        clock: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
        quit_after: float | None = None,
        rewind: Rewind | None = None,
        warnings: tuple[str, ...] = (),
        alerts: Callable[[], list[str]] | None = None,
    ) -> None:
        """`source`: a model in this process (read under its lock), or the model process (`ModelProcess`);
        `rewind`: the recording to rewind into (a live session's ring, or a recording alone); `warnings`:
        shown once the dashboard is up (why it does not record, say); `alerts`: asked at every refresh for what
        happened since (an embedded cluster's rank that exited), each shown as an error until dismissed."""
        super().__init__()
        self.animation_level = "none"  # a monitor switches views at once; sliding tab underlines cost 300 ms
        self.frames: FrameSource = (
            source if isinstance(source, LocalFrames | ModelProcess) else LocalFrames(source, clock)
        )
        self._warnings = warnings
        self._alerts = alerts
        self.rewind = rewind
        self.sub_title = title
        self.options = Options()
        self.frame: Frame | None = None
        self.frames_drawn = 0
        """Frames on screen (drawn and painted)."""
        self.draws: deque[tuple[float, float, str]] = deque(maxlen=10_000)
        """Per frame (the `bench ui` figures): when it was painted (time.monotonic), the UI-thread seconds from
        its arrival until then, and the view shown."""
        self.build_seconds: deque[float] = deque(maxlen=10_000)
        """Per frame: worker time to build it from the model, waiting for the lock included (and, from the
        model process, the question and the answer's way back)."""
        self.reads: deque[float] = deque(maxlen=10_000)
        """Per frame received: when its build read the model (`Frame.read_at`): how old the screen's data is."""
        self.failure: BaseException | None = None
        """What ended the dashboard, if something failed (the app then exits with return code 1)."""
        self._clock = clock
        self._refresh_s = refresh_s
        self._quit_after = quit_after
        self._tuning = DashboardTuning()
        self._building = False
        self._painting = False
        self._stale = False
        self._last_filter = ""
        self._replay_built: tuple[int, Options] | None = None
        """(rewind version, options) of the last frame built from the recording."""
        self._panel: tuple[PanelRequest, bool] | None = None
        """The open detail panel (its `shown` the version on screen), and whether that text is of a replay."""
        self._replay_panels = PanelFollower()
        """The open panel over the replayed model (the live one's follower is the frame source's)."""
        self._themes = themes or ThemeSet()
        for found in self._themes.themes.values():
            self.register_theme(found)
        if theme in self.available_themes:
            self.theme = theme
        self.palette = Palette.from_theme(self.current_theme)

    def compose(self) -> ComposeResult:
        yield Line(id="banner")
        yield Line(id="health")
        yield Tabs(*(Tab(Text(f"{name.title()} [{name[0]}]"), id=name) for name in VIEWS), id="tabs")
        with ContentSwitcher(initial="overview", id="views"):
            yield OverviewView(id="overview")
            yield RoomsView(id="rooms")
            yield FailuresView(id="failures")
            yield EventsView(id="events")
        yield Input(placeholder=FILTER_HINT, id="filter")
        yield Input(placeholder="jump to: 03:00, 2026-12-01T03:00:00, 5 minutes ago, now (enter jumps, escape cancels)",
                    id="jump")  # fmt: skip
        yield KeyFooter()

    def on_mount(self) -> None:
        self._tuning.apply()
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.query_one("#filter", Input).display = False
        self.query_one("#jump", Input).display = False
        self.query_one("#failure-detail").display = False
        self.query_one("#failure-detail").can_focus = False
        for warning in (*self._themes.warnings, *self._warnings):
            self.notify(warning, severity="warning")
        for signum, quit_ in ((signal.SIGHUP, self._hang_up), (signal.SIGTERM, self.exit)):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # quit, stopping our agents
                asyncio.get_running_loop().add_signal_handler(signum, quit_)
        if self._quit_after is not None:
            self.set_timer(self._quit_after, self.exit)
        self._draw_banner()
        self.set_interval(self._refresh_s, self._tick)
        self.request_frame()

    def on_resize(self) -> None:
        """The banner and health line fit the new width at once, not at the next frame."""
        if self.frame is not None and self.query("#banner"):
            self.call_after_refresh(self._draw_banner)
            self.call_after_refresh(self._draw_health, self.frame)

    def _hang_up(self) -> None:
        """SIGHUP: the terminal closed. Quit as `q` does, writing nothing more to it."""
        terminal_lost()
        self.exit()

    def on_unmount(self) -> None:
        self._tuning.restore()

    # --- frames -------------------------------------------------------------------------------------

    def _tick(self) -> None:
        if not self._painting:  # between frames (the next one is asked for now, and built elsewhere)
            self._tuning.collect()
        for alert in self._alerts() if self._alerts is not None else ():
            self.notify(alert, severity="error", timeout=ALERT_S)
        self.request_frame()
        if self.frame is not None and self.query("#banner"):
            self._draw_banner()  # a frame's age and a replay's "20m ago" move on while no frame comes
            self._draw_health(self.frame)  # and whether it is stale

    def request_frame(self) -> None:
        """Build a frame in a worker thread unless paused; while one is being built or painted, build after it.

        A paused replay builds only after a move or a change of options. Building never overlaps painting:
        the two would share the GIL, and a paint would take twice as long.
        """
        rewind = self.rewind
        if rewind is not None and rewind.engaged:
            if not rewind.busy and self._replay_built == (rewind.version, self.options):
                return
        elif self.paused:
            return
        if self._building or self._painting:
            self._stale = True  # the frame in hand may predate a key: another follows once it is painted
            return
        self._building, self._stale = True, False
        self.run_worker(partial(self._build_frame, self._pages()), thread=True, group="frame", exit_on_error=False)

    def _pages(self) -> dict[str, PageRequest]:
        """The rows of each long list around its scroll position (the events tail while it follows); the
        model process's defaults while the lists are not there (the app shutting down)."""
        lists = {row_list.id: row_list for row_list in self.query(RowList)}
        rooms, events = lists.get("rooms-list"), lists.get("events-list")
        if rooms is None or events is None:
            return {}
        height = max(rooms.size.height, events.size.height, self.size.height)
        tail = events.count == 0 or events.cursor >= events.count - 1
        return {
            "rooms": PageRequest.around(rooms.scroll_offset.y, height),
            "events": PageRequest.tail(height) if tail else PageRequest.around(events.scroll_offset.y, height),
        }

    @on(RowList.Missing)
    def _rows_missing(self) -> None:
        """A list scrolled past the rows its frame carries: fetch a frame at its new position."""
        self.request_frame()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A frame that failed to build ends the dashboard loudly: a frozen screen would look like health."""
        if event.worker.group == "frame" and event.state is WorkerState.ERROR:
            self.failure = event.worker.error
            self.exit(return_code=1)

    def _build_frame(self, pages: dict[str, PageRequest]) -> None:
        started = time.perf_counter()
        options, frame, note = self.options, None, ""
        if self.rewind is not None:
            version = self.rewind.version
            frame = self.rewind.build(options)
            if frame is None:
                note = self.rewind.live_note()
            else:
                self._replay_built = (version, options)
        if frame is None:
            frame = self.frames.build(options, pages)
        panel = self._panel_body(frame.replay is not None) if self._panel is not None else None
        self.build_seconds.append(time.perf_counter() - started)
        self.reads.append(frame.read_at)
        self.post_message(FrameReady(frame, note, panel))

    def _panel_body(self, replayed: bool, opening: PanelRequest | None = None) -> PanelBody | None:
        """The open panel's text from the model the views show (the replayed one, or the source's), if it changed
        since the version on screen; `opening`: a panel not on screen yet."""
        if opening is None:
            if self._panel is None:
                return None
            request, shown_replayed = self._panel
            if shown_replayed != replayed:  # that version is of the other model
                request = replace(request, shown=0)
        else:
            request = opening
        if replayed and self.rewind is not None:
            with self.rewind.lock:
                return self._replay_panels.follow(self.rewind.model, request, self.rewind.time)
        return self.frames.panel(request)

    def on_frame_ready(self, message: FrameReady) -> None:
        self._building = False
        if message.note:
            self.notify(message.note)
        if (self.paused and message.frame.replay is None) or not self.query("#health"):  # paused, or shutting down
            return
        started = time.perf_counter()
        self._painting = True
        if (message.frame.replay is None) != (self.frame is None or self.frame.replay is None):
            self.refresh_bindings()  # the footer's rewind keys: one while live, all while rewound
        self.frame = message.frame
        self._draw_banner()
        self.redraw()
        if message.panel is not None:
            self._show_panel(message.panel, message.frame.replay is not None)
        if isinstance(self.screen, DetailScreen):
            self.screen.at(self._panel_when(message.frame))
        self.call_after_refresh(self._painted, started)

    def _show_panel(self, body: PanelBody, replayed: bool) -> None:
        """The open panel's new text, unless it was closed (or another opened) since it was asked for."""
        screen = self.screen
        if self._panel is None or self._panel[0].subject != body.subject or not isinstance(screen, DetailScreen):
            return
        screen.show(body.text)
        self._panel = (replace(self._panel[0], shown=body.version), replayed)

    def _panel_when(self, frame: Frame) -> str:
        """What an open panel is of, on its border: `live`, or the replayed instant and how to move it."""
        replay = frame.replay
        if replay is None:
            return "live" if not self.paused else "live, paused"
        state = "playing" if replay.playing else "paused"
        back = "L live" if replay.live else "L end"
        return f"REPLAY {stamp(replay.time)[:-4]} ({since(self._clock() - replay.time)}), {state}: , . step  {back}"

    def _painted(self, started: float) -> None:
        self._painting = False
        self.draws.append((time.monotonic(), time.perf_counter() - started, self.active_view))
        self.frames_drawn += 1
        if self._stale:
            self.request_frame()

    def redraw(self) -> None:
        """Draw the health line and the visible view from the last frame."""
        if self.frame is None:
            return
        self._draw_health(self.frame)
        view = self.active_view
        if view == "overview":
            self.query_one(OverviewView).show(self.frame, self.palette)
        elif view == "rooms":
            self.query_one(RoomsView).show(self.frame, self.palette)
        elif view == "failures":
            self.query_one(FailuresView).show(self.frame, self.palette)
        else:
            self.query_one(EventsView).show(self.frame, self.palette)

    def _draw_health(self, frame: Frame) -> None:
        """Incidents first, then crashed ranks (only when there are some), the ranks, rates, failures in the window
        they cover, open and stuck rooms and lost batches; rejections and lost rooms only when there are some. Where
        the line is too narrow, the rates leave first, the failures in the window last, after losing their origins'
        count: incidents, crashes, ranks, stuck, gaps and a source's error always stay."""
        h, p = frame.health, self.palette
        ongoing = h.incidents_ongoing
        incidents = Text(f" {ongoing} incident{'' if ongoing == 1 else 's'} ongoing ", p.error if ongoing else "")
        parts = [(incidents, ESSENTIAL)]
        if self._is_stale(frame):  # what follows is as of the last frame: the model stopped answering
            parts.insert(0, (Text(f" no new data for {self._clock() - frame.now:.0f} s ", p.error), ESSENTIAL))
        if frame.replay is not None and frame.replay.unrecorded:  # what follows is as the recorder last saw it
            parts.insert(0, (Text(f" not recorded: as of {stamp(frame.now)[:-4]} ", p.warning), ESSENTIAL))
        if h.ranks_crashed:  # the server's own log said so: before the ranks, whatever the source
            parts.append((Text(f" {plural(h.ranks_crashed, 'rank')} crashed ", p.error), ESSENTIAL))
        if h.ranks_from_logs:  # log files tell no liveness
            parts.append((Text(f" {plural(h.ranks_from_logs, 'rank')} from logs", p.accent), ESSENTIAL))
        else:
            all_alive = h.ranks_alive == h.ranks_total
            ranks = Text(f" {h.ranks_alive}/{h.ranks_total} ranks alive", p.success if all_alive else p.error)
            parts.append((ranks, ESSENTIAL))
            if h.ranks_unheard:  # silent behind a relay's dead upstream (the source's error says which)
                parts.append((Text(f", {h.ranks_unheard} unheard", p.warning), ESSENTIAL))
            if h.ranks_idle:  # a sidecar's log silent: the server idle, or dead (`status` says it whole)
                parts.append((Text(f", {h.ranks_idle} idle", p.warning), ESSENTIAL))
            if h.ranks_down:
                parts.append((Text(f", {h.ranks_down} down", p.error), ESSENTIAL))
            if h.ranks_unlisted:  # running, but the bootstrap service refuses them: no peer finds them
                parts.append((Text(f", {h.ranks_unlisted} unlisted", p.error), ESSENTIAL))
        if not h.timed:  # logs alone (files, sidecars): no transfers, no room that succeeded
            failed = f"{plural(h.rooms_failed, 'room')} failed"
            failed, short = f"{failed} ({plural(h.failures, 'origin')}) in the last {WINDOW_S:g} s", failed
        else:
            parts += [(Text(f"  {h.rooms_per_s:.1f} rooms/s"), 3), (Text(f"  {units.gbps(h.gbps)}"), 4),
                      (Text(f"  p99 {h.latency_p99_s * 1000:.0f} ms"), 5)]  # fmt: skip
            span = h.span_s if h.span_s < WINDOW_S - 0.5 else WINDOW_S  # the snapshots held less than the window
            short = f"{h.failure_rate:.1%} failed in {span:.0f} s"
            failed = f"{h.failure_rate:.1%} failed in {'the last ' if span < WINDOW_S else ''}{span:.0f} s"
            failed += f" ({plural(h.failures, 'origin')})"
        shorter = {len(parts): Text(f"  {short}", p.error if h.failures else "")}  # how bad stays on a narrow line
        parts.append((Text(f"  {failed}", p.error if h.failures else ""), 1))
        if h.aborted:
            parts.append((Text(f"  {plural(h.aborted, 'client abort')}", p.accent), 2))
        parts += [(Text(f"  {h.rooms_open} open"), 3),
                  (Text(f"  {h.stuck} stuck", p.warning if h.stuck else ""), ESSENTIAL),
                  (Text(f"  {h.gaps} gaps", p.warning if h.gaps else ""), ESSENTIAL)]  # fmt: skip
        for count, what in ((h.rejected, "rejected"), (h.lost, "rooms lost")):
            if count:
                parts.append((Text(f"  {count} {what}", p.warning), 2))
        if h.refusals:  # the service's latest refusal named where there is room, else only counted
            refused = f"  {plural(h.refusals, 'registration')} refused"
            shorter[len(parts)] = Text(refused, p.warning)
            parts.append((Text(f"{refused}, latest {h.refusal}", p.warning), 2))
        if frame.error:
            parts.append((Text(f"  source: {frame.error}", p.error), ESSENTIAL))
        health = self.query_one("#health", Line)
        health.show(fit(parts, health.size.width, shorter))

    def _draw_banner(self) -> None:
        """The source and the view's options on the left; on the right the time the data is of (and, live, how old
        it is) and `? help`, which stay however narrow the terminal is."""
        banner = self.query_one("#banner", Line)
        frame = self.frame
        replay = frame.replay if frame is not None else None
        banner.set_class(self.paused and replay is None, "paused")
        banner.set_class(replay is not None, "replay")
        banner.set_class(frame is not None and self._is_stale(frame), "stale")
        options = self.options
        flags = [f"filter '{options.filter}'" if options.filter else "", "faults only" if options.faults_only else "",
                 f"sort {options.sort}", f"events >= {options.level}"]  # fmt: skip
        head = self._replay_head(replay) if replay is not None else "PAUSED (p resumes)  " if self.paused else ""
        right = f"   {self._data_time(frame)}   ? help " if frame is not None and replay is None else "   ? help "
        left = f" {head}kvtop  "
        room = banner.size.width - len(left) - len(right) if banner.size.width else 1 << 16
        middle = _source_and_options(self.sub_title, f"[{', '.join(f for f in flags if f)}]", room)
        banner.show(f"{left}{middle}{' ' * (room - len(middle)) if banner.size.width else ''}{right}")

    def _data_time(self, frame: Frame) -> str:
        """`as of 10:02:11, <1 s old` (a live source: how long ago, by the source's clock, the frame's data was
        read, in whole seconds: the banner changes once a second, not at every frame), or the time logs are at."""
        if frame.health.of_logs:
            return f"logs as of {stamp(frame.now, dated=True)[:19]}"
        age = self._clock() - frame.now
        return f"as of {stamp(frame.now)[:8]}, {'<1' if age < 1 else f'{age:.0f}'} s old"

    def _is_stale(self, frame: Frame) -> bool:
        """A live frame no newer one followed in `STALE_AFTER_S` while not paused (logs and replays never are)."""
        live = frame.replay is None and not frame.health.of_logs
        return live and not self.paused and self._clock() - frame.now >= STALE_AFTER_S

    def _replay_head(self, replay: Replayed) -> str:
        """`REPLAY 03:00:12 (20m ago) - paused`, with the last move's news; the date when it is not today's."""
        now = self._clock()
        dated = time.localtime(replay.time)[:3] != time.localtime(now)[:3]
        state = (
            "playing (p pauses)"
            if replay.playing
            else f"paused (p plays, b jumps, L {'live' if replay.live else 'end'})"
        )
        if not replay.live and replay.time >= replay.end:
            state = "the recording's end, " + state
        gap = ""
        if replay.unrecorded:
            stopped, started = (stamp(t, dated)[:-4] for t in replay.unrecorded)
            gap = f"not recorded (the recorder did not run from {stopped} to {started}): shown as of {stopped}"
        notes = (gap, replay.note, "inexact: some of it was lost" * replay.inexact)
        extra = "".join(f" · {part}" for part in notes if part)
        return f"REPLAY {stamp(replay.time, dated)[:-4]} ({since(now - replay.time)}) — {state}{extra}   "

    def _theme_changed(self, _: object) -> None:
        self.palette = Palette.from_theme(self.current_theme)
        if self._panel is not None:  # the next frame brings it in the new colours
            self._panel = (replace(self._panel[0], palette=self.palette), self._panel[1])
        self.redraw()

    def _options_changed(self, **changes: object) -> None:
        self.options = replace(self.options, **changes)  # type: ignore[arg-type]
        self._draw_banner()
        self.request_frame()

    @property
    def active_view(self) -> str:
        return self.query_one("#views", ContentSwitcher).current or "overview"

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): every view and toggle, and each theme, besides Textual's own."""
        yield from super().get_system_commands(screen)
        for view, about in _VIEW_HELP.items():
            yield SystemCommand(f"View: {view}", about, partial(self.action_view, view))
        yield SystemCommand("Pause / resume", "Freeze the views (the model keeps collecting)", self.action_pause)
        if self.rewind is not None:
            yield SystemCommand("Rewind: step back", "10 s back in the recording", partial(self.action_step, -1))
            yield SystemCommand("Rewind: jump to a time", "An ISO time, 03:00, 5 minutes ago", self.action_jump)
            yield SystemCommand("Rewind: previous failure origin", "In the recording", partial(self.action_origin, -1))
            yield SystemCommand("Rewind: next failure origin", "In the recording", partial(self.action_origin, 1))
            yield SystemCommand("Rewind: back to live", "The live model (a recording: its end)", self.action_live)
        yield SystemCommand("Faults only", "Only failed or stuck rooms", self.action_faults_only)
        yield SystemCommand("Sort rooms", "Cycle age, idle, bytes, room id", self.action_sort)
        yield SystemCommand("Filter", "Filter rooms, failures and events by text", self.action_filter)
        yield SystemCommand("Detail pane", "The highlighted failure row's raw detail", self.action_detail)
        yield SystemCommand("Event level", "Info, debug (echoes, room traffic), warning, error", self.action_level)
        for name in sorted(self._themes.themes):
            yield SystemCommand(f"Theme: {name}", "Switch the colours", partial(setattr, self, "theme", name))

    # --- actions ------------------------------------------------------------------------------------

    def action_view(self, view: str) -> None:
        """Switch now, not when the tab's message comes back: a key typed right after the view's key (`f` then
        `enter`, read from the terminal together) is queued already, and must find the new view's list."""
        self.query_one("#tabs", Tabs).active = view
        self._switch_to(view)

    @on(Tabs.TabActivated, "#tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        view = event.tab.id or "overview"
        if self.focused is not self.query_one(_FOCUS[view]):  # a click on the tab, or the first tab at start
            self._switch_to(view)

    def _switch_to(self, view: str) -> None:
        self.query_one("#views", ContentSwitcher).current = view
        self.refresh_bindings()
        self._view_shown()

    def _view_shown(self) -> None:
        """Draw the view now (from the last frame: no waiting for the timer) and focus its list at once
        (`Widget.focus` would queue the focus behind the keys queued already)."""
        self.redraw()
        self.screen.set_focus(self.query_one(_FOCUS[self.active_view]))

    def action_filter(self) -> None:
        """Open the filter box: the filter in force to edit, else empty with the last one as its hint."""
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.options.filter
        last = f" (last: {self._last_filter})" if self._last_filter and not self.options.filter else ""
        box.placeholder = f"{FILTER_HINT}{last}"
        box.focus()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        text = event.value.strip()
        if text:
            self._last_filter = text
        self._options_changed(filter=text)
        self._view_shown()

    def action_pause(self) -> None:
        if self.rewind is not None and self.rewind.engaged:
            self.rewind.play()
            self.request_frame()
        else:
            self.paused = not self.paused

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The rewind keys exist only with a recording to rewind into. While live the footer shows `, Rewind`
        alone: `[` then works through `key_left_square_bracket` (False hides a binding and passes its key
        on), and `.`, `]` and `L` have nothing ahead of the present to go to. `L` is `live`, or on a recording
        alone `end`. A view's own keys (`x`, `s`, `d`, `l`) work, and show, in their view only."""
        if action in _VIEW_ACTIONS:
            return self.active_view == _VIEW_ACTIONS[action]
        if action not in REWIND_ACTIONS:
            return True
        if self.rewind is None or self._not_this_l(action):
            return False
        return self.rewind.engaged or action == "jump" or (action == "step" and int(str(parameters[0])) < 0)

    def key_left_square_bracket(self) -> None:
        self.action_origin(-1)

    def action_step(self, steps: int) -> None:
        if self.rewind is not None:
            self.rewind.step(steps * (STEP_S if abs(steps) == 1 else BIG_STEP_S / 6))
            self._moved()

    def action_origin(self, direction: int) -> None:
        if self.rewind is not None:
            self.rewind.origin(direction)
            self._moved()

    def action_live(self) -> None:
        if self.rewind is not None:
            self.rewind.back_to_live()
            self._moved()

    def action_end(self) -> None:
        """`L` on a recording alone: its end (what going back to live means there)."""
        self.action_live()

    def _not_this_l(self, action: str) -> bool:
        """`L` is `live` on a live session and `end` on a recording alone: the other one is not this source's."""
        alone = self.rewind is not None and not self.rewind.live
        return action == ("live" if alone else "end")

    def action_jump(self) -> None:
        box = self.query_one("#jump", Input)
        box.display = True
        box.value = ""
        box.focus()

    @on(Input.Submitted, "#jump")
    def _jump_submitted(self, event: Input.Submitted) -> None:
        from kvtop.source.when import parse_time

        event.input.display = False
        self._view_shown()
        if not event.value.strip() or self.rewind is None:
            return
        try:
            when = parse_time(event.value, now=self._clock())
        except ValueError as error:
            self.notify(str(error), severity="error")
            return
        self.rewind.jump(when)
        self._moved()

    def _moved(self) -> None:
        """A rewind move was queued: the views follow the replay (a live pause gives way to it)."""
        self.paused = False
        self.refresh_bindings()
        self.request_frame()

    def watch_paused(self, paused: bool) -> None:
        self._draw_banner()
        if not paused:
            self.request_frame()

    def action_faults_only(self) -> None:
        self._options_changed(faults_only=not self.options.faults_only)

    def action_sort(self) -> None:
        orders = list(RoomSort)
        self._options_changed(sort=orders[(orders.index(self.options.sort) + 1) % len(orders)])

    def action_level(self) -> None:
        self._options_changed(level=LEVEL_CYCLE[(LEVEL_CYCLE.index(self.options.level) + 1) % len(LEVEL_CYCLE)])

    def action_detail(self) -> None:
        self.query_one(FailuresView).toggle_detail()

    def action_next_theme(self) -> None:
        names = sorted(self._themes.themes) or sorted(self.available_themes)
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]

    def action_help(self) -> None:
        of_view = {view: [b for b in self.BINDINGS if isinstance(b, Binding) and _VIEW_ACTIONS.get(b.action) == view]
                   for view in ("rooms", "failures", "events")}  # fmt: skip
        everywhere = [b for b in self.BINDINGS if not isinstance(b, Binding) or self._works_everywhere(b.action)]
        everywhere.append(PALETTE_KEY)  # under 100 columns the footer leaves it out
        self.push_screen(
            HelpScreen({"Everywhere": everywhere, "Lists": RowList.BINDINGS, "Rooms": [*of_view["rooms"]],
                        "Failures": [*FailuresView.BINDINGS, *of_view["failures"]], "Events": [*of_view["events"]]})
        )  # fmt: skip

    def _works_everywhere(self, action: str) -> bool:
        """`?` lists it under "Everywhere": not a view's own key, nor a rewind key with nothing to rewind into, nor
        the other meaning of `L`."""
        name = action.partition("(")[0]  # `step(-1)`: the action, not its call
        rewinds = self.rewind is not None and not self._not_this_l(name)
        return name not in _VIEW_ACTIONS and (rewinds or name not in REWIND_ACTIONS)

    def key_escape(self) -> None:
        for box in self.query("#filter, #jump").results(Input):
            if box.display:
                box.display = False
                self._view_shown()

    @on(RowList.Selected)
    def _row_selected(self, event: RowList.Selected) -> None:
        key: int | str | None = None
        if event.row_list.id == "rooms-list":
            kind, key = "room", self.query_one(RoomsView).selected_room(event.index)
        elif event.row_list.id == "ranks-list":
            kind, key = "rank", self.query_one(OverviewView).selected_rank(event.index)
        if key is None:
            return
        replayed = self.frame is not None and self.frame.replay is not None  # the model the views show
        request = PanelRequest(kind, key, self.palette)
        body = self._panel_body(replayed, opening=request)
        if body is not None:
            self._panel = (replace(request, shown=body.version), replayed)
            panel = DetailScreen(body.text)
            self.push_screen(panel, self._panel_closed)
            if self.frame is not None:
                panel.call_after_refresh(panel.at, self._panel_when(self.frame))

    def _panel_closed(self, _: None) -> None:
        self._panel = None
