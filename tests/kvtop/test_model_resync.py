"""A snapshot asked again after a gap brings the model what the gap lost, and counts nothing twice.

The snapshots here are made as an agent makes them: by its publisher's `StateMirror`, from the batches
it published.
"""

from __future__ import annotations

import pytest

import kvtop.model.cluster as cluster
from kvtop.model.cluster import SETTLE_S, ClusterModel
from transport.kvpoll import KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    RoomState,
    Snapshot,
    TransferDone,
)
from transport.plane.publisher import StateMirror
from transport.wire import AgentInfo

T0 = 1_000_000.0
LABEL = "decode-0/TP0"


def room(number: int, ts: float, final: KVPoll) -> list[Event]:
    """A decode room from prefill-0 that ends in `final` (with its failure, or its transfer)."""
    events: list[Event] = [
        RoomState(ts, number, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "prefill-0", 1000),
        RoomState(ts + 0.1, number, int(final), int(KVPoll.Transferring), "prefill-0", 1000),
    ]
    if final is KVPoll.Failed:
        events.append(Failure(ts + 0.1, number, LABEL, "checksum", "checksum", "error", False, LABEL))
    else:
        events.append(TransferDone(ts + 0.1, number, 1000, 0.1, "prefill-0"))
    return events


class Agent:
    """One decode rank's batches, and the snapshots its publisher would answer with."""

    def __init__(self, incarnation: int = 1) -> None:
        self.mirror = StateMirror()
        self.seq = 0
        self.incarnation = incarnation
        info = AgentInfo("decode", "decode-0", 0, 1, 4096, "", "", 1, "host", incarnation)
        self.publish([AgentHello(T0, info, "test", "", "")])

    def publish(self, events: list[Event]) -> EventBatch:
        self.mirror.apply_batch(events)
        self.seq += 1
        return EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, self.incarnation, self.seq, T0 + self.seq, events)

    def snapshot(self) -> Snapshot:
        m = self.mirror
        return Snapshot(
            1, EVENT_SCHEMA, self.incarnation, self.seq, m.hello, m.heartbeat, list(m.live.values()), list(m.finished),
            list(m.failures), list(m.progress.values()), list(m.transfers), m.history_since, list(m.context),
        )  # fmt: skip


def held(model: ClusterModel, now: float) -> tuple[object, ...]:
    """What a view shows of the rank: rooms and their states, failures, origins, transfers, the link."""
    model.sweep(now)
    view = model.ranks[LABEL]
    rooms = {number: r.codes for number, r in model.rooms.items()}
    rooms |= {number: f.view.codes for number, f in model.finished.items() if f.view is not None}
    link = model.links[("prefill-0", "decode-0")]
    return (
        rooms,
        sorted((f.room, f.rank, f.reason) for f in model.failures),
        view.origins,
        sorted(view.transfers.window(0.0)[:, 0].tolist()),
        (link.transfers, link.nbytes),
        model.retired_outcomes,
    )


def test_a_snapshot_asked_again_after_a_gap_gives_what_a_view_that_lost_nothing_holds():
    """A view that lost the batch of rooms 3 and 4 and then applied the snapshot asked again holds what a view
    that got every batch does: the lost failure and transfer once, the ones it had not twice."""
    agent = Agent()
    agent.publish(room(1, T0, KVPoll.Success) + room(2, T0, KVPoll.Failed))  # before the views joined
    snapshot = agent.snapshot()
    after = [
        agent.publish(room(5, T0 + 1, KVPoll.Success)),
        agent.publish(room(3, T0 + 2, KVPoll.Failed) + room(4, T0 + 2, KVPoll.Success)),  # the one lost
        agent.publish([Heartbeat(T0 + 3, {}, 0, 0, 0.0, 0, 0.0), *room(6, T0 + 3, KVPoll.Success)[:1]]),
    ]
    direct, gapped = ClusterModel(), ClusterModel()
    for model in (direct, gapped):
        model.apply(LABEL, snapshot, T0 + 1)
        model.apply(LABEL, after[0], T0 + 1)
    for batch in after[1:]:
        direct.apply(LABEL, batch, T0 + 4)
    gapped.apply(LABEL, agent.snapshot(), T0 + 4)  # the subscriber held the batch after the gap: the snapshot has it

    later = T0 + 4 + SETTLE_S + 1
    assert held(gapped, later) == held(direct, later)
    assert held(gapped, later)[1] == [(2, LABEL, "checksum"), (3, LABEL, "checksum")]


def test_a_restated_room_or_failure_the_model_already_let_go_is_not_counted_again(monkeypatch):
    """Past the model's bounds (a handful here) the oldest retired rooms and failures are gone from it: the
    snapshot asked again restates them, and they stay gone (counted once, long ago)."""
    monkeypatch.setattr(cluster, "FINISHED_ROOMS_KEPT", 4)
    monkeypatch.setattr(cluster, "FAILURES_KEPT", 4)
    agent, model = Agent(), ClusterModel()
    model.apply(LABEL, agent.snapshot(), T0)
    for number in range(1, 9):
        model.apply(LABEL, agent.publish(room(number, T0 + number, KVPoll.Failed)), T0 + number)
        model.sweep(T0 + number + SETTLE_S + 0.5)
    outcomes = dict(model.retired_outcomes)
    assert sorted(model.finished) == [5, 6, 7, 8] and [f.room for f in model.failures] == [5, 6, 7, 8]

    model.apply(LABEL, agent.publish([]), T0 + 10)
    model.apply(LABEL, agent.snapshot(), T0 + 10)  # asked again: restates rooms and failures 1 to 8
    model.sweep(T0 + 20)

    assert model.rooms == {}
    assert [f.room for f in model.failures] == [5, 6, 7, 8]
    assert model.retired_outcomes == outcomes


@pytest.mark.parametrize("incarnation", [1, 2])
def test_a_first_snapshot_of_an_incarnation_is_applied_whole(incarnation: int):
    """Only a snapshot of an incarnation the model heard from is taken as asked again: a rank registered but
    never heard, or a new incarnation, gets its history whole."""
    agent = Agent(incarnation)
    agent.publish(room(1, T0, KVPoll.Failed))
    model = ClusterModel()
    if incarnation == 2:  # the rank was heard before, as its first incarnation
        model.apply(LABEL, Agent(1).publish(room(1, T0, KVPoll.Failed)), T0)
    model.apply(LABEL, agent.snapshot(), T0 + 1)

    assert [f.room for f in model.failures] == [1] * incarnation
