"""SGLang 0.5.23's failure strings kvtop read wrong or not at all, found by reading its PD code
(`sglang/srt/disaggregation/`) string by string, and a real report's crash line.

- `KV checksum mismatch req=R bootstrap_room=N expected=0x.. got=0x..` (decode.py, `logger.error`) on the rank
  that found it and `KV checksum mismatch on a peer rank req=R bootstrap_room=N` on the others: the request is
  aborted with no other record, and `check` said OK.
- Reasons whose text names the cause, read as `other`, `unknown`: a prefill marked down by the health check
  before the room started, sends of state or metadata that failed, MoRI's transfer SLA, a decode's wait for
  prefill completion, a bootstrap query of a rank.
- PyTorch's `[rank3]:[E1117 21:22:11.441603074 ProcessGroupNCCL.cpp:2068] ... Process group watchdog thread
  terminated with exception: CUDA error: device-side assert triggered` (SGLang issue #13435: the last line of a
  decode server that died with 9 rooms in flight) and C++'s `terminate called after throwing an instance of ...`:
  each takes its process down, and `check` said OK.

The lines below are in SGLang's and PyTorch's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure

pytestmark = pytest.mark.usefixtures("utc")

BATCH = (
    "[2026-03-02 10:00:00 TP{tp}] Decode batch, #running-req: 9, #token: 82048, token usage: 0.23, pre-allocated "
    "usage: 0.07, #prealloc-req: 0, #transfer-req: 4, #retracted-req: 0\n"
)


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    log = tmp_path / name
    log.write_text("".join(lines))
    return log


def incidents(*logs: Path) -> list[dict]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    return json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]


def test_a_kv_checksum_mismatch_is_the_finding_ranks_origin_and_the_peer_ranks_line_its_echo(tmp_path: Path):
    log = write(
        tmp_path,
        "decode.log",
        BATCH.format(tp=0),
        "[2026-03-02 10:00:05 TP1] KV checksum mismatch on a peer rank req=d1 bootstrap_room=7001\n",
        "[2026-03-02 10:00:05 TP0] KV checksum mismatch req=d1 bootstrap_room=7001 expected=0x1a2b3c got=0x1a2b3d\n",
    )

    check = kvtop_here("check", "--sglang-log", str(log))
    groups = json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"]
    [incident] = incidents(log)

    assert check.returncode == 2, check.stdout
    assert (incident["kind"], incident["class"], incident["suspect_text"]) == (
        "corrupt",
        "checksum",
        "the prefill side of decode-0",
    )
    [group] = groups
    assert (group["origin"]["rank"], [echo["rank"] for echo in group["echoes"]]) == ("decode-0/TP0", ["decode-0/TP1"])


@pytest.mark.parametrize(
    ("reason", "kind", "failure_class", "suspect"),
    [
        (
            "Prefill server with bootstrap_addr: 10.2.0.5:8998 is healthy before, but now it is down. Request "
            "(bootstrap_room: 7002) has been marked as failed.",
            "unresponsive",
            "peer_lost",
            "prefill at 10.2.0.5:8998",
        ),
        ("send_metadata to prefill 10.2.0.6:17001 failed", "unresponsive", "send_failed", "prefill at 10.2.0.6:17001"),
        (
            "_register_kv_args to prefill 10.2.0.6:17001 failed",
            "unresponsive",
            "send_failed",
            "prefill at 10.2.0.6:17001",
        ),
        ("Timed out waiting for prefill completion", "unresponsive", "timeout_waiting", "the prefill side of decode-0"),
        ("KV transfer exceeded SLA 5000ms", "unresponsive", "timeout_transfer", "the prefill side of decode-0"),
        (
            "Could not fetch bootstrap info for: prefill_dp_rank: 0 prefill_cp_rank: 0 target_tp_rank: 1 and "
            "target_pp_rank 0",
            "unresponsive",
            "bootstrap_error",
            "the prefill side of decode-0",
        ),
    ],
)
def test_a_reason_that_names_its_cause_is_read_as_such(tmp_path: Path, reason, kind, failure_class, suspect):
    log = write(tmp_path, "decode.log", BATCH.format(tp=0), decode_failure("2026-03-02 10:00:05", 7002, reason))

    [incident] = incidents(log)

    assert (incident["kind"], incident["class"], incident["suspect_text"]) == (kind, failure_class, suspect)


def test_a_prefill_send_of_state_names_the_decode_it_could_not_reach(tmp_path: Path):
    line = (
        "[2026-03-02 10:00:05 TP0] Prefill transfer failed for request rank=0 req.rid='p7003' "
        "req.bootstrap_room=7003 with exception KVTransferError(bootstrap_room=7003): Failed to send state "
        "components of 7003 to 10.2.0.9:40001\n"
    )
    [incident] = incidents(write(tmp_path, "prefill.log", line))

    assert (incident["kind"], incident["class"], incident["suspect_text"]) == (
        "unresponsive",
        "send_failed",
        "decode at 10.2.0.9:40001",
    )


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (
            [
                "[rank3]:[E1117 21:22:11.441603074 ProcessGroupNCCL.cpp:2068] [PG ID 2 PG GUID 3 Rank 3] Process "
                "group watchdog thread terminated with exception: CUDA error: device-side assert triggered\n"
            ],
            "decode-0/TP3 crashed at 21:22:11 ([PG ID 2 PG GUID 3 Rank 3] Process group watchdog thread terminated",
        ),
        (
            [
                "terminate called after throwing an instance of 'c10::DistBackendError'\n",
                "  what():  [PG ID 2 PG GUID 3 Rank 3] Process group watchdog thread terminated with exception\n",
            ],
            "decode-0/TP3 crashed at 21:22:10 (terminate called after throwing an instance of 'c10::DistBackendError')",
        ),
    ],
    ids=["nccl-watchdog", "std-terminate"],
)
def test_a_pytorch_rank_that_dies_is_its_ranks_crash(tmp_path: Path, lines: list[str], said: str):
    batch = BATCH.format(tp=3).replace("2026-03-02 10:00:00", "2025-11-17 21:22:10")
    log = write(tmp_path, "decode.log", batch, *lines)

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2, check.stdout
    assert said in check.stdout


def test_a_bootstrap_server_not_registered_yet_is_one_failure_of_its_address_after_every_attempt(tmp_path: Path):
    """SGLang 0.5.23 asks a prefill's bootstrap server 15 times 1 s apart (`Failed to get prefill server info:
    503, ...` each time, naming no address), gives up naming it, and aborts the rooms that waited (their lines say
    `Aborted by AbortReq.`): `check` said OK. Now one failure of the address, however many attempts."""
    attempts = [
        f"[2026-03-02 10:00:{second:02d} TP0] Failed to get prefill server info: 503, Prefill server not fully "
        "registered yet (1 workers registered).\n"
        for second in range(1, 16)
    ]
    gave_up = "[2026-03-02 10:00:15 TP0] Could not fetch prefill parallel info from 10.2.0.5:8998 after 15 attempts\n"
    log = write(tmp_path, "decode.log", BATCH.format(tp=0), *attempts, gave_up)

    check = kvtop_here("check", "--sglang-log", str(log))
    [incident] = incidents(log)

    assert check.returncode == 2, check.stdout
    assert "(bootstrap_error) since 10:00:01, 1 failure naming no room" in check.stdout  # since its first attempt
    assert (incident["suspect_text"], incident["class"], incident["roomless"]) == (
        "prefill at 10.2.0.5:8998",
        "bootstrap_error",
        1,
    )


def test_a_ranks_attempts_at_a_bootstrap_server_are_one_failure_a_later_one_another(tmp_path: Path):
    """SGLang 0.5.9 logs `Error fetching prefill server info from bootstrap: ...` at each of its 20 attempts, 3 s
    apart (a public report, sglang #20252, pasted twenty): twenty failures naming no room before. Attempts at most
    `RETRY_S` apart are one; an error a minute later is another failure."""
    error = (
        "[2026-03-10 14:{minute:02d}:{second:02d} TP0] Error fetching prefill server info from bootstrap: "
        "HTTPConnectionPool(host='10.2.0.6', port=8998): Max retries exceeded with url: /route?engine_rank=-1\n"
    )
    attempts = [error.format(minute=48, second=second) for second in range(0, 60, 3)]
    log = write(tmp_path, "decode.log", *attempts, error.format(minute=50, second=0))

    [incident] = incidents(log)

    assert (incident["suspect_text"], incident["roomless"]) == ("prefill at 10.2.0.6:8998", 2)


def test_a_rank_whose_own_bootstrap_thread_died_is_the_suspect_of_its_bootstrapping_timeouts(tmp_path: Path):
    """SGLang 0.5.23's NIXL prefill logs `prefill bootstrap_thread died on engine_rank=1; requests to this rank will
    time out in KVPoll.Bootstrapping`: its requests then time out waiting for the decode's, which named "the decode
    side of prefill-0" (a prefill timeout's rule). The rank whose thread died is what broke."""
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/disaggregation/nixl/conn.py", line 3380, in bootstrap_thread\n'
        "    self.agent.add_remote_agent(decode_kv_args.agent_metadata)\n"
        "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND\n"
    )
    log = write(
        tmp_path,
        "prefill.log",
        "[2026-03-01 10:20:00 TP1] prefill bootstrap_thread died on engine_rank=1; requests to this rank will time "
        "out in KVPoll.Bootstrapping\n",
        "[2026-03-01 10:20:00 TP1] Exception in thread Thread-4 (bootstrap_thread_guarded):\n",
        traceback,
        "[2026-03-01 10:25:00 TP1] Prefill bootstrap failed for request rank=1 req.rid='p47' req.bootstrap_room=7004 "
        "with exception KVTransferError(bootstrap_room=7004): Request 7004 timed out after 300.0s in "
        "KVPoll.Bootstrapping\n",
    )

    [incident] = incidents(log)

    assert (incident["suspect_text"], incident["class"]) == ("prefill-0/TP1", "timeout_bootstrap")
    assert incident["evidence"] == ["a transfer thread of it died 300 s before it recorded timeout_bootstrap"]


def test_the_rooms_sglang_aborts_after_it_gave_up_on_a_bootstrap_server_are_that_servers_not_the_clients(
    tmp_path: Path,
):
    """After its last attempt SGLang 0.5.23 aborts the rooms that waited (`receiver.abort()`), and their lines say
    `Aborted by AbortReq.`, the client's words: read as client aborts, apart from the incident, and never counted
    as failures. A decode rank's abort within 2 s after its own give-up is a room of that give-up."""
    lines = [BATCH.format(tp=0)]
    for tp in (0, 1):
        lines.append(f"[2026-03-02 10:00:15 TP{tp}] Could not fetch prefill parallel info from 10.2.0.5:8998 after 15 "
                     "attempts\n")  # fmt: skip
        lines += [
            f"[2026-03-02 10:00:15 TP{tp}] Decode handshake failed for request rank={tp} decode_req.req.rid='d{room}' "
            f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): Aborted by "
            "AbortReq.\n"
            for room in (801, 802)
        ]
    lines.append(
        "[2026-03-02 10:01:00 TP0] Decode handshake failed for request rank=0 decode_req.req.rid='d803' "
        "decode_req.req.bootstrap_room=803 with exception KVTransferError(bootstrap_room=803): Aborted by AbortReq.\n"
    )  # a client's, 45 s later
    log = write(tmp_path, "decode.log", *lines)

    found = sorted((i["suspect_text"], i["class"], i["room_count"], i["roomless"]) for i in incidents(log))

    assert found == [("prefill at 10.2.0.5:8998", "bootstrap_error", 2, 0), ("the client", "aborted", 1, 0)]
