"""The load behind `kvtop bench ui`: a big synthetic model and a feeder thread that streams events into it.

Runs inside the dashboard's process (`python -m kvtop.bench.ui_load`, started by
`kvtop bench ui` on a pseudo-terminal); writes the app's frame timings as JSON
on exit, with the moments each frame's build read the model (`ReadClock`), so
that the bench can tell how old the data on screen was.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from dataclasses import dataclass

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster
from transport.events import EventBatch

FEED_EVERY_S = 0.05
SWEEP_EVERY_S = 0.5
"""As often as the collector retires finished rooms."""


@dataclass
class BenchSource:
    model: ClusterModel
    lock: threading.Lock
    error: str = ""


def fill(model: ClusterModel, rooms: int, instances: int, tp: int, now: float) -> None:
    """`rooms` rooms over the last 100 s, nearly all still open (a third of those stalled), a few failed."""
    base = SyntheticCluster(instances, instances, tp, start=now - 100.0, spacing_s=100.0 / rooms,
                            failure_rate=0.01, open_rate=0.97, seed=1)  # fmt: skip
    for label, batch in base.hello():
        model.apply(label, batch, now)
    for first in range(0, rooms, 5000):
        for label, batch in base.rooms(min(5000, rooms - first), first):
            model.apply(label, batch, now)


class ReadClock:
    """The dashboard's clock: a frame's build asks it for `now` once it holds the model's lock, so the
    worker thread's calls mark when each frame read the model (time.monotonic, as the app's draws)."""

    def __init__(self) -> None:
        self.reads: deque[float] = deque(maxlen=10_000)

    def __call__(self) -> float:
        if threading.current_thread() is not threading.main_thread():
            self.reads.append(time.monotonic())
        return time.time()


class Feeder(threading.Thread):
    """Applies new rooms' events at `events_per_s`, in steps of `FEED_EVERY_S`, as the collector would."""

    def __init__(
        self, source: BenchSource, instances: int, tp: int, events_per_s: float, recorder: Recorder | None = None
    ) -> None:
        """`recorder`: told every delivery, sweep and pass end under the lock, as the live collector tells it."""
        super().__init__(name="bench-feeder", daemon=True)
        self.source = source
        self.recorder = recorder
        events_per_room = 2 * tp * 5 + tp
        self.rooms_per_step = max(1, round(events_per_s * FEED_EVERY_S / events_per_room))
        self.stream = SyntheticCluster(instances, instances, tp, start=time.time(),
                                       spacing_s=FEED_EVERY_S / self.rooms_per_step, seed=2)  # fmt: skip
        self.applied = 0
        self.started = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        self.started = time.monotonic()
        next_sweep = 0.0
        step = 0
        while not self.stop.wait(max(0.0, self.started + step * FEED_EVERY_S - time.monotonic())):
            batches: list[tuple[str, EventBatch]] = self.stream.rooms(self.rooms_per_step, step * self.rooms_per_step)
            now = time.time()
            recorder, model = self.recorder, self.source.model
            with self.source.lock:
                for label, batch in batches:
                    if recorder is not None:
                        recorder.delivered(label, batch, now)
                    model.apply(label, batch, now)
                    self.applied += len(batch.events)
                if now >= next_sweep:
                    model.sweep(now)
                    next_sweep = now + SWEEP_EVERY_S
                    if recorder is not None:
                        recorder.swept(now)
                if recorder is not None:
                    recorder.accounted(model, now)
                    recorder.tick(model, now)
            step += 1

    def rate(self) -> float:
        return self.applied / max(1e-9, time.monotonic() - self.started)


def main() -> None:
    from kvtop.cli.dashboard_record import DEFAULT_MAX_BYTES, KEYFRAME_EVENTS
    from kvtop.tui.app import KvtopApp
    from kvtop.tui.rewind import Rewind
    from kvtop.tui.themes import load_themes

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rooms", type=int, required=True)
    parser.add_argument("--instances", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--events-per-s", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", default="", help="Record into this folder, as the dashboard does by default.")
    args = parser.parse_args()
    source = BenchSource(ClusterModel(JOURNAL_EVENTS_KEPT), threading.Lock())
    fill(source.model, args.rooms, args.instances, args.tp, time.time())
    recorder = None
    if args.record:  # as the dashboard records (kvtop.cli.dashboard_record)
        recorder = Recorder(args.record, max_bytes=DEFAULT_MAX_BYTES, keyframe_events=KEYFRAME_EVENTS).start()
        recorder.tick(source.model, time.time())  # its first keyframe, under the lock, before the dashboard runs
    feeder = Feeder(source, args.instances, args.tp, args.events_per_s, recorder)
    clock = ReadClock()
    rewind = Rewind(args.record, live=True) if args.record else None
    app = KvtopApp(source, title="bench ui", themes=load_themes(), clock=clock, rewind=rewind)
    app.call_later(feeder.start)
    app.run()
    feeder.stop.set()
    feeder.join()
    if recorder is not None:
        recorder.close()
    result = {
        "draws": list(app.draws),
        "build_s": list(app.build_seconds),
        "reads": list(clock.reads),
        "events_per_s": feeder.rate(),
        "rooms": len(source.model.rooms) + len(source.model.finished),
        "ranks": len(source.model.ranks),
        "recorded_events": recorder.stats().events if recorder is not None else 0,
        "recorder_error": recorder.stats().error if recorder is not None else "",
    }
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
