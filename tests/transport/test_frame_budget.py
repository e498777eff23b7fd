"""What an agent publishes fits a frame: big events split a batch, big histories cut a snapshot (and say so)."""

from __future__ import annotations

import msgspec
import pytest

from transport.plane.events import Failure, LogContext, Snapshot
from transport.plane.frame_budget import FRAME_BUDGET, fit_snapshot
from transport.plane.publisher import FINISHED_KEPT
from transport.wire import TEXT_MAX, FrameDecoder, cut_text

TRACEBACK = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 550  # ~15 KB
TRACEBACKS = 600
LABEL = "prefill-0/TP0"


def context(i: int) -> LogContext:
    return LogContext(1000.0 + i, "traceback", i, TRACEBACK, 0)


def failure(i: int) -> Failure:
    return Failure(1000.0 + i, i, LABEL, "timed out", "timeout", "warning", False, LABEL)


def snapshot(contexts: int, failures: int) -> Snapshot:
    return Snapshot(
        7, 1, 1, 42, None, None, [], [], [failure(i) for i in range(failures)],
        context=[context(i) for i in range(contexts)],
    )  # fmt: skip


def test_a_snapshot_of_600_big_tracebacks_fits_a_frame_keeps_every_failure_and_counts_what_it_cut():
    """8.5 MB of context lines used to make a snapshot no reader accepts (every failure in it lost)."""
    frame, cut = fit_snapshot(snapshot(TRACEBACKS, TRACEBACKS))

    assert len(frame) <= FRAME_BUDGET
    decoded = FrameDecoder[Snapshot](Snapshot).decode(frame)
    assert len(decoded.failures) == TRACEBACKS
    assert 0 < cut < TRACEBACKS and decoded.cut == cut
    assert len(decoded.context) == TRACEBACKS - cut
    assert [c.room for c in decoded.context] == list(range(cut, TRACEBACKS))  # the newest are kept
    assert decoded.history_since == decoded.context[0].ts


def test_a_snapshot_that_fits_is_sent_whole():
    whole = snapshot(10, 10)
    frame, cut = fit_snapshot(whole)
    assert cut == 0
    assert FrameDecoder[Snapshot](Snapshot).decode(frame) == whole


def test_a_failure_reason_past_the_text_bound_is_refused_by_the_schema_and_cut_where_it_is_made():
    """A reason of 100k characters made the whole batch undecodable for every reader; now it cannot enter."""
    long = "x" * 100_000
    encoded = msgspec.msgpack.encode(msgspec.structs.replace(failure(1), reason=long))
    with pytest.raises(msgspec.ValidationError, match="length <= 4096"):
        msgspec.msgpack.decode(encoded, type=Failure)
    cut = cut_text(long)
    assert len(cut) == TEXT_MAX and cut.endswith("…")
    assert cut_text("short") == "short"


def test_600_big_tracebacks_published_at_once_all_reach_a_subscriber(make_publisher, subscribe):
    """One batch of 600 x 15 KB was a 9 MB frame: the subscriber's socket dropped it whole (and the connection)."""
    publisher = make_publisher(batch_interval_s=0.2)
    log = subscribe([publisher.info])
    log.wait_synced([LABEL])
    for i in range(TRACEBACKS):
        publisher.emit(context(i))
    publisher.emit(failure(TRACEBACKS))

    log.wait(lambda: log.failures(TRACEBACKS), timeout=20, what="the failure published after 600 tracebacks")
    contexts = [event for _, event in log.events() if isinstance(event, LogContext)]
    assert sorted(c.room for c in contexts) == list(range(TRACEBACKS))
    assert log.subscriber.counters["rejected_oversize"] == 0
    assert len(log.batches(LABEL)) == publisher.seq > 2  # cut into several batches, none lost
    # the publisher counts a batch once its send returned: that can come after the subscriber has it
    log.wait(lambda: publisher.counters["batches"] == publisher.seq, timeout=10, what="every batch counted sent")
    assert all(len(d.frame) <= FRAME_BUDGET for d in log.deliveries)


def test_a_late_subscriber_gets_a_snapshot_cut_to_fit_with_every_failure(make_publisher, subscribe, wait_for):
    publisher = make_publisher()
    for i in range(FINISHED_KEPT):  # a snapshot's histories at their bound: 512 x 15 KB of context alone
        publisher.emit(context(i))
        publisher.emit(failure(i))
    wait_for(lambda: publisher.counters["events"] == 2 * FINISHED_KEPT, timeout=20, what="all events published")

    log = subscribe([publisher.info])
    log.wait_synced([LABEL], timeout=10)
    snapshot = log.snapshots(LABEL)[0]
    assert len(snapshot.failures) == FINISHED_KEPT > len(snapshot.context) > 0
    assert snapshot.cut == FINISHED_KEPT - len(snapshot.context)
    wait_for(lambda: publisher.counters["snapshot_entries_cut"] == snapshot.cut, what="the publisher's count")
