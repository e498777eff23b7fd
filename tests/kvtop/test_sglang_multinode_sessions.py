"""A decode server over two nodes (TP16, `--nnodes 2`) is one instance whose Mooncake sessions live on both nodes'
hosts: when it dies, each prefill rank names the session of its own peer, node 0's ranks sessions on one host and
node 1's on the other (a public operator's SGLang 0.5.8 logs, DeepSeek-R1 with Mooncake, github.com/devopsrustem/
slurmv4, folder `3/`: prefill TP1..TP4 named `remote mooncake session 10.82.101.249:NNNN is not alive`, TP8..TP12
`10.82.101.130:NNNN`, in one room; the decode nodes had registered the wrong IPs). kvtop named the session its first
sender named (`decode at 10.82.101.249:16598`); what broke is the decode instance, on both hosts.

The lines are in SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure

pytestmark = pytest.mark.usefixtures("utc")

NODE0, NODE1 = "10.7.0.31", "10.7.0.12"
"""The decode nodes' hosts (node 0's the higher address: the suspect lists them in node order, not sorted)."""
ROOMS = (5120001, 5120002, 5120003)
NOT_ALIVE = "Decode instance could be dead, remote mooncake session {} is not alive"


def prefill_failure(ts: str, tp: int, room: int, reason: str) -> str:
    return (
        f"[{ts} TP{tp}] Prefill transfer failed for request rank={tp} req.rid='p{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): {reason}\n"
    )


def session(tp: int) -> str:
    """The session of decode rank `tp` (TP0..TP7 on node 0, TP8..TP15 on node 1)."""
    return f"{NODE0 if tp < 8 else NODE1}:{15000 + 97 * tp}"


def server_args(ts: str, mode: str, host: str, node: int) -> str:
    return (
        f"[{ts}] server_args=ServerArgs(model_path='/models/r1', host='{host}', tp_size=16, pp_size=1, "
        f"dist_init_addr='{host.rpartition('.')[0]}.1:5000', nnodes=2, node_rank={node}, "
        f"disaggregation_mode='{mode}', disaggregation_transfer_backend='mooncake')\n"
    )


def room_lines(ts: str, room: int, ranks: range) -> str:
    """The room's failure on each of `ranks`, the highest first (as SGLang's ranks print it)."""
    return "".join(prefill_failure(ts, tp, room, NOT_ALIVE.format(session(tp))) for tp in reversed(ranks))


STAMPS = ("2026-07-11 09:00:05", "2026-07-11 09:03:05", "2026-07-11 09:06:05")
"""Three minutes apart: more than the quiet gap, and still one cause (SGLang fails every later room to a session it
gave up on at once)."""
FAILED = tuple(zip(STAMPS, ROOMS, strict=True))
"""When each room failed."""


def pasted(tmp_path: Path) -> list[str]:
    """One log as the report pasted it: TP1..TP4 and TP8..TP12 of the prefill fail each room."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "".join(room_lines(ts, room, range(8, 13)) + room_lines(ts, room, range(1, 5)) for ts, room in FAILED)
    )
    return ["--sglang-log", str(log)]


def nodes(tmp_path: Path) -> list[str]:
    """Each node's log of the prefill and of the decode server; the decode ranks record what prefill told them."""
    told = "Failed to get kvcache from prefill instance, it might be dead"
    logs = {
        "prefill-node0.log": server_args("2026-07-11 08:50:00", "prefill", "10.7.1.5", 0)
        + "".join(room_lines(ts, room, range(8)) for ts, room in FAILED),
        "prefill-node1.log": server_args("2026-07-11 08:50:00", "prefill", "10.7.1.6", 1)
        + "".join(room_lines(ts, room, range(8, 16)) for ts, room in FAILED),
        "decode-node0.log": server_args("2026-07-11 08:50:01", "decode", "10.7.2.5", 0)
        + "".join(decode_failure(ts, room, told, tp) for ts, room in FAILED for tp in range(8)),
        "decode-node1.log": server_args("2026-07-11 08:50:01", "decode", "10.7.2.6", 1)
        + "".join(decode_failure(ts, room, told, tp) for ts, room in FAILED for tp in range(8, 16)),
    }
    args = []
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
        args += ["--sglang-log", str(tmp_path / name)]
    return args


def incidents(args: list[str]) -> list[dict]:
    return json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]


def test_sessions_a_room_names_on_two_decode_hosts_make_one_suspect_with_both_hosts(tmp_path: Path):
    found = incidents(pasted(tmp_path))

    assert [(i["suspect_text"], i["kind"], i["room_count"]) for i in found] == [
        (f"decode at {NODE0}, {NODE1}", "unresponsive", 3)
    ]
    assert found[0]["suspect"] == {"kind": "instance", "name": f"{NODE0}, {NODE1}", "role": "decode"}
    assert found[0]["evidence"] == [f"its sessions on {NODE0}, {NODE1} are not alive"]
    check = kvtop_here("check", *pasted(tmp_path)).stdout.splitlines()[0]
    assert f"incident: decode at {NODE0}, {NODE1} stopped answering (peer_lost)" in check


def test_with_the_decode_nodes_logs_the_suspect_is_the_link_to_the_decode_instance(tmp_path: Path):
    """The room's decode instance (its two nodes' logs merged) is what the sessions on both hosts belong to; its ranks,
    each a refusing prefill rank's peer, logged the prefill's Failed status in that second: they answered, and what
    fails is the path to their sessions (the report's decode nodes had registered the wrong IPs), not the decode
    (test_sglang_standing_refusal)."""
    found = incidents(nodes(tmp_path))

    assert [(i["suspect"], i["room_count"], i["origins"]) for i in found] == [
        ({"kind": "link", "name": "prefill-0 - decode-0", "role": ""}, 3, 3)
    ]
    check = kvtop_here("check", *nodes(tmp_path)).stdout.splitlines()[0]
    assert "incident: the link between prefill-0 and decode-0 fails transfers (peer_lost)" in check


def test_send_failures_to_both_nodes_then_dead_sessions_are_one_incident(tmp_path: Path):
    """The first room fails sending (`Failed to send kv chunk of R to H:P`, P each rank's ZeroMQ port) to ranks on
    both hosts, the later ones on their sessions: one cause, one incident."""
    first = ROOMS[0]
    log = tmp_path / "prefill.log"
    log.write_text(
        "".join(
            prefill_failure(
                STAMPS[0],
                tp,
                first,
                f"Failed to send kv chunk of {first} to {session(tp).rpartition(':')[0]}:4{tp:04d}",
            )
            for tp in (9, 8, 2, 1)
        )
        + "".join(room_lines(ts, room, range(1, 3)) + room_lines(ts, room, range(8, 10)) for ts, room in FAILED[1:])
    )

    found = incidents(["--sglang-log", str(log)])

    assert [(i["suspect_text"], i["room_count"], i["classes"]) for i in found] == [
        (f"decode at {NODE0}, {NODE1}", 3, {"send_failed": 1, "peer_lost": 2})
    ]


def test_sessions_on_one_decode_host_name_that_host(tmp_path: Path):
    """Node 0's prefill log alone names sessions on one host: the decode side of that host (its four ranks' sessions
    failed together), not the session the room's origin named (test_sglang_host_sessions.py)."""
    log = tmp_path / "prefill.log"
    log.write_text("".join(room_lines(ts, room, range(1, 5)) for ts, room in FAILED))

    found = incidents(["--sglang-log", str(log)])

    assert [(i["suspect_text"], i["room_count"]) for i in found] == [(f"decode at {NODE0} (4 sessions)", 3)]


def test_a_suspect_named_by_many_hosts_lists_the_first_eight(tmp_path: Path):
    """Its name is bounded: a room whose senders named ten hosts counts the last two."""
    hosts = [f"10.7.3.{tp}" for tp in range(10)]
    log = tmp_path / "prefill.log"
    log.write_text(
        "".join(
            prefill_failure(ts, tp, room, NOT_ALIVE.format(f"{hosts[tp]}:15000"))
            for ts, room in FAILED
            for tp in range(10)
        )
    )

    found = incidents(["--sglang-log", str(log)])

    assert [(i["suspect_text"], i["room_count"]) for i in found] == [
        (f"decode at {', '.join(hosts[:8])} and 2 more", 3)
    ]


LATER_ROOM = 5120004
LATER = "2026-07-11 09:09:05"
"""Three minutes after the last room that named both hosts (past the quiet gap: the standing refusal carries it)."""


def one_host_later(log: Path, ranks: range = range(1, 5)) -> None:
    """A later room that only node 0's prefill ranks (`ranks`) fail: it names sessions on one decode host."""
    with log.open("a") as out:
        out.write(room_lines(LATER, LATER_ROOM, ranks))


def test_a_later_room_naming_one_host_of_the_decode_joins_its_incident(tmp_path: Path):
    """Node 0's ranks alone fail a later room, naming sessions the instance's rooms named: the same dead decode
    instance, one incident (two before: the instance's, and one of the session its first sender named)."""
    args = pasted(tmp_path)
    one_host_later(Path(args[1]))

    found = incidents(args)

    assert [(i["suspect_text"], i["room_count"], i["origins"]) for i in found] == [
        (f"decode at {NODE0}, {NODE1}", 4, 4)
    ]
    assert LATER_ROOM in found[0]["rooms"]
    assert sorted(found[0]["evidence"]) == [
        f"its sessions on {NODE0} are not alive",  # the later room's: four sessions of node 0
        f"its sessions on {NODE0}, {NODE1} are not alive",
    ]


def test_with_the_decode_nodes_logs_a_later_room_on_one_host_joins_the_link_s_incident(tmp_path: Path):
    args = nodes(tmp_path)
    one_host_later(Path(args[1]), range(8))  # prefill-node0.log: node 0's prefill ranks, peers of decode node 0

    found = incidents(args)

    assert [(i["suspect_text"], i["room_count"]) for i in found] == [("the link between prefill-0 and decode-0", 4)]


def test_a_session_the_instance_never_named_on_one_of_its_hosts_is_its_own_incident(tmp_path: Path):
    """A host may hold another decode instance: a session on it that the instance's rooms never named is not its."""
    args = pasted(tmp_path)
    other = f"{NODE0}:17001"
    with Path(args[1]).open("a") as out:
        out.write(prefill_failure(LATER, 1, LATER_ROOM, NOT_ALIVE.format(other)))

    found = incidents(args)

    assert sorted((i["suspect_text"], i["room_count"]) for i in found) == [
        (f"decode at {NODE0}, {NODE1}", 3),
        (f"decode at {other}", 1),
    ]


def test_a_fresh_send_failure_to_one_host_after_the_instance_went_quiet_is_its_own_incident(tmp_path: Path):
    """Ten minutes on (the decode restarted on its ports), a prefill rank sends to node 1's rank again and fails
    (`Session S failed.`): not the standing refusal, a new failure of that rank; the rooms that session fails after
    join that new incident, not the instance's."""
    args = pasted(tmp_path)
    node1 = session(8)
    with Path(args[1]).open("a") as out:
        out.write(f"[2026-07-11 09:16:05 TP8] Session {node1} failed.\n")
        out.write(
            prefill_failure(
                "2026-07-11 09:16:05", 8, LATER_ROOM, f"Failed to send kv chunk of {LATER_ROOM} to {NODE1}:41008"
            )
        )
        out.write(prefill_failure("2026-07-11 09:19:05", 8, LATER_ROOM + 1, NOT_ALIVE.format(node1)))

    found = incidents(args)

    assert sorted((i["suspect_text"], i["room_count"], i["classes"]) for i in found) == [
        (f"decode at {node1}", 2, {"peer_lost": 1, "send_failed": 1}),
        (f"decode at {NODE0}, {NODE1}", 3, {"peer_lost": 3}),
    ]


def test_an_earlier_room_naming_one_host_of_the_decode_joins_its_incident(tmp_path: Path):
    """Node 0's ranks alone fail a room a minute before the rooms that name both hosts: the same dead decode
    instance, whose incident takes in the one its session had started."""
    args = pasted(tmp_path)
    log = Path(args[1])
    log.write_text(room_lines("2026-07-11 08:59:05", LATER_ROOM, range(1, 5)) + log.read_text())

    found = incidents(args)

    assert [(i["suspect_text"], i["room_count"], i["origins"], i["duration_s"]) for i in found] == [
        (f"decode at {NODE0}, {NODE1}", 4, 4, 420.0)
    ]
