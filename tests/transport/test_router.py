"""The router against real agent processes: refused rooms end at once, rooms of a gone rank end as lost."""

from __future__ import annotations

import signal
import time

from kvtop.cluster.local import StatusLine
from transport import FaultSpec, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec
from transport.harness.workload import Router, WorkloadSpec, WorkloadStats


def drive(router: Router, until, timeout_s: float = 30.0) -> None:
    """Step the router until `until()` holds (or fail after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, f"router stats never got there: {router.stats}"
        router.step()
        time.sleep(0.002)


def accounted(stats: WorkloadStats) -> bool:
    """Every started room is ok, failed, refused, lost or in flight, once."""
    return stats.started == stats.succeeded + stats.failed + stats.refused + stats.lost + stats.inflight


def test_a_room_a_full_pool_refuses_counts_as_refused_at_once_and_the_status_line_shows_it(make_cluster):
    """Rooms of 20 pages against 32-page pools: the second concurrent room is refused, counted once, not lost."""
    cluster = make_cluster(ClusterSpec(num_pages=32, faults={"prefill-0": (FaultSpec.parse("delay"),)}))
    router = Router(cluster.endpoint, WorkloadSpec(rate=50, median_pages=20, sigma=0.0, max_pages=20, seed=1))
    try:
        drive(router, lambda: router.stats.refused >= 2)

        stats = router.stats
        assert accounted(stats)
        assert stats.lost == 0
        line = StatusLine().render(stats, time.monotonic())
        assert f"refused {stats.refused}, lost 0, in flight {stats.inflight}" in line
    finally:
        router.close()


def test_rooms_waiting_on_a_rank_that_exited_end_as_lost_and_its_instance_gets_no_new_rooms(make_cluster):
    """After rank_lost(decode-0/TP0) its rooms end as lost once prefill reports, and no room starts meanwhile."""
    slow = TransferConfig(
        chunk_bytes=16 << 10,
        window_bytes=64 << 10,
        heartbeat_s=0.25,
        peer_timeout_s=1.0,
        timeouts=Timeouts(bootstrap_s=2.0, waiting_s=2.0, transfer_s=2.0),  # a room decode never asked for ends
    )
    spec = ClusterSpec(num_pages=1024, transfer=slow, faults={"prefill-0": (FaultSpec.parse("delay"),)})
    cluster = make_cluster(spec)
    router = Router(cluster.endpoint, WorkloadSpec(rate=20, median_pages=64, sigma=0.0, max_pages=64, seed=2))
    try:
        drive(router, lambda: router.stats.inflight >= 2)
        cluster.kill("decode-0/TP0")
        inflight = router.stats.inflight

        router.rank_lost("decode-0/TP0")
        started = router.stats.started
        drive(router, lambda: router.stats.inflight == 0)  # once prefill reports (it loses its peer)

        stats = router.stats
        assert (stats.lost, stats.started, stats.rank_exits, stats.ranks_down) == (inflight, started, 1, 1)
        assert accounted(router.stats)
    finally:
        router.close()


def test_a_frozen_prefill_instance_holds_only_its_share_of_the_rooms_in_flight(make_cluster):
    """prefill-1 stopped (SIGSTOP): its rooms wait on it, but only up to its half of `max_inflight`; prefill-0's
    rooms go on succeeding. Every place filled with the frozen instance's rooms and the whole workload stopped
    (the demo's status line froze at 0 B/s) until they timed out."""
    cluster = make_cluster(ClusterSpec(prefill=2, num_pages=1024))
    spec = WorkloadSpec(rate=100, median_pages=4, sigma=0.0, result_timeout_s=600, seed=3)
    router = Router(cluster.endpoint, spec)
    frozen = cluster.process("prefill-1/TP0").process
    try:
        drive(router, lambda: router.stats.succeeded >= 20)
        frozen.send_signal(signal.SIGSTOP)
        drive(router, lambda: router.stats.inflight >= spec.max_inflight // 2)
        succeeded = router.stats.succeeded

        drive(router, lambda: router.stats.succeeded >= succeeded + 100)

        assert router.stats.inflight < spec.max_inflight
        assert accounted(router.stats)
    finally:
        frozen.send_signal(signal.SIGCONT)
        router.close()


def test_an_instance_s_share_is_of_the_instances_up(make_cluster):
    """prefill-1 gone (`rank_lost`), prefill-0 stopped: prefill-0 takes every place in flight, not half (a share of
    both instances, one of them down, halved a run that lost a rank)."""
    cluster = make_cluster(ClusterSpec(prefill=2, num_pages=1024))
    spec = WorkloadSpec(rate=200, median_pages=4, sigma=0.0, result_timeout_s=600, seed=4)
    router = Router(cluster.endpoint, spec)
    frozen = cluster.process("prefill-0/TP0").process
    try:
        cluster.kill("prefill-1/TP0")
        router.rank_lost("prefill-1/TP0")
        frozen.send_signal(signal.SIGSTOP)

        drive(router, lambda: router.stats.inflight == spec.max_inflight)

        assert accounted(router.stats)
    finally:
        frozen.send_signal(signal.SIGCONT)
        router.close()
