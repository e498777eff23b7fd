"""A rank's label names its pipeline stage past the first (`prefill-0/PP1-TP3`): two stages' TP3 are two ranks, and
the instance is still what comes before the one `/`."""

from __future__ import annotations

import msgspec
import pytest

from transport.errors import FrameRejected
from transport.plane.events import EVENT_SCHEMA, EventBatch, TransferDone
from transport.plane.salvage import salvage_batch
from transport.registration import agent_problem
from transport.wire import LOG_SIDECAR, AgentInfo, FrameDecoder, encode, label_parts, rank_label


def _agent(pp: int | None) -> AgentInfo:
    return AgentInfo("prefill", "prefill-0", 3, 4, 0, "", "", 1, "h", 1, kind=LOG_SIDECAR, pp=pp)


@pytest.mark.parametrize(("instance", "pp", "tp"), [("prefill-0", None, 3), ("decode-1", 1, 0), ("a/b", 2, 7)])
def test_a_rank_label_gives_back_its_instance_stage_and_tp_rank(instance: str, pp: int | None, tp: int):
    label = rank_label(instance, tp, pp)

    assert label.rpartition("/")[0] == instance  # what the fold and the views take for the instance
    assert label_parts(label) == (instance, pp, tp)


def test_the_first_stage_is_labelled_as_a_server_without_stages():
    assert rank_label("prefill-0", 3, 0) == rank_label("prefill-0", 3) == "prefill-0/TP3"
    assert label_parts("prefill-0/PP0-TP3") == ("prefill-0", None, 3)
    assert label_parts("10.0.0.7:8998") is None  # a prefill known only by its bootstrap address


def test_an_agent_of_a_stage_is_registered_under_its_stage_and_older_peers_still_decode_it():
    """The stage is a trailing field with a default: an AgentInfo of a peer that knows no stages decodes as the first
    stage's, and one with a stage decodes on such a peer."""
    fields = AgentInfo.__struct_fields__
    older = msgspec.defstruct("Older", [(name, object) for name in fields if name != "pp"], array_like=True)
    staged = _agent(1)

    without = msgspec.msgpack.encode(msgspec.structs.astuple(_agent(None))[: len(fields) - 1])
    assert (staged.label, msgspec.msgpack.decode(without, type=AgentInfo).label) == (
        "prefill-0/PP1-TP3",
        "prefill-0/TP3",
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(staged), type=older).instance == "prefill-0"


def test_a_batch_names_its_agent_s_stage_and_peers_of_either_side_read_each_other_s():
    """The envelope carries the stage as a trailing field: a stage's batch is labelled as its agent is (a half-bad one
    too), a batch of an agent that sends no stage is the first stage's, and a reader that knows no stage reads a
    stage's batch as before (a trailing field it does not know is left out)."""
    staged = EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 3, 7, 1, 1.0, [TransferDone(1.0, 5, 64, 0.5)], pp=1)
    fields = EventBatch.__struct_fields__
    known = fields[: fields.index("pp")]  # a reader before the trailing stage and replica
    older = msgspec.defstruct("Older", [(name, object) for name in known], array_like=True, tag="batch")
    without = msgspec.msgpack.encode(older(*msgspec.structs.astuple(staged)[: len(known)]))
    half_bad = msgspec.structs.replace(staged, events=[TransferDone(1.0, 5, 64, -1.0)])
    salvaged = salvage_batch(encode(half_bad)[1:])

    assert staged.label == _agent(1).label == "prefill-0/PP1-TP3"
    assert salvaged is not None and salvaged[0].label == "prefill-0/PP1-TP3"
    assert msgspec.msgpack.decode(without, type=EventBatch).label == "prefill-0/TP3"
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(staged), type=older).seq == 1


def test_a_batch_of_a_stage_past_the_limit_is_rejected_whole():
    frame = encode(EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 3, 7, 1, 1.0, [], pp=1024))

    with pytest.raises(FrameRejected, match=r"<= 1023 - at `\$\[9\]`"):
        FrameDecoder(EventBatch).decode(frame)


def test_a_stage_past_the_limit_is_refused():
    assert agent_problem(_agent(1023)) == ""
    assert agent_problem(_agent(1024)) == "pipeline stage 1024 (0 to 1023)"
