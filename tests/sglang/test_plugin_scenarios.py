"""kvtop through its SGLang plugin, against SGLang 0.5.23's own Mooncake KV transfer code (make test-sglang).

Each scenario runs prefill TP2 and decode TP2 as real SGLang KV managers in processes, the plugin loaded by
SGLang's own `load_plugins()`, and asserts that kvtop's views say what SGLang's own exceptions said (collected by
the ranks themselves, without kvtop).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cluster import pair
from kvtop_watch import KVTOP, events, registry, view
from rank import LAYERS, ROOM_PAGES, page_bytes

SUCCESS, FAILED = 4, 0
ANOTHER_RANK = "Failed due to an unknown reason from another rank"
STAY = {"linger_s": 40.0}


def test_happy_path_rooms_succeed_on_all_four_ranks(tmp_path: Path) -> None:
    rooms = [1001, 1002]
    with registry() as bootstrap, pair(tmp_path, rooms, {"KVTOP_BOOTSTRAP": bootstrap}, STAY, STAY) as ranks:
        ranks.wait("done")
        for rank in ranks.ranks:
            assert {room: report.poll for room, report in rank.rooms().items()} == dict.fromkeys(rooms, SUCCESS)
        assert all(report.pages_equal for rank in ranks.of("decode") for report in rank.rooms().values())
        listed = view(bootstrap, "ranks")
        assert {entry["source"] for entry in listed} == {"sglang"}
        assert sorted(entry["label"].split("/")[1] + entry["role"] for entry in listed) == sorted(
            f"TP{tp}{role}" for role in ("prefill", "decode") for tp in (0, 1)
        )
        told = events(bootstrap)
        succeeded = {(event["agent"], event["room"]) for event in told
                     if event.get("kind") == "room" and event.get("state") == SUCCESS}  # fmt: skip
        room_bytes = ROOM_PAGES * 2 * LAYERS * page_bytes()  # a decode rank's share: its pages of every K and V
        prefill = f"127.0.0.1:{ranks.ranks[0].spec.bootstrap_port}"  # a decode rank's peer: its bootstrap address
        links = view(bootstrap, "status")["links"]
        assert [(link["prefill"], link["transfers"], link["bytes"]) for link in links] == [
            (prefill, 2 * len(rooms), 2 * len(rooms) * room_bytes)
        ], links
        assert len({agent for agent, _ in succeeded}) == 4, succeeded
        assert {room for _, room in succeeded} == set(rooms)
        assert view(bootstrap, "failures")["groups"] == []


def test_a_decode_rank_exits_mid_room(tmp_path: Path) -> None:
    """Decode TP1 is killed after its metadata reached prefill and before prefill sends: the prefill rank whose send
    failed is the origin, the other prefill rank (its own send fine) fails through the MIN reduce, an echo."""
    rooms = [2001]
    release = tmp_path / "release"
    with registry() as bootstrap:
        env = {"KVTOP_BOOTSTRAP": bootstrap}
        with pair(tmp_path, rooms, env, {"release": str(release), **STAY}, STAY) as ranks:
            ranks.wait("waiting", ranks.of("prefill"))
            dying = ranks.of("decode")[1]
            dying.process.kill()
            dying.process.wait()
            release.touch()
            ranks.wait("done", ranks.of("prefill"))
            said = {rank.spec.tp_rank: rank.rooms()[2001] for rank in ranks.of("prefill")}
            origins = [tp for tp, report in said.items() if not report.is_from_another_rank]
            echoes = [tp for tp, report in said.items() if report.is_from_another_rank]
            assert len(origins) == 1 and len(echoes) == 1, said
            assert said[origins[0]].reason.startswith("Failed to send kv chunk of 2001")
            assert said[echoes[0]].reason == ANOTHER_RANK
            groups = [group for group in view(bootstrap, "failures")["groups"] if group["room"] == "2001"
                      or group["room"] == 2001]  # fmt: skip
            assert len(groups) == 1, json.dumps(groups, indent=1)
            group = groups[0]
            assert group["origin"]["rank"].endswith(f"/TP{origins[0]}")
            assert group["origin"]["reason"] == said[origins[0]].reason
            assert group["origin"]["reason_class"] == "send_failed"
            echoed = [echo for echo in group["echoes"] if echo["role"] == "prefill"]
            assert [echo["rank"].split("/")[1] for echo in echoed] == [f"TP{echoes[0]}"]
            assert echoed[0]["reason"] == ANOTHER_RANK


def test_a_prefill_instance_killed(tmp_path: Path) -> None:
    rooms = [3001, 3002]
    with registry() as bootstrap:
        env = {"KVTOP_BOOTSTRAP": bootstrap, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
               "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2"}  # fmt: skip
        with pair(tmp_path, rooms, env, {"hold": True}, STAY) as ranks:
            ranks.wait("metadata", ranks.of("decode"))
            for rank in ranks.of("prefill"):
                rank.process.kill()
            ranks.wait("done", ranks.of("decode"))
            address = f"127.0.0.1:{ranks.ranks[0].spec.bootstrap_port}"
            lost = f"Lost connection with prefill instance (bootstrap_addr: {address})"
            said = [(room, report) for rank in ranks.of("decode") for room, report in rank.rooms().items()]
            # A decode rank whose own heartbeat check had not yet fired fails the room through the MIN reduce of
            # a rank whose had: an echo (seen on a loaded machine); every room has at least one origin.
            for _, report in said:
                assert report.reason == ANOTHER_RANK if report.is_from_another_rank else report.reason.startswith(lost)
            assert {room for room, report in said if not report.is_from_another_rank} == set(rooms), said
            incidents = view(bootstrap, "incidents")["incidents"]
            assert len(incidents) == 1, json.dumps(incidents, indent=1)
            assert incidents[0]["suspect"]["name"] == address
            assert incidents[0]["suspect"]["role"] == "prefill"
            assert sorted(incidents[0]["rooms"]) == sorted(rooms)


def test_bootstrapping_timeout(tmp_path: Path) -> None:
    with registry() as bootstrap:
        env = {"KVTOP_BOOTSTRAP": bootstrap, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2"}
        with pair(tmp_path, [4001], env, STAY, start_decode=False) as ranks:
            ranks.wait("done")
            said = {rank.spec.tp_rank: rank.rooms()[4001] for rank in ranks.ranks}
            assert any("in KVPoll.Bootstrapping" in report.reason for report in said.values()), said
            classes = {(group["origin"] or {}).get("reason_class") for group in view(bootstrap, "failures")["groups"]}
            assert classes == {"timeout_bootstrap"}


def test_waiting_for_input_timeout(tmp_path: Path) -> None:
    with registry() as bootstrap:
        env = {"KVTOP_BOOTSTRAP": bootstrap, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2"}
        with pair(tmp_path, [5001], env, {"hold": True, "deadline_s": 15.0, **STAY}, STAY) as ranks:
            ranks.wait("done", ranks.of("decode"))
            said = [rank.rooms()[5001] for rank in ranks.of("decode")]
            assert any("in KVPoll.WaitingForInput" in report.reason for report in said), said
            groups = view(bootstrap, "failures")["groups"]
            decode_origins = [g["origin"] for g in groups if g["origin"] and g["origin"]["role"] == "decode"]
            assert decode_origins and all(o["reason_class"] == "timeout_waiting" for o in decode_origins), groups


def test_without_the_plugin_kvtop_sees_nothing(tmp_path: Path) -> None:
    off = {"plugin": False, **STAY}
    with registry() as bootstrap, pair(tmp_path, [6001], {"KVTOP_BOOTSTRAP": bootstrap}, off, off) as ranks:
        ranks.wait("done")
        assert all(report.poll == SUCCESS for rank in ranks.ranks for report in rank.rooms().values())
        assert view(bootstrap, "ranks") is None  # kvtop answered that nobody is there


def test_the_plugin_bench_times_real_hooked_calls_and_its_failures_reach_kvtop() -> None:
    """`kvtop bench sglang-plugin` on SGLang's real sender: both legs timed, and every hooked failure collected
    (the bench fails itself when the plugin did not hook or the failures did not arrive)."""
    command = [KVTOP, "bench", "sglang-plugin", "--json", "--calls", "1000", "--repeats", "3", "--failed-rooms", "20"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cost = json.loads(done.stdout)
    assert cost["sglang_version"] == "0.5.23"
    assert cost["failures_collected"] == 3 * 20
    assert cost["poll_plain_us"] > 0 and cost["poll_hooked_us"] > 0
