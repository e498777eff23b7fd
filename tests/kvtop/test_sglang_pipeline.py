"""Pipeline-parallel stages (`--pp-size 2`): SGLang prefixes each stage's lines with its `PP` tag (`[... PP1 TP3]`,
`[... PP1 ATTN_CP0 TP0]`), so PP0's TP3 and PP1's TP3 are two processes. kvtop keyed a rank by its TP tag alone: the
two were one rank, a crashed PP1 stage "logged again" as soon as PP0 of its TP logged, the other stage's crash was read
as the first one's aftermath, and counts of ranks were short.

The fixtures are in the shapes of public reports: `pipeline-crash` of sglang #30158 (a PP2 TP4 prefill with HiCache:
PP1 TP3's scheduler dies of an IndexError in HiCache's write check, PP0 TP3's a second later as its send to the dead
stage is reset; decode loses the prefill 12 s on), `pipeline-hicache` of sglang #29054 (PP disaggregated prefill with
HiCache under `kubectl logs --timestamps`: PP1's RoPE reshape fails, PP0 goes on scheduling and fails a room)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import load

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
CRASH = FIXTURES / "pipeline-crash"
HICACHE = FIXTURES / "pipeline-hicache"
PP1_CRASH = (
    "Scheduler hit an exception: IndexError: list index out of range, in sglang/srt/mem_cache/hiradix_cache.py:392 "
    "writing_check"
)
PP0_CRASH = (
    "Scheduler hit an exception: RuntimeError: [PG ID 4 PG GUID 9 Rank 3] Connection reset by peer, in "
    "distributed_c10d.py:2419 isend"
)
ROPE = (
    "Scheduler hit an exception: RuntimeError: shape '[48, -1, 64]' is invalid for input of size 540672, in "
    "sglang/srt/layers/rotary_embedding/base.py:352 forward_cuda"
)


def args(folder: Path) -> list[str]:
    return [arg for log in sorted(folder.glob("*.log")) for arg in ("--sglang-log", str(log))]


def test_each_stage_of_a_tp_rank_is_a_rank_of_its_own_in_the_ranks_view():
    """PP0's ranks keep the labels of a server without stages; PP1's are named by their stage, listed after them."""
    ranks = json.loads(kvtop_here("ranks", *args(CRASH), "--json").stdout)
    text = kvtop_here("ranks", *args(CRASH)).stdout.splitlines()

    assert [(rank["label"], rank["rank"]) for rank in ranks if rank["role"] == "prefill"] == [
        ("prefill-0/TP0", 0),
        ("prefill-0/TP3", 3),
        ("prefill-0/PP1-TP0", 0),
        ("prefill-0/PP1-TP3", 3),
    ]
    header, row = text[0], next(line for line in text if line.startswith("prefill-0/PP1-TP3 "))
    assert row.index(" prefill ") + 1 == header.index("ROLE")  # the column fits the longer label


def test_both_stages_crashes_are_said_each_under_its_rank():
    """PP0 TP3's crash a second after PP1 TP3's was taken for the same rank's aftermath, and dropped."""
    verdict = json.loads(kvtop_here("check", *args(CRASH), "--json").stdout)

    assert verdict["ranks_crashed"] == {"prefill-0/PP1-TP3": PP1_CRASH, "prefill-0/TP3": PP0_CRASH}


def incident_suspects(folder: Path) -> list[tuple[str, list[str]]]:
    incidents = json.loads(kvtop_here("incidents", *args(folder), "--json").stdout)["incidents"]
    return [(incident["suspect_text"], incident["evidence"]) for incident in incidents]


def test_the_stage_that_broke_is_the_suspect_and_the_one_that_lost_it_its_aftermath():
    """Decode lost the prefill at 10.0.1.5:8998, where two ranks had crashed: no single rank was named. PP0 TP3's
    crash says its send to the next stage was reset (`Connection reset by peer`) a second after PP1 TP3 died:
    it noticed, PP1 TP3 broke (DOMAIN.md: the suspect is what broke)."""
    check = kvtop_here("check", *args(CRASH)).stdout

    [(suspect, [evidence])] = incident_suspects(CRASH)

    assert suspect == "prefill-0/PP1-TP3"
    assert (
        evidence == "decode lost its heartbeat; its scheduler crashed 12 s before (prefill-0/TP3 crashed after it, "
        "losing it)"
    )
    assert "incident: prefill-0/PP1-TP3 stopped answering (peer_lost)" in check


@pytest.mark.parametrize(
    "lost",
    [
        "Connection closed by peer [10.0.1.5]:41202",  # gloo
        "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error",
        "[Errno 32] Broken pipe",
    ],
    ids=["gloo", "nccl", "socket"],
)
def test_each_library_s_word_for_a_peer_gone_makes_a_crash_the_aftermath(tmp_path: Path, lost: str):
    for log in CRASH.glob("*.log"):
        (tmp_path / log.name).write_text(log.read_text().replace("Connection reset by peer", lost))

    assert [suspect for suspect, _ in incident_suspects(tmp_path)] == ["prefill-0/PP1-TP3"]


def test_two_crashes_that_name_no_peer_gone_leave_the_address_the_suspect(tmp_path: Path):
    """Had PP0 TP3 died of its own error, which of the two broke the prefill is not known."""
    for log in CRASH.glob("*.log"):
        (tmp_path / log.name).write_text(
            log.read_text().replace("Connection reset by peer", "CUDA error: out of memory")
        )

    assert incident_suspects(tmp_path) == [("prefill at 10.0.1.5:8998", ["decode lost its heartbeat"])]


def test_a_crashed_stage_is_not_logged_again_by_the_other_stage_of_its_tp_rank():
    """PP0 TP0 goes on scheduling after PP1 TP0 died: PP1 TP0 stays crashed, PP0 TP0 was never crashed."""
    model = ClusterModel()
    logs = load(sorted(HICACHE.glob("*.log")), model)
    ranks = {rank["label"]: rank for rank in json.loads(kvtop_here("ranks", *args(HICACHE), "--json").stdout)}

    assert model.crash_of("prefill-0/PP1-TP0", logs.now) is model.crashes["prefill-0/PP1-TP0"]
    assert "prefill-0/TP0" not in model.crashes
    assert ranks["prefill-0/PP1-TP0"]["crashed"]["text"] == ROPE
    assert ranks["prefill-0/PP1-TP0"]["crashed"]["logged_again"] is None
    assert ranks["prefill-0/TP0"]["crashed"] is None and ranks["prefill-0/TP0"]["origins"] == 1


def test_status_counts_every_stage_s_ranks():
    status = json.loads(kvtop_here("status", *args(CRASH), "--json").stdout)

    assert sorted(status["ranks_crashed"]) == ["prefill-0/PP1-TP3", "prefill-0/TP3"]
    assert (status["ranks"]["total"], status["ranks"]["log"]) == (8, 8)


@pytest.mark.parametrize(
    ("prefix", "label"),
    [
        ("[2026-06-29 09:44:04 TP3]", "prefill-0/TP3"),
        ("[2026-06-29 09:44:04 PP0 TP3]", "prefill-0/TP3"),  # the first stage: a log with or without stages alike
        ("[2026-06-29 09:44:04 PP1 TP3]", "prefill-0/PP1-TP3"),
        ("[2026-06-29 09:44:04 DP1 PP1 ATTN_CP0 TP3 EP3]", "prefill-0/PP1-TP3"),
        ("[PP1 ATTN_CP0 TP3]", "prefill-0/PP1-TP3"),  # the time taken out, as people paste it
        ("[2026-06-29 09:44:04 PP1]", "prefill-0/PP1-TP0"),  # TP1: SGLang prints no TP tag
    ],
)
def test_a_failure_line_s_rank_is_its_stage_s(tmp_path: Path, prefix: str, label: str):
    log = tmp_path / "prefill.log"
    log.write_text(
        f"{prefix} Prefill transfer failed for request rank=0 req.rid='r1' req.bootstrap_room=42 with exception "
        "KVTransferError(bootstrap_room=42): Decode instance could be dead, remote mooncake session 10.0.0.9:1 is not "
        "alive\n"
    )
    model = ClusterModel()
    load([log], model)

    assert [failure.rank for failure in model.failures] == [label]
    assert list(model.ranks) == [label]


def test_a_roomless_failure_line_takes_the_room_of_its_own_stage_s_worker_error(tmp_path: Path):
    """The worker error of the same rank (stage and TP) names the room, not the latest of any stage's TP1."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-06-29 09:44:04 PP0 TP1] Unexpected transfer worker error for room 501\n"
        "[2026-06-29 09:44:04 PP1 TP1] Unexpected transfer worker error for room 502\n"
        "[2026-06-29 09:44:05 PP0 TP1] Prefill transfer failed for request rank=1 req.rid='r9' with exception "
        "RuntimeError: Failed to send kv chunk\n"
    )
    model = ClusterModel()
    load([log], model)

    assert {(failure.rank, failure.room) for failure in model.failures} == {
        ("prefill-0/TP1", 501),
        ("prefill-0/PP1-TP1", 502),
    }


def test_failures_debug_names_a_context_line_s_stage():
    """A context line under a room names its rank (two ranks' same words are two lines): a later stage's by its
    stage too, `prefill-0/PP1-TP0`, not the first stage's `prefill-0/TP0` that logged the room's failure."""
    result = kvtop_here("failures", "--debug", *args(HICACHE))

    crash = [line.split()[:3:2] for line in result.stdout.splitlines() if "Scheduler hit an exception" in line]
    assert crash == [["crash", "prefill-0/PP1-TP0"]]


def test_a_log_naming_more_ranks_than_a_cluster_lists_keeps_that_many_and_counts_the_rest_garbled(tmp_path: Path):
    """Each rank tag is at most 1023, but a log naming `PP0..4` of `TP0..1023` made 5,120 ranks, each a view of its
    own (a million from `PP0..1023`: a 270 MB log asked for tens of GB). The logs name `RANKS_MAX` at most: a line of
    one more is counted as garbled, and the ranks read are those first named."""
    from sglang_lines import decode_failure

    from kvtop.sources.sglang.source import RANKS_MAX

    log = tmp_path / "decode.log"
    lines = [
        decode_failure("2026-03-04 12:00:00.000", 1 + tp + 1024 * pp, "Failed to get kvcache", tp, f" PP{pp}")
        for pp in range(5)
        for tp in range(1024)
    ]
    log.write_text("".join(lines))
    model = ClusterModel()
    stats = load([log], model).stats()

    assert len(model.ranks) == RANKS_MAX == 4096
    assert (stats.failures, stats.garbled) == (4096, 1024)
    assert "decode-0/PP3-TP1023" in model.ranks and "decode-0/PP4-TP0" not in model.ranks


def test_lost_prefill_addresses_past_the_ranks_kept_are_counted_not_listed(tmp_path: Path):
    """Each prefill address decode lines say they lost is listed as a rank of its own (~70 KB): a decode log naming
    another address per room listed 5,000 ranks in 466 MB, past `RANKS_MAX`. They count in it with the ranks the
    logs name; one more is counted in the summary, not listed."""
    from sglang_lines import decode_failure

    from kvtop.sources.sglang.source import RANKS_MAX

    log = tmp_path / "decode.log"
    lost = "Lost connection with prefill instance (bootstrap_addr: 10.3.{}.{}:8998)"
    over = 2
    log.write_text(
        "".join(
            decode_failure("2026-03-04 12:00:00.000", 1 + i, lost.format(i // 250, i % 250))
            for i in range(RANKS_MAX + over)
        )
    )
    model = ClusterModel()
    stats = load([log], model).stats()

    assert len(model.ranks) == RANKS_MAX
    assert sum(bool(view.named_by) for view in model.ranks.values()) == RANKS_MAX - 1  # decode-0/TP0 is the other
    assert stats.peers_unlisted == over + 1
    assert f"{over + 1} naming a lost prefill's address past the ranks kept (not listed)" in stats.summary()


def test_a_launcher_that_names_only_its_command_on_every_line_leaves_each_crash_its_exception(tmp_path: Path):
    """sglang #30158's lines came as `[<launcher's time>] [/bin/sh]: <SGLang's line>`, a traceback's lines and the
    blank after it too: the crash line was unwrapped, the traceback's lines were not gathered under it ("its
    traceback was cut")."""
    for log in sorted(CRASH.glob("*.log")):
        lines = log.read_text().splitlines()
        (tmp_path / log.name).write_text("".join(f"[2026-06-29 17:44:04] [/bin/sh]: {line}\n" for line in lines))

    verdict = json.loads(kvtop_here("check", *args(tmp_path), "--json").stdout)

    assert verdict["ranks_crashed"] == {"prefill-0/PP1-TP3": PP1_CRASH, "prefill-0/TP3": PP0_CRASH}
