"""Every kind of event as JSON (`kvtop events --jsonl`, `kvtop dump`), nested records included."""

from __future__ import annotations

import json
import typing

from kvtop.cli.record_cmd import _fields
from kvtop.views.event_lines import to_json
from transport.plane.events import (
    AbortEvent,
    AgentHello,
    Event,
    Failure,
    Heartbeat,
    LogContext,
    LogFollowed,
    Progress,
    RoomState,
    TransferDone,
)
from transport.wire import LOG_SIDECAR, AgentInfo

T = 1_800_000_000.0
SIDECAR = AgentInfo("decode", "decode-0", 0, 2, 4096, "", "", 42, "node-1", 7, kind=LOG_SIDECAR)
FOLLOWED = LogFollowed("/var/log/d.log", True, 100, 200, 3, 0, 0, 0.5, False, metrics={"sglang:x": 1.0})
EVERY_KIND: list[Event] = [
    AgentHello(T, SIDECAR, "0.1.0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"),
    Heartbeat(T, {"rooms": 1}, 0, 0, 1.0, 1 << 20, 10.0, log=FOLLOWED),
    RoomState(T, 7, 3, 2, "prefill-0", 4096),
    Progress(T, 7, 1024, 4096),
    TransferDone(T, 7, 4096, 0.01, "prefill-0"),
    Failure(T, 7, "decode-0/TP0", "KV chunk failed its checksum", "checksum", "error", False, "decode-0/TP0", "p/TP1"),
    AbortEvent(T, 7, "sent", "prefill-0/TP0", "decode-0/TP0"),
    LogContext(T, "traceback", 7, "Traceback (most recent call last): ..."),
]


def test_every_event_kind_is_one_json_object_with_a_sidecars_log_as_an_object():
    """`events --jsonl` and `dump` encode each kind; a sidecar's heartbeat carries its log as a nested object
    (it crashed both with `LogFollowed is not JSON serializable`), a hello its identity as `info`."""
    assert {type(event) for event in EVERY_KIND} == set(typing.get_args(Event))
    lines = [json.loads(to_json("decode-0/TP0", event)) for event in EVERY_KIND]
    dumped = [json.loads(json.dumps(_fields(event), allow_nan=False)) for event in EVERY_KIND]

    heartbeat = next(line for line in lines if line["kind"] == "heartbeat")
    assert heartbeat["log"] == {**{name: getattr(FOLLOWED, name) for name in FOLLOWED.__struct_fields__}}
    assert next(line for line in dumped if line["kind"] == "hello")["info"]["kind"] == LOG_SIDECAR
    assert [line["kind"] for line in dumped] == ["hello", "heartbeat", "room", "progress", "done", "failure",
                                                 "abort", "context"]  # fmt: skip
