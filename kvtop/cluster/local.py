"""The local cluster behind `kvtop cluster up` and bare `kvtop --no-dashboard`: agents, a workload, a
live status line, and a supervisor that reports (and optionally restarts) every rank that exits."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtop.cluster.supervisor import Supervisor
from kvtop.views.units import rate
from transport.config import Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.workload import Router, WorkloadSpec, WorkloadStats
from transport.kv.faults import FaultSpec
from transport.signals import STOP_SIGNALS, ignore, interrupt

DEMO_TIMEOUTS = Timeouts(bootstrap_s=10.0, waiting_s=10.0, transfer_s=3.0)
"""Short enough that a local cluster shows its failures within seconds."""
DEMO_FAULTS: dict[str, tuple[FaultSpec, ...]] = {
    "prefill-0/TP0": (FaultSpec.parse("corrupt:0.02"),),
    "prefill-1": (FaultSpec.parse("stall:0.01"),),
}
"""The faults of a cluster given no --fault: each on the ranks it names that the cluster has."""


def demo_spec(
    prefill: int,
    decode: int,
    tp: int,
    faults: dict[str, tuple[FaultSpec, ...]] | None,
    log_dir: str,
    timeouts: Timeouts = DEMO_TIMEOUTS,
) -> ClusterSpec:
    """A laptop-sized cluster: small pools, short timeouts, a few injected faults, logs in `log_dir`."""
    return ClusterSpec(
        prefill=prefill,
        decode=decode,
        prefill_tp=tp,
        decode_tp=tp,
        num_pages=2048,
        page_bytes=16 << 10,
        transfer=TransferConfig(chunk_bytes=256 << 10, timeouts=timeouts, peer_timeout_s=3.0),
        faults=_demo_faults(prefill) if faults is None else faults,
        log_dir=log_dir,
    )


def _demo_faults(prefill: int) -> dict[str, tuple[FaultSpec, ...]]:
    return {target: specs for target, specs in DEMO_FAULTS.items() if target != "prefill-1" or prefill > 1}


LATENCIES_SHOWN = 500
"""The latest rooms the status line's end-to-end percentiles cover."""


@dataclass
class StatusLine:
    """Turns cumulative router stats into one line per interval."""

    last_bytes: int = 0
    last_time: float = 0.0

    def render(self, stats: WorkloadStats, now: float) -> str:
        """Each figure says its window: the room counts since start (in flight: now; dropped: arrivals no pair of
        instances took), the rate over the interval, the latency over the latest rooms, the failure origins since
        start; first, while a role has no instance up, that no room starts (its counts stand still: no health)."""
        elapsed = max(1e-9, now - self.last_time) if self.last_time else 0.0
        per_s = (stats.bytes_moved - self.last_bytes) / elapsed if elapsed else 0.0
        self.last_bytes, self.last_time = stats.bytes_moved, now
        recent = sorted(stats.latencies_s[-LATENCIES_SHOWN:])
        latency = (  # the room end to end, as the router saw it: not `kvtop status`' transfer time on a rank
            f"room end to end p50 {recent[len(recent) // 2] * 1000:.0f} ms, "
            f"p99 {recent[int(len(recent) * 0.99)] * 1000:.0f} ms (last {len(recent)} rooms)"
            if recent
            else "no rooms yet"
        )
        over = f" (last {elapsed:.1f}s)" if elapsed else ""
        failures = ", ".join(f"{name} {count}" for name, count in stats.failures_by_class.most_common()) or "none"
        stopped = f"NO ROOM STARTS: no {stats.unserved} instance up (a rank down)  |  " if stats.unserved else ""
        dropped = f", dropped {stats.dropped}" if stats.dropped else ""
        return (
            f"{time.strftime('%H:%M:%S')}  {stopped}rooms ok {stats.succeeded}, failed {stats.failed}, "
            f"refused {stats.refused}, lost {stats.lost}, in flight {stats.inflight}{dropped} (since start; in flight "
            "now)  |  "
            f"{rate(per_s)}{over}, {latency}  |  failure origins since start: {failures}"
        )


def run_local(
    spec: ClusterSpec,
    workload: WorkloadSpec,
    duration_s: float | None,
    emit: Callable[[str], None],
    on_up: Callable[[LocalCluster], None] | None = None,
    interval_s: float = 1.0,
    report: Callable[[str], None] | None = None,
    restart: bool = False,
    host: str = "127.0.0.1",
    kept: bool = True,
) -> WorkloadStats:
    """Start the cluster, drive load and emit a status line per interval until time is up, Ctrl-C, SIGTERM or
    SIGHUP (its terminal closed); once one came, the stop signals are ignored (`transport.signals.interrupt`):
    a second one does not cut short the stop of the agents, nor the removal of the log folder after it.

    A rank that exits is told to `report` (default `emit`) at once, with its stderr's path when the log folder
    is `kept`, else its last lines (a temporary folder is removed on exit); with `restart` it comes back.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, interrupt)
    try:
        cluster = LocalCluster(spec, host).start()
    except KeyboardInterrupt:  # while it came up (it stopped what it had started): as clean a stop as later
        emit("stopping the local cluster")
        return WorkloadStats()
    try:
        router: Router | None = None
        try:  # from here a stop (Ctrl-C, SIGTERM, SIGHUP) is a clean one, however early it comes
            if on_up is not None:
                on_up(cluster)
            emit(f"local cluster up: {len(cluster.processes)} agents, bootstrap {cluster.endpoint} (Ctrl-C stops)")
            if spec.log_dir:
                removed = "" if kept else " (temporary: removed on exit; --log-dir DIR keeps them)"
                emit(f"agent logs (SGLang format, one file per instance): {spec.log_dir}{removed}")
            router = Router(cluster.endpoint, workload, cluster.curve)
            supervisor = Supervisor(cluster, router, report or emit, restart, kept)
            status = StatusLine(last_time=time.monotonic())
            end = None if duration_s is None else time.monotonic() + duration_s
            next_line = time.monotonic() + interval_s
            while end is None or time.monotonic() < end:
                router.step()
                now = time.monotonic()
                supervisor.check(now)
                if now >= next_line:
                    emit(status.render(router.stats, now))
                    next_line = now + interval_s
                time.sleep(0.002)
        except KeyboardInterrupt:
            emit("stopping the local cluster")
        finally:
            if router is not None:
                router.close()
        return router.stats if router is not None else WorkloadStats()
    finally:
        ignore(*STOP_SIGNALS)  # stopping, however it came to it (--duration too)
        cluster.stop()
