"""A client's abort that SGLang's prefill did not pass on: the decode waits out its timeout (sglang PR #28651, a
production outage: `MooncakeKVSender.abort()` never notified decode, so the paired decode requests waited the full
300 s; 0.5.23's `CommonKVSender.abort()` still records the abort only where it is). kvtop read the decode's
timeouts 300 s later as a new room whose KV never came: `check` CRITICAL, "the prefill side of decode-0 stopped
answering". They are the abort's echoes: the client hung up, nothing in the cluster broke.

The lines are in SGLang's shapes (the PR quotes none), with times and rooms of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure

pytestmark = pytest.mark.usefixtures("utc")

ROOMS = (4641603982383516983, 1445363681616962640)


def logs(tmp_path: Path) -> list[str]:
    prefill = tmp_path / "prefill.log"
    prefill.write_text(
        "".join(
            f"[2026-06-18 10:00:1{i} TP{tp}] Prefill bootstrap failed for request rank={tp} req.rid='p{room}' "
            f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): Aborted by AbortReq.\n"
            for i, room in enumerate(ROOMS)
            for tp in range(2)
        )
    )
    decode = tmp_path / "decode.log"
    decode.write_text(
        "".join(
            decode_failure(
                f"2026-06-18 10:05:1{i}", room, f"Request {room} timed out after 300.0s in KVPoll.WaitingForInput", tp
            )
            for i, room in enumerate(ROOMS)
            for tp in range(2)
        )
    )
    return ["--sglang-log", str(prefill), "--sglang-log", str(decode)]


def test_a_decode_that_waited_out_rooms_the_client_aborted_on_prefill_is_no_incident(tmp_path: Path):
    args = logs(tmp_path)

    check = kvtop_here("check", *args)
    incidents = json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]

    assert check.returncode == 0, check.stdout
    assert "0 incidents, 2 client aborts" in check.stdout
    assert [(i["suspect"]["kind"], i["room_count"]) for i in incidents] == [("client", 2)]
