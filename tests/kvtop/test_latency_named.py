"""Each latency kvtop prints says which it is: the room end to end (`cluster up`) or a rank's transfer (`status`)."""

from __future__ import annotations

import time

from kvtop.cluster.local import StatusLine
from kvtop.model.cluster import ClusterModel
from kvtop.views.tables import status_text
from transport.harness.workload import WorkloadStats
from transport.plane.events import EVENT_SCHEMA, EventBatch, TransferDone


def test_the_cluster_status_line_names_its_latency_the_room_end_to_end():
    """`p50 79 ms, p99 306 ms` said nothing of what it timed (`kvtop status` said `p50 3 ms` of the same rooms)."""
    stats = WorkloadStats(started=3, succeeded=3, latencies_s=[0.079, 0.080, 0.306])

    assert "room end to end p50 80 ms, p99 306 ms (last 3 rooms)" in StatusLine().render(stats, time.monotonic())


def test_the_cluster_status_line_says_the_window_of_each_figure():
    """Counts since start beside a rate of the last interval read as one window; each now says its own."""
    stats = WorkloadStats(started=3, succeeded=3, bytes_moved=0, latencies_s=[0.08])
    line = StatusLine()
    line.render(stats, 100.0)
    stats.bytes_moved = 2_000_000

    said = line.render(stats, 102.0)

    assert "rooms ok 3, failed 0, refused 0, lost 0, in flight 0 (since start; in flight now)" in said
    assert "1.0 MB/s (last 2.0s)" in said
    assert said.endswith("failure origins since start: none")


def test_status_names_its_latency_the_transfer_time_on_a_decode_rank():
    """`latency p50 3 ms` is a decode rank's transfer (its `done` events), not the room end to end."""
    model = ClusterModel()
    now = time.time()
    done = [TransferDone(now - 1, 1, 1000, 0.003, "prefill-0")]
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, now, done), now)

    lines = status_text(model, now, 60.0).splitlines()

    assert "latency transfer p50 3 ms, p90 3 ms, p99 3 ms (a decode rank's, room taken to its KV in)" in lines
