"""A room id of SGLang's 63 bits (past 2**53, where a float, and so JavaScript or jq before 1.7, rounds it) read
from a real server log line stays exact on every path kvtop carries it: the views' JSON, a sidecar's events, a
recording and its dump, a keyframe (what a dashboard's model process answers with)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kvtop_cli import kvtop
from sidecar_support import KVTOP, registry, sidecars

from kvtop.model.cluster import ClusterModel
from kvtop.record.keyframes import capture, restore
from kvtop.sources.sglang import load
from kvtop.tui.room_filter import room_text
from tests.conftest import wait_for

LOG = Path(__file__).parent / "fixtures" / "sglang" / "decode-gone" / "prefill.log"
ROOM = 8742514861359412280
"""`req.bootstrap_room=8742514861359412280` in LOG's lines: a float holds 8742514861359412224."""


def _rooms_in_log() -> set[int]:
    model = ClusterModel()
    load([LOG], model)
    return {failure.room for failure in model.failures}


def _json(*args: str) -> Any:
    done = kvtop(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_room_is_one_a_float_rounds_and_the_log_names_it():
    assert int(float(ROOM)) != ROOM
    assert ROOM in _rooms_in_log()


@pytest.mark.processes
def test_each_view_s_json_on_the_log_says_the_room_exactly_and_as_one_kind_of_value():
    """`failures`, `rooms`, `events --jsonl` and the incidents of `incidents`, `status` and `check`: each room as a
    JSON integer of the log's digits (an incident's were strings, so a script joining a group's room to its
    incident's found none)."""
    source = ("--sglang-log", f"prefill={LOG}")
    groups = _json("failures", "--json", *source)["groups"]
    rooms = _json("rooms", "--json", "--recent", "31622400", *source)
    events = [json.loads(line) for line in kvtop("events", "--jsonl", *source).stdout.splitlines()]
    incidents = {
        view: json.loads(done.stdout)["incidents"]
        for view, done in (
            ("incidents", kvtop("incidents", "--json", *source)),
            ("status", kvtop("status", "--json", *source)),
            ("check", kvtop("check", "--json", *source)),  # CRITICAL (exit 2): the log's incident
        )
    }
    named = [group["room"] for group in groups] + [room["room"] for room in rooms]
    named += [event["room"] for event in events if "room" in event]
    named += [room for listed in incidents.values() for incident in listed for room in incident["rooms"]]

    assert {group["room"] for group in groups} == {room["room"] for room in rooms} == _rooms_in_log()
    assert ROOM in {event.get("room") for event in events}
    assert {view: [ROOM in incident["rooms"] for incident in listed] for view, listed in incidents.items()} == {
        "incidents": [True],
        "status": [True],
        "check": [True],
    }
    assert {type(room) for room in named} == {int}


def test_a_keyframe_of_the_model_keeps_the_room_and_the_dashboard_filter_reads_its_digits():
    """What a recording seeks from and a dashboard's model process answers with: the room comes back whole."""
    model = ClusterModel()
    load([LOG], model)

    restored = restore(capture(model))

    assert ROOM in restored.finished and ROOM in {failure.room for failure in restored.failures}
    view = restored.finished[ROOM].view
    assert view is not None and room_text(view).startswith(f"{ROOM} ")


@pytest.mark.processes
def test_a_sidecar_s_events_recorded_replay_and_dump_the_room_exactly(tmp_path: Path):
    """The log followed by a sidecar, its events recorded by `kvtop record`: `failures --replay` lists the log's
    rooms and `kvtop dump` the room's failures, all as the log wrote them."""
    out = tmp_path / "rec"
    expected = _rooms_in_log()
    with registry() as address, sidecars(address, tmp_path) as started:
        started.start(LOG)
        recorder = subprocess.Popen(
            [KVTOP, "record", "--bootstrap", address, "--out", str(out), "--duration", "120"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def replayed() -> set[int]:
                done = kvtop("failures", "--replay", str(out), "--json")
                return {group["room"] for group in json.loads(done.stdout)["groups"]} if done.returncode == 0 else set()

            wait_for(lambda: replayed() == expected, timeout=60, what="the log's rooms in the recording")
        finally:
            recorder.send_signal(signal.SIGTERM)
            _, stderr = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, stderr

    dumped = [json.loads(line) for line in kvtop("dump", "--replay", str(out)).stdout.splitlines()]
    assert {event["room"] for event in dumped if event["kind"] == "failure"} == expected
