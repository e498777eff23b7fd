"""kvtop's plugin names each SGLang 0.5.23 scheduler as its own log lines are named when read, under pipeline stages
and DP attention, against SGLang's own runtime context, `KVArgs` (filled as SGLang's scheduler fills them) and
Mooncake KV managers, each rank logging through SGLang's own `configure_scheduler_process`.

Before, the plugin named a rank `INSTANCE/TP{engine_rank}`: a `--pp-size 2` server's two stages' TP0 were one rank
(one bootstrap entry; the other stage's failures read as its), and with DP attention a decode scheduler's
`engine_rank` is its rank within its attention-TP group (`tp_rank % attn_tp_size`), so each attention-DP group's
ranks were TP0..: `[... DP1 TP1]` was registered as `INSTANCE/TP0`, as DP0's TP0 was."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from cluster import free_port, ranks
from kvtop_watch import KVTOP, registry, view
from rank import RankSpec

STAY = {"linger_s": 40.0}
PREFIX = re.compile(r"^\[\S+ \S+((?: [A-Z_]+\d+)*)\] kvtop test: ", re.MULTILINE)
"""A line the rank logged through SGLang's logging; group 1 its prefix's tags (` DP1 TP1`)."""


def listed(bootstrap: str) -> list[str]:
    """The ranks kvtop lists (each an SGLang plugin's)."""
    entries = view(bootstrap, "ranks") or []  # None: kvtop found no rank
    assert {entry["source"] for entry in entries} <= {"sglang"}, entries
    return sorted(entry["label"] for entry in entries)


def read_as_files(*logs: Path) -> list[str]:
    """The ranks kvtop names reading the logs as files (`kvtop ranks --sglang-log`), without their instance (a log's
    instance is its file's name)."""
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    done = subprocess.run([KVTOP, "ranks", *args, "--json"], capture_output=True, text=True, timeout=60, check=True)
    return sorted(entry["label"].split("/", 1)[1] for entry in json.loads(done.stdout))


def test_each_pipeline_stage_s_rank_is_listed_and_fails_under_the_name_its_log_gives(tmp_path: Path) -> None:
    """A prefill of `--pp-size 2` (TP1): each stage's room times out in Bootstrapping (no decode asks for it), SGLang's
    own `KVTransferError` on each stage its own rank's failure, named as that stage's log lines are read."""
    with registry() as bootstrap:
        env = {
            "KVTOP_BOOTSTRAP": bootstrap,
            "KVTOP_INSTANCE": "prefill-pp",
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2",
        }
        port, gloo, http = free_port(), free_port(), free_port()
        specs = {f"prefill-pp{stage}": RankSpec("prefill", 0, 1, port, gloo, http, [7101 + stage],
                                                str(tmp_path / f"pp{stage}.jsonl"), pp_size=2, pp_rank=stage,
                                                scheduler_log=True, **STAY)  # type: ignore[arg-type]
                 for stage in (0, 1)}  # fmt: skip
        with ranks(tmp_path, specs, env) as started:
            started.wait("done")
            said = {rank.spec.pp_rank: rank.rooms() for rank in started.ranks}
            assert {pp: {room: "in KVPoll.Bootstrapping" in r.reason for room, r in rooms.items()}
                    for pp, rooms in said.items()} == {0: {7101: True}, 1: {7102: True}}  # fmt: skip
            plugin = listed(bootstrap)
            groups = view(bootstrap, "failures")["groups"]
        logs = [rank.log for rank in started.ranks]

    assert plugin == ["prefill-pp/PP1-TP0", "prefill-pp/TP0"]
    assert sorted((group["room"], group["origin"]["rank"]) for group in groups) == [
        (7101, "prefill-pp/TP0"),
        (7102, "prefill-pp/PP1-TP0"),
    ]
    assert read_as_files(*logs) == ["PP1-TP0", "TP0"]


def test_each_attention_dp_group_s_decode_rank_is_named_by_its_log_s_tp_tag(tmp_path: Path) -> None:
    """A decode of `--tp 2 --dp 2 --enable-dp-attention` (one attention-TP rank per group): SGLang gives both
    schedulers `engine_rank` 0; their logs say `DP0 TP0` and `DP1 TP1`, which file reading names `TP0` and `TP1`
    (DP attention's TP tags are unique across its groups)."""
    with registry() as bootstrap:
        env = {"KVTOP_BOOTSTRAP": bootstrap, "KVTOP_INSTANCE": "decode-dpa"}
        port, gloo, http = free_port(), free_port(), free_port()
        specs = {f"decode-dpa{tp}": RankSpec("decode", tp, 2, port, gloo, http, [], str(tmp_path / f"tp{tp}.jsonl"),
                                             hold=True, dp_size=2, dp_rank=tp, dp_attention=True, scheduler_log=True,
                                             **STAY)  # type: ignore[arg-type]
                 for tp in (0, 1)}  # fmt: skip
        with ranks(tmp_path, specs, env) as started:
            started.wait("done")
            plugin = listed(bootstrap)
        tags = sorted(tag for rank in started.ranks for tag in PREFIX.findall(rank.log.read_text()))

    assert tags == [" DP0 TP0", " DP1 TP1"]
    assert plugin == ["decode-dpa/TP0", "decode-dpa/TP1"]
