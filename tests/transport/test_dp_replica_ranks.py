"""A rank of a DP replica (plain `--dp-size N`: each replica its own scheduler processes and TP group) is named with
its replica, `prefill-0/DP1-TP0`, as a server log read as a file names it: registered, listed, deregistered and
streamed apart from the other replicas' TP0 (and a pipeline stage's rank apart from the first stage's). Before, a
sidecar's or a plugin's replicas were one bootstrap entry, and their batches, labelled by instance and TP rank, one
stream."""

from __future__ import annotations

import os
import time

import msgspec

from transport import BootstrapClient, BootstrapServer
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure
from transport.plane.publisher import EventPublisher
from transport.registration import agent_problem
from transport.wire import LOG_SIDECAR, AgentInfo, label_parts, rank_label


def _agent(dp: int | None, pp: int | None = None) -> AgentInfo:
    return AgentInfo("prefill", "prefill-0", 0, 2, 0, "", "", os.getpid(), "h", 7, kind=LOG_SIDECAR, pp=pp, dp=dp)


def test_a_replica_s_label_names_its_replica_and_still_gives_its_instance_stage_and_tp_rank():
    from transport.wire import label_replica  # each test fails alone on the code before

    assert [_agent(1).label, _agent(1, 1).label, _agent(None).label] == [
        "prefill-0/DP1-TP0",
        "prefill-0/DP1-PP1-TP0",
        "prefill-0/TP0",
    ]
    assert [label_replica(label) for label in ("prefill-0/DP1-PP1-TP0", "prefill-0/DP0-TP0", "prefill-0/TP0")] == [
        1,
        0,
        None,
    ]
    assert label_parts(rank_label("prefill-0", 3, 1, 2)) == ("prefill-0", 1, 3)


def test_an_older_agent_s_registration_and_deregistration_are_of_no_replica():
    """`dp` is a trailing field with a default: an older peer's AgentInfo and Deregister decode as of no replica."""
    fields = AgentInfo.__struct_fields__
    older = msgspec.msgpack.encode(msgspec.structs.astuple(_agent(None))[: fields.index("dp")])

    assert msgspec.msgpack.decode(older, type=AgentInfo).label == "prefill-0/TP0"


def test_a_replica_past_the_limit_is_refused():
    assert agent_problem(_agent(1023)) == ""
    assert agent_problem(_agent(1024)) == "DP replica 1024 (0 to 1023)"


def test_two_replicas_tp0_are_two_entries_each_deregistered_alone(bootstrap: BootstrapServer):
    """Keyed by instance, rank and stage, DP1's TP0 replaced DP0's: the views heard one replica."""
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(_agent(0))
        client.register(_agent(1))
        both = sorted(agent.label for agent in client.list_agents())
        client.deregister(_agent(1))
        left = [agent.label for agent in client.list_agents()]

    assert (both, left) == (["prefill-0/DP0-TP0", "prefill-0/DP1-TP0"], ["prefill-0/DP0-TP0"])


def test_a_batch_names_its_agent_s_replica_and_stage_and_an_older_agent_s_batch_none():
    batch = EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 7, 1, 0.0, [], 1, 1)
    fields = msgspec.structs.astuple(batch)[: EventBatch.__struct_fields__.index("pp")]
    older = msgspec.msgpack.encode(["batch", *fields])  # its tag first, as every tagged array

    assert batch.label == "prefill-0/DP1-PP1-TP0"
    assert msgspec.msgpack.decode(older, type=EventBatch).label == "prefill-0/TP0"


def test_each_replica_s_and_stage_s_batches_are_their_own_stream(zmq_context, subscribe):
    """One sidecar's ranks share its incarnation: DP0's, DP1's and PP1's TP0 were one stream `prefill-0/TP0` to a
    subscriber, each one's batches stale or a gap to the others' (PP1's live events reached the first stage's view)."""
    agents = [_agent(None), _agent(0), _agent(1), _agent(None, 1)]
    publishers = [EventPublisher(agent, context=zmq_context).start() for agent in agents]
    try:
        labels = [publisher.info.label for publisher in publishers]
        events = subscribe([publisher.info for publisher in publishers])
        events.wait_synced(labels)
        for room, (publisher, label) in enumerate(zip(publishers, labels, strict=True), 100):
            publisher.emit(Failure(time.time(), room, label, "test", "other", "warning", False, label))
        events.wait(lambda: all(events.failures(room) for room in range(100, 104)), what="each rank's failure")

        assert {label: [f.room for b in events.batches(label) for f in b.events] for label in labels} == {
            "prefill-0/TP0": [100],
            "prefill-0/DP0-TP0": [101],
            "prefill-0/DP1-TP0": [102],
            "prefill-0/PP1-TP0": [103],
        }
        assert events.subscriber.counters["stale_batches"] == 0
    finally:
        for publisher in publishers:
            publisher.close()
