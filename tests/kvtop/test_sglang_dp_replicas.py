"""A prefill with plain `--dp-size 2` (no DP attention): each DP replica is its own scheduler with its own TP group,
so `[... DP0 TP0]` and `[... DP1 TP0]` are two processes. kvtop named both `prefill-0/TP0`: DP1's crash read as the
crash of the rank DP0 goes on serving. A replica's rank is now `prefill-0/DP1-TP0`; with DP attention (`DP1 TP2`: TP
numbers unique across DP) the names are what they were.

The fixtures are made up in SGLang's shapes (`scheduler.py`'s prefix: `DP{n}` first, `TP{n}` only where
`tp_size > 1`; `server_args=ServerArgs(... dp_size=2, ... enable_dp_attention=False ...)`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang" / "dp-replicas"
REPLICAS = FIXTURES / "prefill.log"
"""Two replicas of TP 2; DP1's session to a decode fails and so does its room, then its scheduler dies at 11:20:13;
DP0 logs batches after it."""
ATTENTION = FIXTURES / "prefill-1.log"
"""DP attention, DP 2 over TP 4: `DP0 TP0`, `DP0 TP1`, `DP1 TP2`, `DP1 TP3` (server `prefill-1`, as its file's name
says: read with the other, or followed by a sidecar each, the two servers are named alike)."""
BATCH = (
    "[2026-08-17 11:20:10{tags}] Prefill batch, #new-seq: 1, #new-token: 256, #cached-token: 0, token usage: 0.02, "
    "#running-req: 0, #queue-req: 0, #bootstrap-req: 0, #inflight-req: 1, input throughput (token/s): 310.42\n"
)


def labels(*paths: Path) -> list[str]:
    args = [arg for path in paths for arg in ("--sglang-log", str(path))]
    return sorted(rank["label"] for rank in json.loads(kvtop_here("ranks", *args, "--json").stdout))


def test_a_replica_s_crash_is_its_own_rank_s_not_the_one_that_still_serves():
    result = kvtop_here("check", "--sglang-log", str(REPLICAS))
    crashed = json.loads(kvtop_here("check", "--sglang-log", str(REPLICAS), "--json").stdout)["ranks_crashed"]

    assert result.returncode == 2
    assert result.stdout.startswith("KVTOP CRITICAL - prefill-0/DP1-TP0 crashed at 11:20:13 (Scheduler hit an ")
    assert list(crashed) == ["prefill-0/DP1-TP0"]
    assert labels(REPLICAS) == ["prefill-0/DP0-TP0", "prefill-0/DP0-TP1", "prefill-0/DP1-TP0", "prefill-0/DP1-TP1"]


def test_the_failed_room_s_origin_and_echo_are_the_replica_s_ranks():
    failures = json.loads(kvtop_here("failures", "--sglang-log", str(REPLICAS), "--json").stdout)
    [group] = failures["groups"]

    assert group["origin"]["rank"] == "prefill-0/DP1-TP0"
    assert [echo["rank"] for echo in group["echoes"]] == ["prefill-0/DP1-TP1"]


def test_the_lines_beside_the_room_name_the_replica_s_rank_as_its_failures_do():
    """The failures view and its JSON: the session line and the crash are DP1 TP0's, not DP0 TP0's."""
    shown = kvtop_here("failures", "--sglang-log", str(REPLICAS), "--debug").stdout.splitlines()
    [group] = json.loads(kvtop_here("failures", "--sglang-log", str(REPLICAS), "--json").stdout)["groups"]

    assert [line.split()[2] for line in shown if line.startswith(("  session", "  crash"))] == ["prefill-0/DP1-TP0"] * 2
    assert [(line["kind"], line["tp"], line["dp"]) for line in group["context"]] == [("session", 0, 1), ("crash", 0, 1)]


def test_the_failures_view_widens_its_origin_column_for_a_replica_s_rank():
    """`prefill-0/DP1-TP0` is 17 characters: the columns after it stood one off the header's."""
    header, *rows = kvtop_here("failures", "--sglang-log", str(REPLICAS), "--debug").stdout.splitlines()[-5:]

    assert {row.find("send_failed") for row in rows[:2]} == {header.find("CLASS")}
    assert {row.find("Session ") for row in rows if "session" in row} == {header.find("REASON")}


def test_dp_attention_s_ranks_keep_their_names():
    assert labels(ATTENTION) == ["prefill-1/TP0", "prefill-1/TP1", "prefill-1/TP2", "prefill-1/TP3"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            "server_args=ServerArgs(model_path='/m', tp_size=2, dp_size=2, enable_dp_attention=False, "
            "disaggregation_mode='prefill')",
            ["prefill-0/DP0-TP0", "prefill-0/DP1-TP1"],
        ),
        (  # SGLang 0.5.23 prints its arguments as a dict
            "server_args={'model_path': '/m', 'tp_size': 2, 'dp_size': 2, 'enable_dp_attention': False}",
            ["prefill-0/DP0-TP0", "prefill-0/DP1-TP1"],
        ),
        (
            "server_args=ServerArgs(model_path='/m', tp_size=2, dp_size=2, enable_dp_attention=True, "
            "disaggregation_mode='prefill')",
            ["prefill-0/TP0", "prefill-0/TP1"],
        ),
    ],
)
def test_the_server_args_say_which_where_the_tags_cannot(tmp_path: Path, args: str, expected: list[str]):
    """`DP0 TP0` and `DP1 TP1` alone are DP attention's shape as much as two replicas'."""
    log = tmp_path / "prefill.log"
    log.write_text(f"[2026-08-17 11:20:09] {args}\n" + BATCH.format(tags=" DP0 TP0") + BATCH.format(tags=" DP1 TP1"))

    assert labels(log) == expected


def test_replicas_of_one_gpu_each_print_no_tp_and_are_two_ranks(tmp_path: Path):
    log = tmp_path / "prefill.log"
    log.write_text(BATCH.format(tags=" DP0") + BATCH.format(tags=" DP1"))

    assert labels(log) == ["prefill-0/DP0-TP0", "prefill-0/DP1-TP0"]


def test_a_server_args_line_without_dp_size_says_nothing_of_replicas():
    from kvtop.sources.sglang.lines import dp_replicas  # each test fails alone on the code before

    assert dp_replicas("server_args=ServerArgs(model_path='/m', tp_size=2)") is None


def test_a_rotated_log_s_newer_piece_names_the_replicas_its_older_piece_told(tmp_path: Path):
    """The newer piece's head holds DP0's lines alone: the older piece's `DP1 TP0` told they are replicas."""
    (tmp_path / "prefill.log.1").write_text(BATCH.format(tags=" DP0 TP0") + BATCH.format(tags=" DP1 TP0"))
    later = BATCH.replace("11:20:10", "11:25:10")
    (tmp_path / "prefill.log").write_text(later.format(tags=" DP0 TP0") + later.format(tags=" DP0 TP1"))

    assert labels(tmp_path / "prefill.log", tmp_path / "prefill.log.1") == [
        "prefill-0/DP0-TP0",
        "prefill-0/DP0-TP1",
        "prefill-0/DP1-TP0",
    ]
