"""A send that failed after the two sides' RDMA handshake failed is the link's failure, not the decode's silence.

sglang PR #27730's ROCm run (1P1D, both servers on one host) logged Mooncake's `received packet mismatch` (the peer's
handshake answer named no NIC), then `[Handshake] Failed to modify QP to RTR ... Connection timed out [110]`, a
synchronous transfer that timed out 30 s later, and the decode's `Failed to get kvcache from prefill instance`.
kvtop named "decode at H:P stopped answering": the decode was alive, and Mooncake's troubleshooting guide says
either side's setup (GID index, MTU, the NICs paired) or the network between them makes a QP fail to reach RTR. So the
suspect is the link between the room's two sides, `fails transfers`, evidence quoting the handshake.

The lines below are in Mooncake's and SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

ROOM, LATER = 8100001, 8100002
QP_TO_RTR = (
    "E0701 10:01:{s}.100000  4242 rdma_endpoint.cpp:1033] [Handshake] Failed to modify QP to RTR, check mtu, gid, "
    "peer lid, peer qp num: Connection timed out [110]\n"
)
MISMATCH = (
    "E0701 10:01:00.090000  4343 rdma_endpoint.cpp:472] Invalid argument: received packet mismatch, "
    "local.local_nic_path: 10.6.0.4:16416@rdma2, local.peer_nic_path: 10.6.0.4:15806@rdma0, "
    "peer.local_nic_path: , peer.peer_nic_path: \n"
)


def prefill_log(tmp_path: Path, fault: str = QP_TO_RTR.format(s="00")) -> Path:
    """A prefill whose sync transfer to the decode at 10.6.0.4 timed out 30 s after `fault`, its session then
    blacklisted for the next room."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-07-01 10:00:00] server_args=ServerArgs(tp_size=1, disaggregation_mode='prefill', "
        "disaggregation_transfer_backend='mooncake', disaggregation_bootstrap_port=8998)\n"
        + fault
        + "E0701 10:01:30.100000  4242 transfer_engine_py.cpp:614] Sync batch data transfer timeout after "
        "30000001699ns\n"
        + "[2026-07-01 10:01:30 TP0] Session 10.6.0.4:16416 failed.\n"
        + prefill_failure("2026-07-01 10:01:30", ROOM, f"Failed to send kv chunk of {ROOM} to 10.6.0.4:40211")
        + prefill_failure(
            "2026-07-01 10:01:31",
            LATER,
            "Decode instance could be dead, remote mooncake session 10.6.0.4:16416 is not alive",
        )
    )
    return log


def decode_log(tmp_path: Path, fault: str = "") -> Path:
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-07-01 10:00:01] server_args=ServerArgs(tp_size=1, disaggregation_mode='decode', "
        "disaggregation_transfer_backend='mooncake')\n"
        + fault
        + "".join(
            decode_failure(
                f"2026-07-01 10:01:3{i}", room, "Failed to get kvcache from prefill instance, it might be dead"
            )
            for i, room in enumerate((ROOM, LATER))
        )
    )
    return log


def incidents(*logs: Path) -> list[dict[str, object]]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    return json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]


def test_a_send_after_the_sender_s_handshake_failed_is_the_link_s_failure(tmp_path: Path):
    found = incidents(prefill_log(tmp_path), decode_log(tmp_path))

    assert [(i["suspect_text"], i["kind"], i["room_count"]) for i in found] == [
        ("the link between prefill-0 and decode-0", "failing", 2)
    ]
    assert found[0]["suspect"] == {"kind": "link", "name": "prefill-0 - decode-0", "role": ""}
    assert found[0]["evidence"][0] == (
        "prefill-0's transport logged 'Failed to modify QP to RTR' 30 s before (either end's setup, or the network "
        "between them)"
    )


def test_the_decode_s_mismatched_handshake_says_the_same(tmp_path: Path):
    found = incidents(prefill_log(tmp_path, fault=""), decode_log(tmp_path, fault=MISMATCH))

    assert [(i["suspect_text"], i["kind"]) for i in found] == [("the link between prefill-0 and decode-0", "failing")]
    assert "decode-0's transport logged 'received packet mismatch'" in found[0]["evidence"][0]


def test_with_the_prefill_s_log_alone_the_decode_end_is_its_address(tmp_path: Path):
    check = kvtop_here("check", "--sglang-log", str(prefill_log(tmp_path)))

    assert "incident: the link between prefill-0 and decode at 10.6.0.4:16416 fails transfers (send_failed)" in (
        check.stdout
    )


def test_a_handshake_that_failed_minutes_before_explains_nothing(tmp_path: Path):
    early = QP_TO_RTR.format(s="00").replace("E0701 10:01:", "E0701 09:58:")

    found = incidents(prefill_log(tmp_path, fault=early), decode_log(tmp_path))

    assert [(i["suspect_text"], i["kind"]) for i in found] == [("decode at 10.6.0.4:16416", "unresponsive")]
