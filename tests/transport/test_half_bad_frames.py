"""One record outside its schema costs that record only: the rest of its batch or snapshot is delivered, in order.

An engine clock bug once made a `TransferDone` of negative seconds: subscribers rejected its whole batch, and every
later snapshot that mirrored it, so that rank's valid events were lost for good. The publishers here encode such
records as they would any (msgspec checks bounds when it decodes, not when it encodes); the subscribers decode the
real frames.
"""

from __future__ import annotations

import time
from collections import Counter

import msgspec
import pytest

from transport import BootstrapClient, BootstrapServer, KVPoll
from transport.errors import FrameRejected
from transport.plane import salvage
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, Heartbeat, RoomState, Snapshot, TransferDone
from transport.plane.publisher import EventPublisher
from transport.plane.relay import Relay
from transport.plane.salvage import salvage_batch
from transport.wire import FrameDecoder, encode

LABEL = "prefill-0/TP0"
NEGATIVE = "(done.seconds): Expected `float` >= 0.0 - at `$[4]`"


def room(number: int, state: KVPoll, previous: KVPoll = KVPoll.Bootstrapping) -> RoomState:
    return RoomState(time.time(), number, int(state), int(previous))


def failure(number: int) -> Failure:
    return Failure(time.time(), number, LABEL, "test", "other", "warning", False, LABEL)


def backwards(number: int) -> TransferDone:
    """A transfer that 'finished before it started' (the engine's old clock bug)."""
    return TransferDone(time.time(), number, 4096, -0.25)


def emit(publisher: EventPublisher, *events: object) -> None:
    for event in events:
        publisher.emit(event)  # type: ignore[arg-type]


def test_a_batch_with_one_record_outside_its_schema_delivers_the_others_in_order_and_no_gap(make_publisher, subscribe):
    publisher = make_publisher()
    log = subscribe([publisher.info])
    log.wait_synced([LABEL])

    emit(publisher, room(1, KVPoll.Success), backwards(1), failure(2))
    log.wait(lambda: log.failures(2), what="the batch's valid records")
    emit(publisher, failure(3))
    log.wait(lambda: log.failures(3), what="the next batch")

    half_bad = next(d for d in log.deliveries if d.refused)
    assert isinstance(half_bad.item, EventBatch) and half_bad.frame == b""
    assert [type(event) for event in half_bad.item.events] == [RoomState, Failure]
    assert half_bad.refused == (f"batch {half_bad.item.seq}, record 2 of 3 {NEGATIVE}",)
    assert log.room_states(LABEL) == {1: KVPoll.Success}
    subscriber = log.subscriber
    assert subscriber.counters["records_rejected"] == 1 and subscriber.counters["rejected_malformed"] == 0
    assert subscriber.records_refused == {LABEL: (1, half_bad.refused[0])}
    assert subscriber.gaps == Counter() and log.holes(LABEL) == []


def test_a_snapshot_with_one_bad_room_delivers_its_other_records(make_publisher, subscribe):
    """A live room of a state that is no KVPoll value sits in the agent's snapshot for good: a subscriber joining
    later takes every other record of it, and the agent's batches after it."""
    publisher = make_publisher()
    early = subscribe([publisher.info])
    early.wait_synced([LABEL])
    emit(publisher, room(1, KVPoll.WaitingForInput), RoomState(time.time(), 2, 9, 1), failure(3))
    early.wait(lambda: early.failures(3), what="the early subscriber's batch")

    late = subscribe([publisher.info])
    late.wait_synced([LABEL])
    emit(publisher, failure(4))
    late.wait(lambda: late.failures(4), what="a batch after the snapshot")

    [delivered] = [d for d in late.deliveries if isinstance(d.item, Snapshot)]
    snapshot = delivered.item
    assert isinstance(snapshot, Snapshot)
    assert [(state.room, state.state) for state in snapshot.live_rooms] == [(1, KVPoll.WaitingForInput)]
    assert [f.room for f in snapshot.failures] == [3]
    assert delivered.refused == (
        f"snapshot {snapshot.seq}, live room record 2 of 2 (room.state): Expected `int` <= 4 - at `$[3]`",
    )
    assert late.subscriber.counters["records_rejected"] == 1 and late.subscriber.gaps == Counter()
    assert late.holes(LABEL) == []


def test_through_a_relay_the_valid_records_of_a_half_bad_batch_and_snapshot_arrive(
    make_publisher, bootstrap: BootstrapServer, subscribe, wait_for
):
    """The relay passes frames through untouched; the view behind it keeps what a direct view keeps."""
    publisher = make_publisher()
    emit(publisher, room(1, KVPoll.Success), backwards(1))  # in the snapshot the view starts from
    wait_for(lambda: publisher.counters["batches"] == 1, what="published before the relay listens")
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(msgspec.structs.replace(publisher.info, data_endpoint="tcp://127.0.0.1:9"))  # never dialed
    relay = Relay(bootstrap=bootstrap.endpoint, discover_every_s=0.1).start()
    try:
        log = subscribe()
        log.wait(lambda: relay.snapshot()["upstream_agents"] == 1, 10.0, "the relay lists the agent")
        assert log.subscriber.connect_relay(relay.entry, [LABEL]) == ""

        def synced() -> bool:  # the view meets the agent by its batches (once the relay hears them), then asks
            emit(publisher, failure(1))
            return bool(log.snapshots(LABEL))

        log.wait(synced, 10.0, "the snapshot through the relay")
        emit(publisher, backwards(2), failure(2))
        log.wait(lambda: log.failures(2), 10.0, "the half-bad batch's failure")
    finally:
        relay.close()

    refused = [d.refused for d in log.deliveries if d.refused]
    assert [len(reasons) for reasons in refused] == [1, 1]
    assert refused[0][0].startswith("snapshot ") and "transfer record 1 of 1 " + NEGATIVE in refused[0][0]
    assert refused[1][0].startswith("batch ") and refused[1][0].endswith(NEGATIVE)
    assert log.room_states(LABEL) == {1: KVPoll.Success}
    counters = log.subscriber.counters
    assert counters["records_rejected"] == 2 and log.subscriber.gaps == Counter() and log.holes(LABEL) == []


def test_a_frame_whose_envelope_fails_is_still_rejected_whole():
    """Only records are salvaged: a batch whose envelope fails its schema (here its instance, over `RankLabel`'s
    256 characters) names no agent a subscriber could order it for."""
    frame = encode(EventBatch(EVENT_SCHEMA, "decode", "x" * 300, 0, 1, 1, 1.0, [failure(1)]))

    with pytest.raises(FrameRejected):
        FrameDecoder(EventBatch).decode(frame)
    assert salvage_batch(memoryview(frame)[1:]) is None


def test_a_bad_record_a_snapshot_holds_again_after_each_gap_is_counted_once(make_publisher, subscribe):
    """A refused record stays in the agent's snapshot: each gap asks that snapshot again, and the record in it is
    the one its batch carried (the same bytes), so `records_rejected` stays at the one record refused."""
    publisher = make_publisher()
    log = subscribe([publisher.info])
    log.wait_synced([LABEL])
    emit(publisher, room(1, KVPoll.Success), backwards(1), failure(1))
    log.wait(lambda: log.failures(1), what="the half-bad batch's valid records")

    for gap in (2, 3):
        publisher.seq += 3  # three batches lost on the way: the next one jumps, and the snapshot is asked again
        emit(publisher, failure(gap))
        log.wait(lambda n=gap: len(log.snapshots(LABEL)) == n, 10.0, f"the snapshot asked after gap {gap - 1}")
        log.wait(lambda n=gap: bool(log.failures(n)), what=f"the batch after gap {gap - 1}")

    subscriber = log.subscriber
    assert sum(subscriber.gaps.values()) == 6
    assert [len(d.refused) for d in log.deliveries if d.refused] == [1]
    assert subscriber.counters["records_rejected"] == 1
    [(count, latest)] = subscriber.records_refused.values()
    assert count == 1 and latest.startswith("batch ") and latest.endswith(NEGATIVE)


def test_a_relay_learns_a_snapshot_socket_from_a_heartbeat_beside_a_bad_record(make_publisher, subscribe, wait_for):
    """A relay given an agent by its event endpoint learns where to ask its snapshot from its heartbeats: one in a
    batch whose other record fails its schema still teaches it, and a view behind the relay gets the snapshot."""
    publisher = make_publisher(batch_interval_s=0.2)
    heartbeat = Heartbeat(time.time(), {}, 0, 0, 0.0, 0, 0.0, publisher.snapshot_endpoint)
    relay = Relay(connect=[publisher.endpoint], discover_every_s=0.1).start()
    try:

        def learned() -> bool:  # each batch holds both: the bad record, then the heartbeat
            emit(publisher, backwards(1), heartbeat)
            return LABEL in relay.book().routes

        wait_for(learned, 10.0, "the relay learns the snapshot route")
        assert relay.book().routes[LABEL].endpoint == publisher.snapshot_endpoint
        log = subscribe()
        assert log.subscriber.connect_relay(relay.entry, [LABEL]) == ""

        def synced() -> bool:
            emit(publisher, failure(1))
            return bool(log.snapshots(LABEL))

        log.wait(synced, 10.0, "the snapshot through the relay")
    finally:
        relay.close()


def test_the_loose_shapes_salvage_reads_have_every_field_of_the_records_they_shadow() -> None:
    """A field added to `EventBatch` or `Snapshot` must be added to salvage's loose shapes too, or a half-bad frame
    of the new schema would lose it (or fail its envelope)."""
    assert salvage._LooseBatch.__struct_fields__ == EventBatch.__struct_fields__
    assert salvage._LooseSnapshot.__struct_fields__ == Snapshot.__struct_fields__
