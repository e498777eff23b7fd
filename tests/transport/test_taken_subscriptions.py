"""A view given the bootstrap subscribes to the event endpoint of each rank the listing names as taken (another client
holds its entry). Those subscriptions were never closed: a rank that held its entry again was heard on that socket
and on the agents' one, each of its batches twice (the second counted stale), and a rank that stopped kept a socket
and a snapshot stream for good."""

from __future__ import annotations

import time

from transport.plane.events import Heartbeat
from transport.plane.publisher import EventPublisher

TAKEN = "prefill-0/TP0~taken"


def beat(publisher: EventPublisher) -> None:
    publisher.emit(Heartbeat(time.time(), {}, 0, 0, 1.0, 1 << 20, 10.0, publisher.snapshot_endpoint))


def test_a_rank_that_holds_its_entry_again_is_heard_once_per_batch(make_publisher, subscribe):
    publisher = make_publisher(batch_min=1)
    log = subscribe()
    subscriber = log.subscriber
    subscriber.hear_taken([publisher.info], direct=True)
    beat(publisher)
    log.wait(lambda: log.snapshots(TAKEN), what="the taken rank heard under its taken label")

    subscriber.hear_taken([], direct=True)  # the listing names it as its entry's holder again
    subscriber.connect(publisher.info)
    log.wait_synced([publisher.info.label])
    stale = subscriber.counters["stale_batches"]  # batches held for the snapshot that it holds already

    def heard() -> bool:
        beat(publisher)
        return len(log.batches(publisher.info.label)) >= 5

    log.wait(heard, what="five batches of the rank")

    assert subscriber.counters["stale_batches"] == stale
    assert log.holes(publisher.info.label) == []
    assert subscriber.answered == {} and subscriber.synced()


def test_a_rank_no_longer_taken_leaves_no_stream_behind(make_publisher, subscribe):
    """It stopped (or its refusals aged out of the listing): nothing more is asked of it or waited for."""
    publisher = make_publisher(batch_min=1)
    log = subscribe()
    subscriber = log.subscriber
    subscriber.hear_taken([publisher.info], direct=True)
    beat(publisher)
    log.wait(lambda: log.snapshots(TAKEN), what="the taken rank's snapshot")

    subscriber.hear_taken([], direct=True)
    beat(publisher)

    assert subscriber.answered == {} and subscriber.synced()
    assert log.pump(0.5) == []  # its heartbeat, published after, arrives nowhere
