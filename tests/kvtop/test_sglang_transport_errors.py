"""The transfer's own errors in the logs (a transport library's glog error, UCX's ERROR, `Session X failed.`) are a
check's finding even with no failure line near them.

The shape is sglang #6854's (2025-06, Mooncake over RDMA): the prefill's transfer engine failed every write to the
decode host with `transport retry counter exceeded`, and the paste held those glog lines alone; `check` said only
"no ranks listed or discovered", and beside a log naming a rank it would have said OK.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvtop_cli import kvtop_here

from kvtop.sources.sglang.context import CONTEXT_KEPT

BATCH = (
    "[2025-06-03 20:16:58 TP0] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #unbootstrapped-req: 0, #queue-req: 0, #transferring-req: 1, input throughput (token/s): 9.8, \n"
)
RETRY = (
    "E0603 20:16:59.{us} 27322 worker_pool.cpp:271] Worker: Process failed for slice (opcode: 1, source_addr: "
    "0x7f20fe0f1680, length: 65536, dest_addr: 0x7f3d820f3a80, local_nic: mlx5_7, peer_nic: 10.93.81.13:15729@mlx5_0, "
    "dest_rkey: 2116517, retry_cnt: 0): transport retry counter exceeded\n"
)
SAID = (
    "E0603 20:16:59.104661 27322 worker_pool.cpp:271] Worker: Process failed for slice (opcode: … "
    "lx5_7, peer_nic: 10.93.81.13:15729@mlx5_0, dest_rkey: 2116517, retry_cnt: 0): transport retry counter exceeded"
)


def _log(tmp_path: Path, text: str) -> list[str]:
    log = tmp_path / "prefill.log"
    log.write_text(text)
    return ["--sglang-log", str(log)]


def test_transport_errors_with_no_failure_make_a_check_warn_naming_the_last_one(tmp_path: Path):
    logs = _log(tmp_path, BATCH + "".join(RETRY.format(us=us) for us in ("104586", "104656", "104661")))

    result = kvtop_here("check", *logs)
    as_json = json.loads(kvtop_here("check", *logs, "--json").stdout)

    assert result.returncode == 1
    assert result.stdout.startswith(f"KVTOP WARNING - 3 transport errors in the logs, the last at 20:16:59: {SAID}; ")
    assert as_json["transport_errors"] == 3


def test_a_transport_library_s_info_lines_are_no_error(tmp_path: Path):
    info = "I0603 20:16:59.104586 27322 transfer_engine.cpp:120] Transfer Engine uses rdma transport\n"

    result = kvtop_here("check", *_log(tmp_path, BATCH + info), "--json")

    assert (result.returncode, json.loads(result.stdout)["transport_errors"]) == (0, 0)


def test_a_check_from_after_the_errors_does_not_judge_them(tmp_path: Path):
    logs = _log(tmp_path, BATCH + RETRY.format(us="104586") + BATCH.replace("20:16:58", "20:17:30"))

    result = kvtop_here("check", *logs, "--since", "2025-06-03 20:17:00", "--json")

    assert (result.returncode, json.loads(result.stdout)["transport_errors"]) == (0, 0)


def test_an_error_pushed_out_of_the_context_kept_is_still_judged(tmp_path: Path):
    """10,001 tracebacks after it filled the 10,000 context lines kept: the check said OK."""
    traceback = 'Traceback (most recent call last):\n  File "/x.py", line 1, in f\nKeyError: 1\n'
    logs = _log(tmp_path, BATCH + RETRY.format(us="104586") + traceback * (CONTEXT_KEPT + 1))

    result = kvtop_here("check", *logs, "--json")

    assert (result.returncode, json.loads(result.stdout)["transport_errors"]) == (1, 1)


def test_logs_that_name_no_rank_say_so_beside_their_errors(tmp_path: Path):
    """sglang #6854's paste, glog lines alone: WARNING for the errors, and the logs named no rank (it said CRITICAL
    `no ranks listed or discovered`, a live cluster's words)."""
    result = kvtop_here("check", *_log(tmp_path, RETRY.format(us="104586")))

    assert result.returncode == 1
    assert result.stdout.startswith("KVTOP WARNING - 1 transport error in the logs")
    assert "; no rank named in what was read;" in result.stdout


def test_logs_that_name_no_rank_and_hold_nothing_worse_are_unknown(tmp_path: Path):
    """Mooncake #1207's prefill start-up lines (a TP=1 server names no rank until it logs a batch): nothing to judge
    is UNKNOWN, never OK (it said CRITICAL)."""
    started = (
        '[2025-12-12 12:06:32] INFO:     127.0.0.1:34920 - "POST /generate HTTP/1.1" 200 OK\n'
        "[2025-12-12 12:06:32] The server is fired up and ready to roll!\n"
    )
    result = kvtop_here("check", *_log(tmp_path, started))

    assert (result.returncode, result.stdout.split(" - ")[0]) == (3, "KVTOP UNKNOWN")
    assert "no rank named in what was read" in result.stdout
