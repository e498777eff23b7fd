"""A side whose transport could not register its memory is what broke, not the peer that then failed to send to it.

Mooncake warns `RdmaTransport: Failed to register memory: addr A length L` for each buffer the NIC refused (GPU memory
without `nvidia_peermem`: Mooncake #351, #1207) and the server starts all the same. From then on no peer can write into
that memory: a prefill's send to that decode fails (`Session S failed.`, `Failed to send kv chunk of R to P`), later
rooms meet the blacklisted session (`remote mooncake session S is not alive`), and the decode, alive, waits out its
300 s. kvtop named "decode at P stopped answering": the right side by an address, the wrong failure, for it never
stopped. An operator's notes of a DeepSeek-R1 PD deployment (2026-02-19) show the shape: a decode node's startup
warnings of it, a minute before the prefill's failed sends.

The lines below are in Mooncake's and SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

ROOM, LATER = 7300001, 7300002
UNREGISTERED = (
    "W0903 08:00:31.118204  4711 rdma_transport.cpp:400] RdmaTransport: Failed to register memory: "
    "addr 0x7f2a6000000{n} length 134217728\n"
)


def decode_log(tmp_path: Path, *, unregistered: bool = True, name: str = "decode.log") -> Path:
    """A decode (TP1) that warned of its memory at start (or not), then timed out both rooms in WaitingForInput."""
    log = tmp_path / name
    warnings = "".join(UNREGISTERED.format(n=n) for n in range(3)) if unregistered else ""
    log.write_text(
        "[2026-09-03 08:00:02] server_args=ServerArgs(tp_size=1, disaggregation_mode='decode', "
        "disaggregation_transfer_backend='mooncake')\n"
        + warnings
        + "".join(
            decode_failure(
                f"2026-09-03 08:06:{12 + i}", room, f"Request {room} timed out after 300.0s in KVPoll.WaitingForInput"
            )
            for i, room in enumerate((ROOM, LATER))
        )
    )
    return log


def prefill_log(tmp_path: Path, *, unregistered: bool = False) -> Path:
    """A prefill (TP1) whose first send to the decode at 10.7.3.21 failed, its session then blacklisted."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-09-03 08:00:01] server_args=ServerArgs(tp_size=1, disaggregation_mode='prefill', "
        "disaggregation_transfer_backend='mooncake', disaggregation_bootstrap_port=8998)\n"
        + (UNREGISTERED.format(n=9).replace("08:00:31", "08:00:30") if unregistered else "")
        + "[2026-09-03 08:01:12 TP0] Session 10.7.3.21:15301 failed.\n"
        + prefill_failure("2026-09-03 08:01:12", ROOM, f"Failed to send kv chunk of {ROOM} to 10.7.3.21:40211")
        + prefill_failure(
            "2026-09-03 08:01:13",
            LATER,
            "Decode instance could be dead, remote mooncake session 10.7.3.21:15301 is not alive",
        )
    )
    return log


def incidents(*logs: Path) -> list[dict[str, object]]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    return json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]


def test_a_decode_that_could_not_register_its_memory_fails_the_transfers_sent_to_it(tmp_path: Path):
    found = incidents(prefill_log(tmp_path), decode_log(tmp_path))

    assert [(i["suspect_text"], i["kind"], i["room_count"]) for i in found] == [("decode-0", "failing", 2)]
    assert found[0]["evidence"][0] == (
        "its transport could not register its memory ('Failed to register memory' 41 s before)"
    )


def test_its_log_alone_says_as_much_of_the_kv_it_waited_for_in_vain(tmp_path: Path):
    """Without the prefill's log its timeouts read "the prefill side of decode-0 stopped answering": the KV never
    came, but because nothing could write it."""
    found = incidents(decode_log(tmp_path))

    assert [(i["suspect_text"], i["kind"], i["room_count"]) for i in found] == [("decode-0", "failing", 2)]


def test_the_sender_s_own_unregistered_memory_comes_first(tmp_path: Path):
    """Both sides warned (nvidia_peermem missing on every host): the sender cannot read what it sends either; its
    own fault is named, as a sender's local fault is."""
    found = incidents(prefill_log(tmp_path, unregistered=True), decode_log(tmp_path))

    assert [(i["suspect_text"], i["kind"]) for i in found] == [("prefill-0", "failing")]


def test_a_decode_that_registered_its_memory_is_still_the_address_that_stopped_answering(tmp_path: Path):
    found = incidents(prefill_log(tmp_path), decode_log(tmp_path, unregistered=False))

    assert [(i["suspect_text"], i["kind"]) for i in found] == [("decode at 10.7.3.21:15301", "unresponsive")]


def test_another_decode_s_warnings_tell_nothing_of_this_one(tmp_path: Path):
    other = tmp_path / "decode-b.log"
    other.write_text(
        "[2026-09-03 08:00:03] server_args=ServerArgs(tp_size=1, disaggregation_mode='decode')\n"
        + UNREGISTERED.format(n=5)
        + decode_failure("2026-09-03 08:00:40", 7300099, "Aborted by AbortReq.")
    )

    found = incidents(prefill_log(tmp_path), decode_log(tmp_path, unregistered=False), other)

    cluster = [i for i in found if not i["client"]]
    assert [(i["suspect_text"], i["kind"]) for i in cluster] == [("decode at 10.7.3.21:15301", "unresponsive")]


def test_check_warns_of_the_warning_before_any_room_failed(tmp_path: Path):
    """A decode that could not register its memory fails every room sent to it: the first warning is worth one
    before the first failure."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-09-03 08:00:02] server_args=ServerArgs(tp_size=1, disaggregation_mode='decode')\n"
        + UNREGISTERED.format(n=0)
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 1
    assert "1 transport error in the logs, the last at 08:00:31: W0903" in check.stdout


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(UNREGISTERED.format(n=0), id="its-memory-unregistered"),
        pytest.param(
            "E0903 08:05:50.100000  4711 rdma_endpoint.cpp:1033] [Handshake] Failed to modify QP to RTR, check mtu, "
            "gid, peer lid, peer qp num: Connection timed out [110]\n",
            id="a-handshake-that-failed",
        ),
    ],
)
def test_neither_explains_a_prefill_heartbeat_the_decode_lost(tmp_path: Path, fault: str):
    """What keeps KV from a decode's memory says nothing of a prefill that stopped answering its health checks."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-09-03 08:00:02] server_args=ServerArgs(tp_size=1, disaggregation_mode='decode')\n"
        + fault
        + "[2026-09-03 08:06:00 TP0] Lost connection with prefill instance (bootstrap_addr: 10.7.3.9:8998), 1 requests "
        "affected\n"
        + decode_failure(
            "2026-09-03 08:06:00", ROOM, "Lost connection with prefill instance (bootstrap_addr: 10.7.3.9:8998)"
        )
    )

    found = incidents(log)

    assert [(i["suspect_text"], i["kind"]) for i in found] == [("prefill at 10.7.3.9:8998", "unresponsive")]
