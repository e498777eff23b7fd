"""A rank's label names its pipeline stage past the first (`prefill-0/PP1-TP3`): two stages' TP3 are two ranks, and
the instance is still what comes before the one `/`."""

from __future__ import annotations

import msgspec
import pytest

from transport.registration import agent_problem
from transport.wire import LOG_SIDECAR, AgentInfo, label_parts, rank_label


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


def test_a_stage_past_the_limit_is_refused():
    assert agent_problem(_agent(1023)) == ""
    assert agent_problem(_agent(1024)) == "pipeline stage 1024 (0 to 1023)"
