"""Hostile values from a real PUB socket: `kvtop events` and `--json` count them and stay valid."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from kvtop_cli import kvtop

from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, RoomState, TransferDone
from transport.wire import encode


def _strict(line: str) -> object:
    """`json.loads` that refuses NaN and Infinity, as a JSON parser of another language would."""
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in JSON: {line}"))


@pytest.fixture
def hostile_agent(zmq_context: zmq.Context[zmq.Socket[bytes]]) -> Iterator[str]:
    """A PUB that alternates a batch holding state 7 and a NaN time with a sound batch, until the test ends."""
    pub = zmq_context.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def publish() -> None:
        seq = 0
        while not stop.is_set():
            now = time.time()
            hostile: list[Event] = [RoomState(now, 1, 7, 0), TransferDone(float("nan"), 1, 10, float("inf"))]
            sound: list[Event] = [RoomState(now, 2, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))]
            for events in (hostile, sound):
                seq += 1
                pub.send(encode(EventBatch(EVENT_SCHEMA, "decode", "decode-9", 0, 77, seq, now, events)))
            stop.wait(0.05)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{port}"
    stop.set()
    thread.join()
    pub.close(linger=0)


@pytest.mark.processes
def test_hostile_events_are_counted_and_skipped_by_the_event_tail(hostile_agent):
    """`events --jsonl` prints only the sound events as strict JSON, says on stderr what it rejected, exits 0."""
    result = kvtop("events", "--connect", hostile_agent, "--level", "debug", "--jsonl", "--wait", "3")

    lines = [_strict(line) for line in result.stdout.splitlines()]
    rooms = {(line["kind"], line["room"], line["state"]) for line in lines if line["kind"] == "room"}
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert rooms == {("room", 2, int(KVPoll.Transferring))}
    assert "rejected" in result.stderr
    assert {line["kind"] for line in lines} <= {"room", "gap"}


@pytest.mark.processes
def test_hostile_events_leave_status_json_strict_with_the_rejections_counted(hostile_agent):
    """`status --json` parses as strict JSON and counts the refused records (each batch's envelope is sound: its
    records are refused one by one, not the frame); the text view names them and why too."""
    data = _strict(kvtop("status", "--connect", hostile_agent, "--json", "--wait", "3").stdout)
    text = kvtop("status", "--connect", hostile_agent, "--wait", "3")

    assert isinstance(data, dict)
    assert data["rejected_events"] > 0 and data["rejected_frames"] == 0
    assert data["collector"]["records_rejected"] == data["rejected_events"]
    assert data["ranks"]["alive"] == 1
    assert "events rejected" in text.stdout and "Traceback" not in text.stderr
    assert "record 2 of 2 (done.ts): Expected `float` >= 0.0 - at `$[1]`" in text.stdout  # NaN fails every bound


def test_a_hello_line_keeps_the_agent_label_beside_its_agent_info():
    """`events --jsonl` renders a hello with `agent` the label and the AgentInfo under `info`."""
    from kvtop.views.event_lines import to_json
    from transport.plane.events import AgentHello
    from transport.wire import AgentInfo

    info = AgentInfo("decode", "decode-0", 1, 2, 4096, "", "", 42, "host-a", 9)
    line = _strict(to_json("decode-0/TP1", AgentHello(1.0, info, "1.0", "tcp://e", "tcp://s")))

    assert isinstance(line, dict)
    assert (line["agent"], line["kind"], line["info"]["pid"], line["info"]["instance"]) == (
        "decode-0/TP1",
        "hello",
        42,
        "decode-0",
    )
