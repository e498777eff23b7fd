"""`kvtop bench export`: a Prometheus scrape of a big model vs a `kvtop status --json` frame of the same model.

The model is the dashboard benchmark's (`ui_load.fill`): 100k rooms over the last
100 s, nearly all still open (a third stalled), 64 ranks, failures with echoes. A
scrape is the whole body the HTTP server sends (`generate_latest` over the
exporter's registry). The first scrape folds every failure the model holds;
later ones fold only what arrived since, so both are reported. Before each later
scrape a step of new rooms is applied, as a live collector would between scrapes.
The baseline, timed in the same run on the same model, is `status_json` (what
`kvtop status --json` computes per frame). The lock figure is how long a scrape
keeps the collector from applying events. The bench fails when a scrape does not
count the origins and echoes the fold finds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report
from kvtop.bench.ui_load import fill
from kvtop.export.metrics import ModelMetrics
from kvtop.model.cluster import ClusterModel
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.tables import status_json


@dataclass(frozen=True)
class ExportResult:
    rooms: int
    ranks: int
    failures_held: int
    first_scrape_ms: float
    """The first scrape: it folds every failure the model holds."""
    scrape_ms: float
    """Median of the later scrapes (each after a step of new rooms)."""
    lock_ms: float
    """Median time a later scrape held the model's lock."""
    status_ms: float
    """Median time of the baseline, a `kvtop status --json` frame of the same model."""
    ratio: float
    """scrape_ms / status_ms."""
    body_bytes: int
    repeats: int

    REPORT: ClassVar[Report] = Report(
        setting=("rooms", "ranks", "failures_held", "repeats"),
        compare=(Compare("scrape_ms", "status_ms", "ratio"),),
    )

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure_export(rooms: int, instances: int, tp: int, repeats: int, progress: Callable[[str], None]) -> ExportResult:
    now = time.time()
    model = ClusterModel()
    progress(f"filling a model with {rooms:,} rooms, {2 * instances * tp} ranks ...")
    fill(model, rooms, instances, tp, now)
    metrics = ModelMetrics(model, threading.Lock(), time.time)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    started = time.perf_counter()
    body = generate_latest(registry)
    first_s = time.perf_counter() - started
    stream = SyntheticCluster(instances, instances, tp, start=now, spacing_s=0.001, seed=3)
    scrapes, locks, statuses = [], [], []
    for step in range(repeats):
        for label, batch in stream.rooms(500, step * 500):
            model.apply(label, batch, time.time())
        started = time.perf_counter()
        body = generate_latest(registry)
        scrapes.append(time.perf_counter() - started)
        locks.append(metrics.last_lock_s)
        started = time.perf_counter()
        status_json(model, time.time(), 60.0)
        statuses.append(time.perf_counter() - started)
    _check_counts(body.decode(), model)
    scrape_s, status_s = statistics.median(scrapes), statistics.median(statuses)
    return ExportResult(
        rooms=len(model.rooms) + len(model.finished),
        ranks=len(model.ranks),
        failures_held=len(model.failures),
        first_scrape_ms=first_s * 1e3,
        scrape_ms=scrape_s * 1e3,
        lock_ms=statistics.median(locks) * 1e3,
        status_ms=status_s * 1e3,
        ratio=scrape_s / status_s,
        body_bytes=len(body),
        repeats=repeats,
    )


def _check_counts(text: str, model: ClusterModel) -> None:
    """The scrape counted what the fold finds (else its time measures nothing)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    groups = [group for group in model.groups() if not group.aborted]
    expected = (float(len(groups)), float(sum(group.echo_count for group in groups)))
    served = (sums.get("kvtop_failure_origins_total", 0.0), sums.get("kvtop_failure_echoes_total", 0.0))
    if not groups or served != expected:
        raise BenchFailed(f"the scrape counted {served} origins and echoes, the fold {expected}")
