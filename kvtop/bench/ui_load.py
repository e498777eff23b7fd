"""The load behind `kvtop bench ui`: a big synthetic model and a feeder thread that streams events into it.

`python -m kvtop.bench.ui_load` (started by `kvtop bench ui` on a pseudo-terminal) is the dashboard; the
model and the feeder live in its model process (`BenchLoad`, opened there as the live source is), or in the
dashboard's own process with `--in-process` (the design before the split). Writes the app's frame timings as
JSON on exit, with the moment each frame's build read the model (`Frame.read_at`), so that the bench can
tell how old the data on screen was, and the feeder's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from dataclasses import dataclass

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.dashboard import DEFAULT_MAX_BYTES, KEYFRAME_EVENTS
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.tui.model_server import ServedModel
from transport.plane.events import EventBatch

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
        self.ended = 0.0
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
        self.ended = time.monotonic()

    def rate(self) -> float:
        return self.applied / max(1e-9, (self.ended or time.monotonic()) - self.started)


@dataclass(frozen=True)
class BenchLoad:
    """The load as a model process opens it (`kvtop.tui.model_server`): the model filled, the feeder running,
    recording into `record` when given, as the dashboard's live source does."""

    rooms: int
    instances: int
    tp: int
    events_per_s: float
    record: str = ""

    def open(self, stack: contextlib.ExitStack) -> ServedModel:
        source = BenchSource(ClusterModel(JOURNAL_EVENTS_KEPT), threading.Lock())
        fill(source.model, self.rooms, self.instances, self.tp, time.time())
        recorder = None
        if self.record:  # as the dashboard records (kvtop.record.dashboard)
            recorder = Recorder(self.record, max_bytes=DEFAULT_MAX_BYTES, keyframe_events=KEYFRAME_EVENTS).start()
            stack.callback(recorder.close)
            with source.lock:  # its first keyframe, before the dashboard runs (as a collector's start)
                recorder.tick(source.model, time.time())
        feeder = Feeder(source, self.instances, self.tp, self.events_per_s, recorder)
        feeder.start()
        stack.callback(feeder.join)
        stack.callback(feeder.stop.set)

        def stats() -> dict[str, object]:
            return {
                "events_per_s": feeder.rate(),
                "rooms": len(source.model.rooms) + len(source.model.finished),
                "ranks": len(source.model.ranks),
                "recorded_events": recorder.stats().events if recorder is not None else 0,
                "recorder_error": recorder.stats().error if recorder is not None else "",
            }

        return ServedModel(
            source.model,
            source.lock,
            recorder_error=lambda: recorder.error if recorder is not None else "",
            record_folder=self.record,
            stats=stats,
        )


def main() -> None:
    from kvtop.tui.app import KvtopApp
    from kvtop.tui.model_client import ModelProcess
    from kvtop.tui.rewind import Rewind
    from kvtop.tui.themes import load_themes

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rooms", type=int, required=True)
    parser.add_argument("--instances", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--events-per-s", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", default="", help="Record into this folder, as the dashboard does by default.")
    parser.add_argument(
        "--in-process", action="store_true", help="Load and dashboard in one process (the design before the split)."
    )
    args = parser.parse_args()
    load = BenchLoad(args.rooms, args.instances, args.tp, args.events_per_s, args.record)
    rewind = Rewind(args.record, live=True) if args.record else None
    with contextlib.ExitStack() as stack:
        if args.in_process:
            served = load.open(stack)
            source: BenchSource | ModelProcess = BenchSource(served.model, served.lock)
        else:
            source = stack.enter_context(ModelProcess(load))
        app = KvtopApp(source, title="bench ui", themes=load_themes(), rewind=rewind)
        app.run()
    stats = source.stats if isinstance(source, ModelProcess) else served.stats()
    result = {"draws": list(app.draws), "build_s": list(app.build_seconds), "reads": list(app.reads), **stats}
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
