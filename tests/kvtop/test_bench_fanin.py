"""`kvtop bench fanin` on a cluster shaped as users run theirs: ranks of pipeline stages and DP replicas beside
plain TP ranks, each heard as a rank of its own by the collector and by the floor (tiny sizes, seconds)."""

from __future__ import annotations

import pytest

from kvtop.bench.fanin import TP, Leg, agent_info, measure

pytestmark = pytest.mark.processes


def test_the_bench_s_instances_are_servers_of_one_tp_group_of_pipeline_stages_and_of_dp_replicas() -> None:
    labels = [agent_info(index, 7).label for index in range(3 * TP)]

    assert labels[:TP] == [f"decode-0/TP{rank}" for rank in range(TP)]
    assert labels[TP : 2 * TP] == [f"decode-1/{stage}TP{rank}" for stage in ("", "PP1-") for rank in range(TP // 2)]
    assert labels[2 * TP :] == [f"decode-2/DP{dp}-TP{rank}" for dp in range(2) for rank in range(TP // 2)]


def test_the_floor_and_the_collector_hear_every_rank_of_a_stage_and_a_replica() -> None:
    """The floor keyed a stream by its instance and TP rank: two stages' (two replicas') TP0 were one agent heard,
    and the bench failed (`heard 16 of 24 agents`), or counted each other's seqs as gaps."""
    agents = 3 * TP
    result = measure(agents, 50.0, 1, 1.0, 1, lambda _: None, warmup_s=0.5,
                     legs=(Leg("floor", relay=False, floor=True), Leg("direct", relay=False)))  # fmt: skip

    for leg in ("floor", "direct"):
        assert (result[leg]["agents_heard"], result[leg]["gaps"]) == (agents, 0), result[leg]  # type: ignore[index]
