"""A decode's `send_metadata to prefill H:P failed` (SGLang 0.5.23's common receiver; `_register_kv_args` alike) names
the ZeroMQ endpoint of one prefill rank, no bootstrap address: kvtop named `prefill at H:P`, which no prefill log read
could be (their bootstrap port is not a rank's), so a prefill rank whose log said it crashed just before stayed a
crash beside an address that "stopped answering". Where a prefill log names the room, the room's prefill instance is
the suspect, its crashed rank with it.

The lines below are in SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

ROOM = 9100001


def logs(tmp_path: Path, *, room_named: bool = True) -> list[str]:
    decode, prefill = tmp_path / "decode.log", tmp_path / "prefill.log"
    decode.write_text(
        "[2026-03-02 10:00:00] server_args=ServerArgs(tp_size=2, disaggregation_mode='decode')\n"
        + decode_failure("2026-03-02 10:00:05", ROOM, "send_metadata to prefill 10.2.0.6:17001 failed", tp=1)
    )
    prefill.write_text(
        "[2026-03-02 09:59:00] server_args=ServerArgs(tp_size=2, disaggregation_mode='prefill', "
        "disaggregation_bootstrap_port=8998)\n"
        "[2026-03-02 10:00:01 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2297, in run_scheduler_process\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        + (
            prefill_failure("2026-03-02 10:00:06", ROOM, "Aborted by AbortReq.", tp=0)
            if room_named
            else "[2026-03-02 10:00:06 TP0] Prefill batch, #new-seq: 1, #new-token: 11, #cached-token: 0, \n"
        )
    )
    return ["--sglang-log", str(decode), "--sglang-log", str(prefill)]


def test_a_rank_endpoint_the_decode_could_not_reach_is_of_the_room_s_prefill_instance(tmp_path: Path):
    found = json.loads(kvtop_here("incidents", *logs(tmp_path), "--json").stdout)["incidents"]

    [incident] = [i for i in found if not i["client"]]
    assert (incident["suspect_text"], incident["kind"]) == ("prefill-0/TP1", "unresponsive")
    assert incident["evidence"] == ["sending to its rank at 10.2.0.6:17001 failed; its scheduler crashed 4 s before"]


def test_with_no_log_naming_the_room_the_endpoint_is_named(tmp_path: Path):
    found = json.loads(kvtop_here("incidents", *logs(tmp_path, room_named=False), "--json").stdout)["incidents"]

    assert [i["suspect_text"] for i in found] == ["prefill at 10.2.0.6:17001"]


def test_the_prefill_s_bootstrap_timeout_of_the_room_the_decode_could_not_send_for_is_the_same_incident(
    tmp_path: Path,
):
    """SGLang's decode tells the prefill nothing when its `send_metadata` fails: the prefill ranks wait out their 300 s
    in Bootstrapping for the request that never came. That timeout was an incident of its own, `the decode side of
    prefill-0 stopped answering`, beside the crashed prefill rank that caused both."""
    arguments = logs(tmp_path, room_named=False)
    prefill = Path(arguments[3])
    prefill.write_text(
        prefill.read_text()
        + f"[2026-03-02 10:05:05 TP0] Prefill bootstrap failed for request rank=0 req.rid='p{ROOM}' "
        f"req.bootstrap_room={ROOM} with exception KVTransferError(bootstrap_room={ROOM}): Request {ROOM} timed out "
        "after 300.0s in KVPoll.Bootstrapping\n"
    )

    found = json.loads(kvtop_here("incidents", *arguments, "--json").stdout)["incidents"]

    assert [(i["suspect_text"], i["origins"], i["echoes"]) for i in found] == [("prefill-0/TP1", 1, 1)]
