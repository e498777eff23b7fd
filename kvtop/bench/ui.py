"""`kvtop bench ui`: the dashboard on a big synthetic cluster, in a real terminal, while events stream in.

The dashboard runs in a child process on a pseudo-terminal (`kvtop.bench.ui_load`:
a model of `rooms` rooms over 64 ranks by default, and a feeder thread applying
`events_per_s` new events under the model's lock). This process types keys into
the terminal and reads what the dashboard writes back, so key-to-screen is what a
person would see: from the key's bytes to the bytes of the new view on the
terminal. Frame times come from the dashboard itself:

- frame: UI-thread time from a frame's arrival until it is painted (written to the terminal), while
  a person watches: each view in turn for a quarter of `seconds`, no keys pressed;
- build: worker-thread time to build a frame from the model (lock wait included);
- data age: how old the data on screen is, from the moment a frame's build read the model (its lock
  held) to the moment it was painted (`data_age_at_paint`) and to the moment the next frame replaced
  it (`data_age_on_screen`: the oldest the screen's data got; at least the refresh interval);
- key to screen: then for half of `seconds`, a view key every 0.25 s (a view switch repaints the
  whole screen: the heaviest key there is).

The run fails (BenchFailed) when a watched view painted no frame or a key's view did not show
within `key_timeout_s`: a percentile of nothing is not a figure.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from kvtop.bench import BenchFailed
from kvtop.bench.report import Report, at_most
from kvtop.model.rolling import percentiles

VIEW_KEYS = (("r", b"rooms, by"), ("f", b"failure groups"), ("e", b"events at"), ("o", b"the last 5 min"))
"""A key and bytes that only the view it opens writes (its title)."""
_VIEW_NAMES = {"r": "rooms", "f": "failures", "e": "events", "o": "overview"}
_COLUMNS, _LINES = 160, 50


@dataclass(frozen=True)
class UiResult:
    frame_ms_p50: float
    frame_ms_p99: float
    frame_ms_p99_by_view: dict[str, float]
    build_ms_p50: float
    build_ms_p99: float
    data_age_at_paint_ms_p50: float
    data_age_at_paint_ms_p99: float
    """From a frame's read of the model until it was painted."""
    data_age_on_screen_ms_p50: float
    data_age_on_screen_ms_p99: float
    """From a frame's read of the model until the next frame replaced it (the oldest the screen got)."""
    key_to_screen_ms: float
    """Median over the key presses."""
    key_to_screen_ms_p99: float
    rooms: int
    ranks: int
    events_per_s: float
    """Events the feeder actually applied per second while the dashboard ran."""
    frames: int
    keys: int
    """Key presses whose view showed in time: all of `keys_pressed`, or the run fails."""
    keys_pressed: int
    recording: bool = False
    """The dashboard recorded what it was fed (its default on a live cluster), its writer thread doing the I/O."""
    recorded_events: int = 0
    in_process: bool = False
    """The load ran in the dashboard's own process (`--in-process`), not in its model process."""

    REPORT: ClassVar[Report] = Report(
        setting=("rooms", "ranks", "events_per_s", "recording", "in_process"),
        targets=(
            at_most("frame_ms_p99", 40.0),
            at_most("key_to_screen_ms", 80.0),
            at_most("key_to_screen_ms_p99", 200.0),
            at_most("data_age_at_paint_ms_p99", 250.0),
        ),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Terminal:
    """A child process on a pseudo-terminal: type bytes, wait for bytes."""

    def __init__(self, command: list[str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", _LINES, _COLUMNS, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(_COLUMNS), "LINES": str(_LINES)}
        self.process = subprocess.Popen(
            command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.seen = b""

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait_for(self, marker: bytes, timeout_s: float) -> bool:
        """Read until `marker` shows up in the output written since the last call (True) or time runs out."""
        self.seen = b""
        deadline = time.monotonic() + timeout_s
        while marker not in self.seen[-(len(marker) + 65536) :]:
            left = deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                return False
            if select.select([self.master], [], [], left)[0]:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.master, 1 << 16)
        return True

    def drain(self, seconds: float) -> None:
        """Read (and forget) what the dashboard writes for `seconds`."""
        self.wait_for(b"\0never\0", seconds)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.master)


def _ms(seconds: list[float], point: float) -> float:
    return round(percentiles(np.array(seconds) * 1000, (point,))[0], 2)


def data_ages(reads: list[float], paints: list[float]) -> tuple[list[float], list[float]]:
    """Per painted frame, its data's age (seconds) when painted and when the next frame replaced it.

    `reads`: when builds read the model; `paints`: when frames were painted (one clock, sorted). A frame
    shows the data of the last read before its paint (builds never overlap paints)."""
    at_paint: list[float] = []
    on_screen: list[float] = []
    for index, painted in enumerate(paints):
        read = bisect_right(reads, painted) - 1
        if read < 0:
            continue
        at_paint.append(painted - reads[read])
        if index + 1 < len(paints):
            on_screen.append(paints[index + 1] - reads[read])
    return at_paint, on_screen


def missing(frames_by_view: dict[str, int], keys: int, pressed: int, key_timeout_s: float) -> str:
    """What a run lacked to be a measurement ("" when nothing): views that painted no frame, unanswered keys."""
    problems = [f"no frame painted while watching {view}" for view, count in frames_by_view.items() if not count]
    if pressed == 0:
        problems.append("no key was pressed")
    elif keys < pressed:
        problems.append(f"{pressed - keys} of {pressed} keys did not show their view within {key_timeout_s:g} s")
    return "; ".join(problems)


def measure_ui(
    rooms: int,
    instances: int,
    tp: int,
    events_per_s: float,
    seconds: float,
    progress: Callable[[str], None],
    key_timeout_s: float = 5.0,
    record: bool = False,
    in_process: bool = False,
) -> UiResult:
    """`record`: the dashboard records what it is fed into a ring in a temp folder (its live default);
    `in_process`: the load runs in the dashboard's process, not in a model process (the design before)."""
    folder = Path(tempfile.mkdtemp(prefix="kvtop-bench-ui-"))
    out = folder / "timings.json"
    command = [sys.executable, "-m", "kvtop.bench.ui_load", "--rooms", str(rooms), "--instances", str(instances),
               "--tp", str(tp), "--events-per-s", str(events_per_s), "--out", str(out),
               *(["--record", str(folder / "ring")] if record else []),
               *(["--in-process"] if in_process else [])]  # fmt: skip
    progress(f"starting the dashboard on {rooms:,} rooms over {2 * instances * tp} ranks ...")
    terminal = Terminal(command)
    keys: list[float] = []
    watched: list[tuple[float, float, str]] = []
    step = 0
    try:
        if not terminal.wait_for(b"ranks alive", 120.0):
            raise BenchFailed(f"the dashboard did not start: {terminal.seen[-2000:]!r}")
        progress(f"watching each view for {seconds / 4:g} s while {events_per_s:,.0f} events/s stream in ...")
        for key, marker in VIEW_KEYS:
            terminal.type(key.encode())
            terminal.wait_for(marker, 5.0)
            terminal.drain(0.5)  # the switch's own repaint is a key's cost, not a frame's
            started = time.monotonic()
            terminal.drain(seconds / 4)
            watched.append((started, time.monotonic(), _VIEW_NAMES[key]))
        progress(f"typing a view key every 0.25 s for {seconds / 2:g} s ...")
        started = time.monotonic()
        while time.monotonic() - started < seconds / 2:
            terminal.drain(0.25)
            key, marker = VIEW_KEYS[step % len(VIEW_KEYS)]
            pressed = time.perf_counter()
            terminal.type(key.encode())
            if terminal.wait_for(marker, key_timeout_s):
                keys.append(time.perf_counter() - pressed)
            step += 1
        terminal.type(b"q")
        deadline = time.monotonic() + 30.0
        while terminal.process.poll() is None and time.monotonic() < deadline:
            terminal.drain(0.1)  # a terminal nobody reads blocks the writer
        if terminal.process.poll() is None:
            raise BenchFailed("the dashboard did not quit on q within 30 s")
    finally:
        terminal.close()
        written = out.read_text() if out.exists() else ""
        shutil.rmtree(folder, ignore_errors=True)  # the ring it recorded: ~18 MiB a run
    if terminal.process.returncode != 0:
        raise BenchFailed(f"the dashboard exited with {terminal.process.returncode}: {terminal.seen[-2000:]!r}")
    if not written:
        raise BenchFailed("the dashboard exited 0 and wrote no timings")
    timings = json.loads(written)
    draws = timings["draws"]
    steady = [(seconds, view) for at, seconds, view in draws if any(a <= at <= b for a, b, _ in watched)]
    frames = [seconds for seconds, _ in steady]
    views = {view for _, view in steady}
    by_window = {key: sum(1 for at, _, _ in draws if a <= at <= b) for a, b, key in watched}
    progress(f"{len(frames)} frames watched, {len(keys)} of {step} keys answered")
    lacking = missing(by_window, len(keys), step, key_timeout_s)
    if record and (timings["recorder_error"] or not timings["recorded_events"]):
        lacking = "; ".join(filter(None, [lacking, f"nothing recorded ({timings['recorder_error'] or 'no events'})"]))
    if lacking:
        raise BenchFailed(lacking)
    paints = [at for at, _, _ in draws]
    at_paint, on_screen = data_ages(sorted(timings["reads"]), paints)
    in_window = [i for i, at in enumerate(paints) if any(a <= at <= b for a, b, _ in watched)]
    at_paint_watched = [at_paint[i] for i in in_window if i < len(at_paint)]
    on_screen_watched = [on_screen[i] for i in in_window if i < len(on_screen)]
    if not on_screen_watched:
        raise BenchFailed("no watched frame's read of the model was recorded: its data age is unknown")
    return UiResult(
        frame_ms_p50=_ms(frames, 50),
        frame_ms_p99=_ms(frames, 99),
        frame_ms_p99_by_view={view: _ms([s for s, v in steady if v == view], 99) for view in sorted(views)},
        build_ms_p50=_ms(timings["build_s"], 50),
        build_ms_p99=_ms(timings["build_s"], 99),
        data_age_at_paint_ms_p50=_ms(at_paint_watched, 50),
        data_age_at_paint_ms_p99=_ms(at_paint_watched, 99),
        data_age_on_screen_ms_p50=_ms(on_screen_watched, 50),
        data_age_on_screen_ms_p99=_ms(on_screen_watched, 99),
        key_to_screen_ms=round(statistics.median(keys) * 1000, 2),
        key_to_screen_ms_p99=_ms(keys, 99),
        rooms=timings["rooms"],
        ranks=timings["ranks"],
        events_per_s=round(timings["events_per_s"]),
        frames=len(frames),
        keys=len(keys),
        keys_pressed=step,
        recording=record,
        recorded_events=timings["recorded_events"],
        in_process=in_process,
    )
