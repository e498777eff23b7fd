"""A decode server on one node with several ranks (decode TP, or DP attention) has one Mooncake session per rank on
that node's host (`H:P1`, `H:P2`, ...). When it dies, the prefill ranks log `Session H:P1 failed.`, `Failed to send
kv chunk of R to H:Q1`, `remote mooncake session H:P2 is not alive` for different sessions of one host in the same
seconds: kvtop made one incident per session ("decode at H:P1 stopped answering", "decode at H:P2 ...") for one
dead node, on a prefill-only log (the operator read only the prefill servers' logs). Sessions of one host that start
failing within the quiet gap of one another are one incident of that host's decode side; one that starts failing
long after is a new death, its own incident.

The lines are in SGLang's shapes (mooncake/conn.py, as the fixtures' prefill logs hold them), with times, rooms and
addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

HOST = "10.6.0.44"
SESSIONS = tuple(f"{HOST}:{15000 + 97 * rank}" for rank in range(4))
"""The decode ranks' transfer engines (`host:rpc_port`), one per rank."""
NOT_ALIVE = "Decode instance could be dead, remote mooncake session {} is not alive"


def gave_up(ts: str, room: int, rank: int, tp: int = 0) -> str:
    """A prefill rank's first failed send to decode rank `rank`: Mooncake gives up on its session (`Session S
    failed.`) and the send to its ZeroMQ port fails."""
    return f"[{ts} TP{tp}] Session {SESSIONS[rank]} failed.\n" + prefill_failure(
        ts, room, f"Failed to send kv chunk of {room} to {HOST}:{41000 + rank}", tp
    )


def refused(ts: str, room: int, rank: int, tp: int = 0) -> str:
    """A later room to a session the prefill rank gave up on: failed at once."""
    return prefill_failure(ts, room, NOT_ALIVE.format(SESSIONS[rank]), tp)


DP_ROOMS = (
    gave_up("2026-07-12 10:20:01", 6300001, 0)
    + gave_up("2026-07-12 10:20:03", 6300002, 1)
    + refused("2026-07-12 10:20:04", 6300003, 0)
    + gave_up("2026-07-12 10:20:06", 6300004, 2)
    + gave_up("2026-07-12 10:20:09", 6300005, 3)
    + refused("2026-07-12 10:20:10", 6300006, 1)
)
"""A decode of DP attention (four DP ranks on one node) died at 10:20: each room goes to one DP rank, so each names
one session, a different one as the rooms come."""


def prefill_log(tmp_path: Path, text: str) -> list[str]:
    log = tmp_path / "prefill.log"
    log.write_text(text)
    return ["--sglang-log", str(log)]


def incidents(args: list[str]) -> list[dict]:
    return json.loads(kvtop_here("incidents", "--json", *args).stdout)["incidents"]


def test_sessions_of_one_host_that_fail_in_the_same_seconds_are_one_incident_of_that_host(tmp_path: Path):
    args = prefill_log(tmp_path, DP_ROOMS)

    found = incidents(args)

    assert [(i["suspect"], i["suspect_text"], i["room_count"], i["origins"]) for i in found] == [
        ({"kind": "host", "name": HOST, "role": "decode"}, f"decode at {HOST} (4 sessions)", 6, 6)
    ]
    assert found[0]["classes"] == {"send_failed": 4, "peer_lost": 2}
    assert found[0]["evidence"][0] == f"its sessions {', '.join(SESSIONS)} failed together"
    assert found[0]["first_seen"] == pytest.approx(found[0]["last_seen"] - 9)
    check = kvtop_here("check", *args).stdout.splitlines()[0]
    assert f"incident: decode at {HOST} (4 sessions) stopped answering (send_failed) since" in check
    table = kvtop_here("incidents", *args).stdout.splitlines()
    assert len(table) == 2 and f"decode at {HOST} (4 sessions)" in table[1]


def test_a_later_room_a_session_of_the_host_refuses_joins_the_hosts_incident(tmp_path: Path):
    """SGLang fails every later room to a session it gave up on at once, however long after: the same dead node."""
    found = incidents(prefill_log(tmp_path, DP_ROOMS + refused("2026-07-12 10:31:00", 6300007, 2)))

    assert [(i["suspect_text"], i["room_count"]) for i in found] == [(f"decode at {HOST} (4 sessions)", 7)]


def test_a_session_of_the_host_that_starts_failing_long_after_is_a_new_death(tmp_path: Path):
    """Twenty minutes on, a fifth rank of the host (another server beside it, or the node's decode restarted)
    fails afresh: its own incident, not the host's of 10:20."""
    fifth = f"{HOST}:15388"
    later = (
        f"[2026-07-12 10:40:00 TP0] Session {fifth} failed.\n"
        + prefill_failure("2026-07-12 10:40:00", 6300008, f"Failed to send kv chunk of 6300008 to {HOST}:41004")
        + prefill_failure("2026-07-12 10:40:02", 6300009, NOT_ALIVE.format(fifth))
    )

    found = incidents(prefill_log(tmp_path, DP_ROOMS + later))

    assert sorted((i["suspect_text"], i["room_count"]) for i in found) == [
        (f"decode at {HOST} (4 sessions)", 6),
        (f"decode at {fifth}", 2),
    ]


def test_one_session_that_failed_alone_stays_an_incident_of_that_session(tmp_path: Path):
    found = incidents(prefill_log(tmp_path, gave_up("2026-07-12 10:20:01", 6300001, 2)))

    assert [(i["suspect"]["kind"], i["suspect_text"], i["evidence"]) for i in found] == [
        ("rank", f"decode at {SESSIONS[2]}", ["sending to it failed"])
    ]


def test_a_session_of_another_host_in_the_same_seconds_is_its_own_incident(tmp_path: Path):
    other = prefill_failure("2026-07-12 10:20:05", 6300010, NOT_ALIVE.format("10.6.0.45:15000"))

    found = incidents(prefill_log(tmp_path, DP_ROOMS + other))

    assert sorted((i["suspect_text"], i["room_count"]) for i in found) == [
        (f"decode at {HOST} (4 sessions)", 6),
        ("decode at 10.6.0.45:15000", 1),
    ]


TP_ROOMS = (
    (6400001, "2026-07-12 11:00:05", 2),
    (6400002, "2026-07-12 11:00:07", 0),
    (6400003, "2026-07-12 11:00:09", 3),
)
"""A decode of TP4 on one node, to a prefill of TP4: each prefill rank sends to its own decode rank, so each room
names the four sessions, the rank that printed first (the room's origin) another each time."""


def tp_log(tmp_path: Path) -> list[str]:
    lines = []
    for room, ts, first in TP_ROOMS:
        later = ts[:-2] + f"{int(ts[-2:]) + 1:02d}"
        lines += [
            refused(ts if tp == first else later, room, tp, tp) for tp in (first, *(t for t in range(4) if t != first))
        ]
    return prefill_log(tmp_path, "".join(lines))


def test_a_room_whose_senders_name_several_sessions_of_one_host_suspects_the_host(tmp_path: Path):
    found = incidents(tp_log(tmp_path))

    assert [(i["suspect_text"], i["room_count"], i["origins"], i["echoes"]) for i in found] == [
        (f"decode at {HOST} (4 sessions)", 3, 3, 9)
    ]
    assert f"its sessions on {HOST} are not alive" in found[0]["evidence"]


def test_with_the_decode_log_a_room_naming_its_sessions_suspects_the_decode_instance(tmp_path: Path):
    """Its decode ranks' log links the rooms to the decode instance: what the sessions of its host belong to. (The
    prefill's first sends to them fail: rooms it refused, `is not alive`, while each refused session's own rank
    answered in that second are the prefill's refusal, test_sglang_standing_refusal.)"""
    args = prefill_log(tmp_path, "".join(gave_up(ts, room, tp, tp) for room, ts, _ in TP_ROOMS[:1] for tp in range(4)))
    decode = tmp_path / "decode.log"
    told = "Failed to get kvcache from prefill instance, it might be dead"
    decode.write_text("".join(decode_failure(ts, room, told, tp) for room, ts, _ in TP_ROOMS[:1] for tp in range(4)))

    found = incidents([*args, "--sglang-log", str(decode)])

    assert [(i["suspect"], i["room_count"]) for i in found] == [
        ({"kind": "instance", "name": "decode-0", "role": "decode"}, 1)
    ]


def test_each_sender_names_the_session_it_gave_up_on_and_its_later_refusal_joins_the_hosts_incident(tmp_path: Path):
    """Decode TP 2 on one node, prefill TP 2: in one second each prefill rank gives up on its own peer's session and
    its send to that rank's ZeroMQ port fails. Each send is its own sender's session (both failed in that second, so
    the instance's were two to choose from): the host's incident names the two sessions, and a room prefill TP0 refuses
    on its session 5 minutes later joins it (a sender's standing refusal). It named the ZeroMQ ports, `10.6.0.44:41000,
    10.6.0.44:41001`, and the later refusal of session 10.6.0.44:15000, one rank's other name, was a second incident."""
    args = prefill_log(
        tmp_path,
        gave_up("2026-07-12 10:20:01", 6500001, 0, 0)
        + gave_up("2026-07-12 10:20:01", 6500001, 1, 1)
        + refused("2026-07-12 10:25:00", 6500002, 0, 0),
    )

    found = incidents(args)

    assert [(i["suspect_text"], i["room_count"]) for i in found] == [(f"decode at {HOST} (2 sessions)", 2)]
    assert found[0]["evidence"][0] == f"its sessions {SESSIONS[0]}, {SESSIONS[1]} failed together"
