"""A sender whose own transport library logged a fault of its own side just before its send failed is what broke,
not the decode it could not send to (DOMAIN.md: transport-library lines are the likely cause of failures near them).

A public report (an operator's notes of a 1P1D Mooncake RDMA run, 2026-02-19) pasted every prefill rank's
`rdma_transport.cpp:529] Memory region not registered by any active device(s)` in the same millisecond as its
`Session ... failed.` and `Failed to send kv chunk of R to H:P`, while every decode rank, alive, logged the prefill's
`Failed to get kvcache from prefill instance`: the memory registration of the sending side was wrong, and kvtop
named "decode at H:P stopped answering". ibverbs' local completion errors (`local protection error`, ...) tell the
same of the side that logs them. A send failure with no such line near it still names the decode at its address.

The lines below are in the report's and SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

pytestmark = pytest.mark.usefixtures("utc")

ROOM, LATER = 5550001, 5550002


def send_failure(ts: str, tp: int, room: int, to: str) -> str:
    return (
        f"[{ts} TP{tp}] Prefill transfer failed for request rank={tp} req.rid='p{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): Failed to send kv chunk of {room} to {to}\n"
    )


def prefill_log(tmp_path: Path) -> Path:
    log = tmp_path / "prefill.log"
    log.write_text(
        "".join(
            [
                "[2026-03-02 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 11, #cached-token: 1, "
                "token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 0, #inflight-req: 0\n",
                *(
                    f"E0302 10:00:01.9406{tp} 5721{tp} rdma_transport.cpp:529] Memory region not registered by any "
                    f"active device(s): 0x7f4e0200168{tp}\n"
                    for tp in range(2)
                ),
                *(f"[2026-03-02 10:00:01 TP{tp}] Session 10.9.0.7:1620{tp} failed.\n" for tp in range(2)),
                *(send_failure("2026-03-02 10:00:01", tp, ROOM, f"10.9.0.7:4099{tp}") for tp in range(2)),
                send_failure("2026-03-02 10:01:30", 0, LATER, "10.9.0.8:40991"),  # 89 s later, no fault of its own
            ]
        )
    )
    return log


def decode_log(tmp_path: Path) -> Path:
    log = tmp_path / "decode.log"
    log.write_text(
        "".join(
            f"[2026-03-02 10:00:01 TP{tp}] Decode transfer failed for request rank={tp} "
            f"decode_req.req.rid='d{ROOM}' decode_req.req.bootstrap_room={ROOM} with exception "
            f"KVTransferError(bootstrap_room={ROOM}): Failed to get kvcache from prefill instance, it might be dead\n"
            for tp in range(2)
        )
    )
    return log


def test_a_send_failure_after_the_senders_own_transport_fault_names_the_sender(tmp_path: Path):
    logs = ["--sglang-log", str(prefill_log(tmp_path)), "--sglang-log", str(decode_log(tmp_path))]

    incidents = json.loads(kvtop_here("incidents", *logs, "--json").stdout)["incidents"]
    check = kvtop_here("check", *logs)

    by_room = {room: incident for incident in incidents for room in incident["rooms"]}
    sender = by_room[ROOM]
    assert (sender["suspect"]["name"], sender["kind"], sender["room_count"]) == ("prefill-0", "failing", 1)
    assert "Memory region not registered" in " ".join(sender["evidence"])
    later = by_room[LATER]  # no fault of its own near it: the decode at the address it could not send to
    assert (later["suspect"]["name"], later["kind"]) == ("10.9.0.8:40991", "unresponsive")
    assert check.returncode == 2
    assert "prefill-0 fails transfers (send_failed)" in check.stdout
    assert "10.9.0.7" not in check.stdout.split(" | ")[0].split("transport errors")[0]  # no decode at 10.9.0.7 named


@pytest.mark.parametrize(
    ("fault", "second"),
    [
        pytest.param(  # sglang #7118, Mooncake #917: `TCP cannot transmit data located on the GPU` (EFAULT)
            "E0612 14:05:26.176716 1192408 tcp_transport.cpp:136] Session::writeBody failed. Error: Bad address "
            "(value: 14), total_transferred_bytes_: 0, current transferred_bytes: 0",
            "2025-06-12 14:05:26",
            id="gpu-memory-to-the-tcp-transport",
        ),
        pytest.param(  # a GLM-5.2 operator's MI325X notes (SGLang 0.5.16): GPU IPC chosen for a peer on another host
            "E0728 12:41:38.101000 5151 hip_transport.cpp:70] HipTransport: hipIpcOpenMemHandle failed (Error code: "
            "17 - invalid device pointer)",
            "2026-07-28 12:41:38",
            id="gpu-ipc-to-another-host",
        ),
        pytest.param(  # Mooncake #1845 (SGLang 0.5.7 PD after running a while), Mooncake's troubleshooting guide
            "E0114 09:12:40.552013 88213 rdma_endpoint.cpp:188] Failed to create QP: Cannot allocate memory",
            "2026-01-14 09:12:40",
            id="queue-pairs-used-up",
        ),
        pytest.param(  # Ascend/sglang PR #872's NPU CI log, as a public analysis of it quotes it
            "2026-06-12 08:10:40.402117 ERROR [737690-737712][HYBM hybm_dev_user_legacy_segment.cpp:394 "
            "ImportSliceInfo] IpcOpenMemory(000b419b00000000000300) failed:507899, sdid=140247054, pid=737690, "
            "deviceId=6, sliceInfo.logicDeviceId=5",
            "2026-06-12 08:10:41",
            id="memfabric-could-not-open-the-peer-s-memory",
        ),
        pytest.param(  # sglang PR #31208: Mooncake's TCP transport, a connection per transfer, each left in TIME_WAIT
            "E0714 03:12:09.118204 4121 tcp_transport.cpp:361] TcpTransport::getConnection failed to create connection "
            "to 10.32.17.209:16680. Error: connect: Cannot assign requested address",
            "2026-07-14 03:12:09",
            id="its-own-ephemeral-ports-used-up",
        ),
    ],
)
def test_a_send_its_own_transport_could_not_make_names_the_sender(tmp_path: Path, fault: str, second: str):
    """Mooncake's TCP transport given GPU memory (`Bad address`), its HIP transport opening a remote peer's memory
    by IPC (`hipIpcOpenMemHandle failed`), its queue pairs used up (`Failed to create QP`), MemFabric unable to open
    the peer's memory slice (`IpcOpenMemory(...) failed`): the sender's own fault, not the decode's it could not send
    to."""
    log = tmp_path / "prefill.log"
    log.write_text(
        f"{fault}\n[{second}] Session 10.32.17.209:16680 failed.\n"
        + send_failure(second, 0, ROOM, "10.32.17.209:41001")
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert "incident: prefill-0 fails transfers (send_failed)" in check.stdout


def test_a_session_given_up_on_for_the_sender_s_own_fault_refused_later_names_the_sender(tmp_path: Path):
    """sglang PR #31208: Mooncake's TCP transport, a fresh connection per transfer, used up the prefill's ephemeral
    ports (`connect: Cannot assign requested address`); SGLang then gave up on the session and refused it in every
    later room (`remote mooncake session S is not alive`) while the decode, alive, logged `Failed to get kvcache`. The
    refusals 40 s on named `decode at S stopped answering`, an incident beside the sender's own: they are its
    aftermath."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "E0714 03:12:09.118204 4121 tcp_transport.cpp:361] TcpTransport::getConnection failed to create connection "
        "to 10.32.17.209:16680. Error: connect: Cannot assign requested address\n"
        "[2026-07-14 03:12:09 TP0] Session 10.32.17.209:16680 failed.\n"
        + send_failure("2026-07-14 03:12:09", 0, ROOM, "10.32.17.209:41001")
        + f"[2026-07-14 03:12:49 TP0] Prefill transfer failed for request rank=0 req.rid='p{LATER}' "
        f"req.bootstrap_room={LATER} with exception KVTransferError(bootstrap_room={LATER}): Decode instance could be "
        "dead, remote mooncake session 10.32.17.209:16680 is not alive\n"
    )

    found = json.loads(kvtop_here("incidents", "--json", "--sglang-log", str(log)).stdout)["incidents"]

    assert [(i["suspect_text"], i["kind"], i["room_count"]) for i in found] == [("prefill-0", "failing", 2)]
    assert "it gave up on 10.32.17.209:16680 40 s before, right after its own transport logged" in str(found)


def test_a_send_failure_keeps_its_senders_fault_when_140_more_come_later_in_one_read(tmp_path: Path):
    """A log read in one pass folds its failures at its end: the 64 local faults kept of prefill-0 were then the last
    ones, 10 minutes after the send failure, and it read `decode at 10.9.0.7:16200 stopped answering`. The failures
    taken are folded before the oldest faults go (64 at once, at 128), and `status` counts those that went."""
    log = tmp_path / "prefill.log"
    later = (
        f"E0302 10:{10 + i // 60:02d}:{i % 60:02d}.100000 57210 rdma_transport.cpp:529] Memory region not registered "
        f"by any active device(s): 0x7f4e0200{i:04d}\n"
        for i in range(140)
    )
    log.write_text(
        "E0302 10:00:01.940600 57210 rdma_transport.cpp:529] Memory region not registered by any active device(s): "
        "0x7f4e02001680\n[2026-03-02 10:00:01 TP0] Session 10.9.0.7:16200 failed.\n"
        + send_failure("2026-03-02 10:00:01", 0, ROOM, "10.9.0.7:40990")
        + "".join(later)
    )

    [incident] = json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]
    status = json.loads(kvtop_here("status", "--sglang-log", str(log), "--json").stdout)

    assert (incident["suspect"]["name"], incident["kind"]) == ("prefill-0", "failing")
    assert status["transport_notes_dropped"] == 64  # 141 faults: at the 128th the oldest 64 went
