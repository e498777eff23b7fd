"""Recordings of the synthetic cluster, made as a live collector would (for tests and `kvtop bench replay`).

`feed` plays a collector: it applies the synthetic cluster's batches to a model at arrival times
`spacing_s` apart, telling the recorder each op under the same order the live `Collector` uses
(deliveries, account, sweep, tick)."""

from __future__ import annotations

from collections.abc import Callable

from kvtop.model.cluster import ClusterModel
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster

SWEEP_EVERY_S = 0.5


def feed(
    recorder: Recorder,
    model: ClusterModel,
    cluster: SyntheticCluster,
    passes: int,
    rooms_per_pass: int,
    pass_s: float = 0.05,
    start: float | None = None,
    on_pass: Callable[[float], None] | None = None,
) -> float:
    """`passes` collector passes `pass_s` apart, each delivering the batches of `rooms_per_pass` rooms;
    returns the time of the last pass. `on_pass(now)` runs after each (a test samples the model there)."""
    now = cluster.start if start is None else start
    next_sweep = now
    if start is None:
        recorder.tick(model, now)
        for label, batch in cluster.hello():
            recorder.delivered(label, batch, now)
            model.apply(label, batch, now)
    for index in range(passes):
        now += pass_s
        for label, batch in cluster.rooms(rooms_per_pass, first=index * rooms_per_pass):
            recorder.delivered(label, batch, now)
            model.apply(label, batch, now)
        recorder.accounted(model, now)
        if now >= next_sweep:
            model.sweep(now)
            recorder.swept(now)
            next_sweep = now + SWEEP_EVERY_S
        recorder.tick(model, now)
        if on_pass is not None:
            on_pass(now)
    return now
