"""Mooncake names one decode rank by two addresses: a prefill rank that fails to send logs `Session S failed.` (S:
the decode rank's transfer engine, `host:rpc_port`) and `Failed to send kv chunk of R to H:P` (P: the same rank's
ZeroMQ port), and every later room to it fails with `remote mooncake session S is not alive` (SGLang 0.5.23's
mooncake/conn.py). sglang PR #30737 quotes both failures of one such rank; kvtop read them as two decode ranks
stopped answering, two incidents for one cause. The session its sender gave up on in the same second, on the
address's host, names the rank the send failed to.

The lines are in SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure

pytestmark = pytest.mark.usefixtures("utc")

FIRST, LATER, LAST = 7730001, 7730002, 7730003


def prefill_failure(ts: str, tp: int, room: int, reason: str) -> str:
    return (
        f"[{ts} TP{tp}] Prefill transfer failed for request rank={tp} req.rid='p{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): {reason}\n"
    )


def logs(tmp_path: Path, session: str) -> list[str]:
    """A prefill rank that gives up on `session` as its send of FIRST to 10.0.3.17:41233 fails; LATER and LAST then
    fail on 10.0.3.17:15502's session; the decode ranks record what the prefill told them."""
    prefill = tmp_path / "prefill.log"
    prefill.write_text(
        f"[2026-07-10 22:03:11 TP0] Session {session} failed.\n"
        + prefill_failure("2026-07-10 22:03:11", 0, FIRST, f"Failed to send kv chunk of {FIRST} to 10.0.3.17:41233")
        + "".join(
            prefill_failure(
                ts, 0, room, "Decode instance could be dead, remote mooncake session 10.0.3.17:15502 is not alive"
            )
            for ts, room in (("2026-07-10 22:03:12", LATER), ("2026-07-10 22:03:20", LAST))
        )
    )
    decode = tmp_path / "decode.log"
    told = "Failed to get kvcache from prefill instance, it might be dead"
    decode.write_text(
        "".join(
            decode_failure(ts, room, told)
            for ts, room in (
                ("2026-07-10 22:03:11", FIRST),
                ("2026-07-10 22:03:12", LATER),
                ("2026-07-10 22:03:20", LAST),
            )
        )
    )
    return ["--sglang-log", str(prefill), "--sglang-log", str(decode)]


def incidents(args: list[str]) -> list[dict]:
    return [
        i for i in json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"] if i["kind"] != "aborted"
    ]


def test_a_decode_rank_mooncake_gave_up_on_is_one_incident_named_by_its_session(tmp_path: Path):
    found = incidents(logs(tmp_path, "10.0.3.17:15502"))

    assert [(i["suspect"]["name"], i["kind"], i["room_count"]) for i in found] == [
        ("10.0.3.17:15502", "unresponsive", 3)
    ]
    check = kvtop_here("check", *logs(tmp_path, "10.0.3.17:15502"))
    assert "decode at 10.0.3.17:15502 stopped answering" in check.stdout
    assert "41233" not in check.stdout.partition(" | ")[0]


def test_a_session_on_another_host_does_not_name_the_rank_a_send_failed_to(tmp_path: Path):
    """The send's address and the session then read as two decode ranks of 10.0.3.17 that failed in the same
    seconds: that host's decode side, one incident (docs/incidents.md)."""
    found = incidents(logs(tmp_path, "10.0.3.99:15502")[:2])  # the prefill's log (the decode's answering: the link)

    assert [(i["suspect"], i["room_count"]) for i in found] == [
        ({"kind": "host", "name": "10.0.3.17", "role": "decode"}, 3)
    ]
    assert found[0]["evidence"][0] == "its sessions 10.0.3.17:41233, 10.0.3.17:15502 failed together"
    assert "10.0.3.99" not in json.dumps(found)


def test_rooms_a_blacklisted_session_fails_minutes_apart_are_one_incident(tmp_path: Path):
    """SGLang blacklists a session at its first failed send and fails every later room to it at once (sglang #13054,
    #37022: `... is not alive` for an hour, the decode healthy): one room every 3 minutes made 21 incidents, each
    past the quiet gap. It is one cause: the sender's standing refusal."""
    not_alive = "Decode instance could be dead, remote mooncake session 10.0.3.17:15502 is not alive"
    prefill = tmp_path / "prefill.log"
    prefill.write_text(
        "[2026-07-10 22:00:00 TP0] Session 10.0.3.17:15502 failed.\n"
        + prefill_failure("2026-07-10 22:00:00", 0, FIRST, f"Failed to send kv chunk of {FIRST} to 10.0.3.17:41233")
        + "".join(prefill_failure(f"2026-07-10 22:{3 * i:02d}:00", 0, FIRST + i, not_alive) for i in range(1, 11))
    )

    found = incidents(["--sglang-log", str(prefill)])

    assert [(i["suspect"]["name"], i["room_count"]) for i in found] == [("10.0.3.17:15502", 11)]
