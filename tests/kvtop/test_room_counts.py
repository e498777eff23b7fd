"""Open and stuck rooms counted a slice per frame: the same totals as one walk, published once a pass ends."""

from __future__ import annotations

from kvtop.model import ClusterModel
from kvtop.tables import STUCK_AFTER_S
from kvtop.tui import room_counts
from kvtop.tui.room_counts import RoomCounter
from transport.events import EVENT_SCHEMA, EventBatch, RoomState
from transport.kvpoll import KVPoll

T0 = 1_000_000.0


def _model(open_rooms: int, stuck: int) -> ClusterModel:
    """`open_rooms` rooms Transferring on one rank, the first `stuck` of them idle since long ago."""
    events = [
        RoomState(T0 - (100 if room < stuck else 0), room, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
        for room in range(open_rooms)
    ]
    events.append(RoomState(T0, 10_000, int(KVPoll.Success), int(KVPoll.Transferring)))
    model = ClusterModel()
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 1, T0, events), T0)
    return model


def test_a_small_cluster_is_counted_afresh_at_every_call():
    """Fewer open rooms than a slice: each call is a whole pass, so the counts are never a frame late."""
    model = _model(open_rooms=30, stuck=4)

    assert RoomCounter(model).counts(T0 + 1, frozenset()) == (30, 4)


def test_a_big_cluster_is_counted_over_several_calls_with_the_same_totals(monkeypatch):
    """With slices of 10, 35 open rooms take four calls; the totals appear when the pass ends."""
    monkeypatch.setattr(room_counts, "SLICE", 10)
    model = _model(open_rooms=35, stuck=12)
    counter = RoomCounter(model)

    seen = [counter.counts(T0 + STUCK_AFTER_S / 2, frozenset()) for _ in range(4)]

    assert seen == [(0, 0), (0, 0), (0, 0), (35, 12)]
    assert len(model.stuck(T0 + STUCK_AFTER_S / 2, STUCK_AFTER_S)) == 12
