"""kvtop's plugin in a prefill of plain `--dp-size 2` (no DP attention), against SGLang 0.5.23's own KV managers:
each replica is its own scheduler with its own TP group, so both replicas hold a TP0. The plugin registered both as
`INSTANCE/TP0`, one bootstrap entry: one replica was listed, and its failures read as the other's. Each is now
`INSTANCE/DP0-TP0` and `INSTANCE/DP1-TP0`, as SGLang's own `[... DP1 TP0]` log lines are named when read."""

from __future__ import annotations

from pathlib import Path

from cluster import replicas
from kvtop_watch import registry, view

STAY = {"linger_s": 40.0}


def test_each_replica_s_rank_is_listed_and_fails_under_its_own_name(tmp_path: Path) -> None:
    """Each replica's room times out in Bootstrapping (no decode asks for it): SGLang's own `KVTransferError` on
    each replica is its own rank's failure in kvtop's views."""
    with registry() as bootstrap:
        env = {
            "KVTOP_BOOTSTRAP": bootstrap,
            "KVTOP_INSTANCE": "prefill-dp",
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2",
        }
        with replicas(tmp_path, [[7001], [7002]], env, **STAY) as ranks:
            ranks.wait("done")
            said = {rank.spec.dp_rank: rank.rooms() for rank in ranks.ranks}
            assert {dp: {room: "in KVPoll.Bootstrapping" in r.reason for room, r in rooms.items()}
                    for dp, rooms in said.items()} == {0: {7001: True}, 1: {7002: True}}  # fmt: skip
            listed = view(bootstrap, "ranks") or []  # None: kvtop found no rank
            assert sorted((entry["label"], entry["source"]) for entry in listed) == [
                ("prefill-dp/DP0-TP0", "sglang"),
                ("prefill-dp/DP1-TP0", "sglang"),
            ]
            groups = view(bootstrap, "failures")["groups"]

    assert sorted((group["room"], group["origin"]["rank"], group["origin"]["reason_class"]) for group in groups) == [
        (7001, "prefill-dp/DP0-TP0", "timeout_bootstrap"),
        (7002, "prefill-dp/DP1-TP0", "timeout_bootstrap"),
    ]
