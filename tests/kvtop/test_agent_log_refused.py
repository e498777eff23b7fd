"""An agent's SGLang-format log names a room its scheduler refused (a full KV pool), in the line SGLang writes for a
room that failed before its transfer began: a decode rank's `Decode handshake failed for request ...`. The room failed
on the event plane, but the log said nothing of it, so `--sglang-log` on the agents' logs missed the origin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop

from transport import Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec
from transport.harness.control import ControlError

pytestmark = pytest.mark.processes

ROOM = 0x1401


def test_a_room_a_full_decode_rank_refused_is_in_its_sglang_log(make_cluster, control, tmp_path: Path, wait_for):
    waiting = Timeouts(bootstrap_s=30.0, waiting_s=30.0, transfer_s=30.0)
    config = TransferConfig(chunk_bytes=16384, timeouts=waiting, peer_timeout_s=30.0)
    spec = ClusterSpec(num_pages=16, page_bytes=4096, transfer=config, log_dir=str(tmp_path))
    cluster = make_cluster(spec)
    clients = {agent.label: control(agent.control_endpoint) for agent in cluster.agents()}
    prefill, decode = clients["prefill-0/TP0"], clients["decode-0/TP0"]
    decode.submit(0x1400, 16, prefill_instance="prefill-0")  # holds every page of the decode rank for 30 s
    prefill.submit(ROOM, 4)
    with pytest.raises(ControlError, match="KV pool full"):
        decode.submit(ROOM, 4, prefill_instance="prefill-0")
    prefill.wait_result(ROOM, 10)
    log = tmp_path / "decode-0.log"

    line = wait_for(
        lambda: next((line for line in log.read_text().splitlines() if f"bootstrap_room={ROOM} " in line), ""),
        30,
        "the refused room's line in the decode rank's log",
    )
    failures = kvtop("failures", "--sglang-log", f"decode={log}", "--sglang-log", str(tmp_path / "prefill-0.log"),
                     "--json")  # fmt: skip

    assert " TP0] Decode handshake failed for request rank=0 decode_req.req.rid=" in line
    assert line.endswith(
        f"with exception KVTransferError(bootstrap_room={ROOM}): Decode rank 0 refused room {ROOM}: its KV pool is full"
    )
    assert failures.returncode == 0, failures.stderr
    origins = [group["origin"] for group in json.loads(failures.stdout)["groups"] if group["room"] == ROOM]
    assert [(origin["rank"], origin["reason"]) for origin in origins] == [
        ("decode-0/TP0", f"Decode rank 0 refused room {ROOM}: its KV pool is full")
    ]
