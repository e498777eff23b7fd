"""The event tail: each event as a log line (people) or a JSON object (scripts), with its level."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from transport.events import (
    AbortEvent,
    AgentHello,
    Event,
    Failure,
    Heartbeat,
    Progress,
    RoomState,
    TransferDone,
)
from transport.kvpoll import KVPoll

LEVELS = ("debug", "info", "warning", "error")
_KIND = {
    AgentHello: "hello",
    Heartbeat: "heartbeat",
    RoomState: "room",
    Progress: "progress",
    TransferDone: "done",
    Failure: "failure",
    AbortEvent: "abort",
}


_LEVEL_OF_KIND: dict[type, str] = {
    AgentHello: "info",
    Heartbeat: "debug",
    RoomState: "debug",
    Progress: "debug",
    TransferDone: "info",
    AbortEvent: "info",
}
_RANK = {level: rank for rank, level in enumerate(LEVELS)}


def level_of(event: Event) -> str:
    """Failures carry their own level (echoes are debug); room traffic is debug; the rest info."""
    return event.level if isinstance(event, Failure) else _LEVEL_OF_KIND[type(event)]


def shown(event: Event, min_level: str) -> bool:
    return _RANK.get(level_of(event), 0) >= _RANK[min_level]


_KIND_RANK = {kind: _RANK[level] for kind, level in _LEVEL_OF_KIND.items()}


def at_or_above(events: Sequence[Event], min_level: str) -> list[Event]:
    """`events` at or above `min_level`, newest first: `shown` without a call per event (the dashboard
    filters 50k events a second)."""
    least = _RANK[min_level]
    if least == 0:
        return list(reversed(events))
    kind_rank, ranks = _KIND_RANK, _RANK
    return [
        e for e in reversed(events) if (ranks.get(e.level, 0) if type(e) is Failure else kind_rank[type(e)]) >= least
    ]


def snapshot_events(events: Sequence[Event]) -> list[Event]:
    """What an event tail shows of a snapshot's contents: its rooms' states and its failures, oldest first."""
    return sorted((e for e in events if type(e) is RoomState or type(e) is Failure), key=lambda e: e.ts)


def to_line(agent: str, event: Event) -> str:
    """`2026-11-30 12:01:22.123 decode-0/TP1 ERROR   failure room=... text`."""
    return f"{_stamp(event.ts)} {agent:<16} {level_of(event).upper():<7} {_KIND[type(event)]:<9} {_describe(event)}"


def to_json(agent: str, event: Event) -> str:
    """One JSON object: agent (the label), level, kind and the event's own fields (a hello's AgentInfo as `info`)."""
    fields: dict[str, Any] = msgspec.structs.asdict(event)
    if isinstance(event, AgentHello):
        fields["info"] = msgspec.structs.asdict(fields.pop("agent"))
    line = {"agent": agent, "level": level_of(event), "kind": _KIND[type(event)], **fields}
    return json.dumps(line, allow_nan=False)


def gap_line(agent: str, batches: int, ts: float) -> str:
    """The line of event batches that never arrived: `... decode-0/TP1 WARNING gap 3 event batches lost`."""
    return f"{_stamp(ts)} {agent:<16} {'WARNING':<7} {'gap':<9} {batches} event batches lost"


def gap_json(agent: str, batches: int, ts: float) -> str:
    return json.dumps({"agent": agent, "level": "warning", "kind": "gap", "ts": ts, "batches": batches})


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _describe(event: Event) -> str:
    if isinstance(event, Failure):
        origin = "" if event.origin == event.rank else f" (echo of {event.origin or 'an unknown origin'})"
        return f"room={event.room} {event.reason_class}: {event.reason}{origin}"
    if isinstance(event, RoomState):
        return f"room={event.room} {KVPoll(event.previous).name} -> {KVPoll(event.state).name}"
    if isinstance(event, TransferDone):
        return f"room={event.room} {event.nbytes} B in {event.seconds * 1000:.1f} ms from {event.peer or '-'}"
    if isinstance(event, Progress):
        return f"room={event.room} {event.bytes_done}/{event.bytes_total} B"
    if isinstance(event, AbortEvent):
        return f"room={event.room} ABORT {event.direction} {event.peer} (origin {event.origin})"
    if isinstance(event, Heartbeat):
        return f"in flight {event.inflight_rooms}, cpu {event.cpu_percent:.0f}%, dropped {event.events_dropped}"
    return f"{event.agent.role} pid {event.agent.pid} on {event.agent.host}, version {event.version}"
