"""The embedded local cluster behind bare `kvtop`: agents, a workload thread, and a collector on them."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.sources.live import Collector
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.workload import Router, WorkloadSpec, WorkloadStats
from transport.thread_names import name_os_thread

if TYPE_CHECKING:
    from kvtop.record.writer import Recorder


class EmbeddedCluster:
    """Start with `with EmbeddedCluster(spec, workload) as cluster:`; leaving stops every agent it started.

    `collector` (model, lock, error) is what the dashboard reads; `recorder`, when given, is told everything
    the collector applies (the caller closes it, after leaving).
    """

    def __init__(
        self, spec: ClusterSpec, workload: WorkloadSpec, recorder: Recorder | None = None, collect: bool = True
    ) -> None:
        """`collect=False`: no collector here (the dashboard's model process collects from the bootstrap)."""
        self.spec = spec
        self._collect = collect
        self.workload = workload
        self.recorder = recorder
        self.cluster = LocalCluster(spec)
        self.collector: Collector | None = None
        self.stats = WorkloadStats()
        self._stop = threading.Event()
        self._router = threading.Thread(target=self._drive, name="kvtop-workload", daemon=True)

    def __enter__(self) -> EmbeddedCluster:
        try:
            self.cluster.start()
            if self._collect:
                model = ClusterModel(JOURNAL_EVENTS_KEPT)
                self.collector = Collector(
                    self.cluster.endpoint, model=model, curve=self.cluster.curve, recorder=self.recorder
                ).start()
            self._router.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def describe(self) -> str:
        """`bootstrap tcp://127.0.0.1:PORT, embedded cluster 2P2D TP2, 20 rooms/s`: the address first, so that a
        banner of 80 columns still shows it whole (other tools and views take it)."""
        spec = self.spec
        return (
            f"bootstrap {self.cluster.endpoint}, embedded cluster {spec.prefill}P{spec.decode}D TP{spec.prefill_tp}, "
            f"{self.workload.rate:g} rooms/s"
        )

    def close(self) -> None:
        """Stop the workload, the collector and every agent (idempotent)."""
        self._stop.set()
        if self._router.is_alive():
            self._router.join(timeout=5.0)
        if self.collector is not None:
            self.collector.close()
        self.cluster.stop()

    def _drive(self) -> None:
        """The router lives on this thread (its sockets too) and submits rooms until stopped."""
        name_os_thread()
        router = Router(self.cluster.endpoint, self.workload, self.cluster.curve)
        self.stats = router.stats
        try:
            while not self._stop.is_set():
                router.step()
                time.sleep(0.002)
        finally:
            router.close()
