"""The event tail: each event as a log line (people) or a JSON object (scripts), with its level.

Levels follow the fold (DESIGN.md): given the fold's leads (`LiveFold.leads`),
a failure shows at its group's shown level when it leads the group (the
origin, else the earliest echo) and at debug otherwise, so the default tail
has one line per failure group; the level the rank logged stays in the JSON
as `raw_level`. Without leads, a failure shows at the level it was logged at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kvtop.model.dates import local_date_time
from kvtop.model.suspects import BOOTSTRAP_ERROR, CRASH_KINDS
from kvtop.views.times import stamp
from transport.kvpoll import KVPoll
from transport.plane.events import (
    AbortEvent,
    AgentHello,
    Event,
    Failure,
    Heartbeat,
    LogContext,
    Progress,
    RoomState,
    TransferDone,
)

LEVELS = ("debug", "info", "warning", "error")
_KIND = {
    AgentHello: "hello",
    Heartbeat: "heartbeat",
    RoomState: "room",
    Progress: "progress",
    TransferDone: "done",
    Failure: "failure",
    AbortEvent: "abort",
    LogContext: "context",
}


_LEVEL_OF_KIND: dict[type, str] = {
    AgentHello: "info",
    Heartbeat: "debug",
    RoomState: "debug",
    Progress: "debug",
    TransferDone: "debug",  # a room that succeeded: one level down, under what an operator acts on
    AbortEvent: "debug",  # the ABORT a failure reached the room's other side by: detail of its group (4 a failure)
    LogContext: "debug",
}
_RANK = {level: rank for rank, level in enumerate(LEVELS)}


Leads = Mapping[tuple[float, int, str, str], str]
"""The fold's group leads, (ts, room, rank, reason) -> shown level (`LiveFold.leads`)."""


def raw_level(event: Event) -> str:
    """The level the rank logged a failure at; a scheduler's crash is an error, a bootstrap server not reached a
    warning; room traffic and other context lines are debug; the rest info."""
    if isinstance(event, Failure):
        return event.level
    if isinstance(event, LogContext) and event.kind in CRASH_KINDS:
        return "error"
    if isinstance(event, LogContext) and event.kind == BOOTSTRAP_ERROR:  # a failure that names no room
        return "warning"
    return _LEVEL_OF_KIND[type(event)]


def level_of(event: Event, leads: Leads | None = None) -> str:
    """The level an event shows at: with `leads`, a failure's follows the fold (debug unless it leads its
    group); otherwise the raw level."""
    if leads is not None and isinstance(event, Failure):
        return leads.get((event.ts, event.room, event.rank, event.reason), "debug")
    return raw_level(event)


def shown(event: Event, min_level: str, leads: Leads | None = None) -> bool:
    return _RANK.get(level_of(event, leads), 0) >= _RANK[min_level]


def at_or_above(events: Sequence[Event], min_level: str, leads: Leads) -> list[tuple[Event, str]]:
    """`events` at or above `min_level` with the level each shows at, newest first: `level_of` without a
    call per event (the dashboard filters 50k events a second)."""
    least, ranks, kind_level = _RANK[min_level], _RANK, _LEVEL_OF_KIND
    found: list[tuple[Event, str]] = []
    for event in reversed(events):
        if type(event) is Failure:
            level = leads.get((event.ts, event.room, event.rank, event.reason), "debug")
        elif type(event) is LogContext:  # a crash is an error, as `events` prints it
            level = raw_level(event)
        else:
            level = kind_level[type(event)]
        if ranks.get(level, 0) >= least:
            found.append((event, level))
    return found


def snapshot_events(events: Sequence[Event]) -> list[Event]:
    """What an event tail shows of a snapshot's contents: its rooms' states and its failures, oldest first."""
    return sorted((e for e in events if type(e) is RoomState or type(e) is Failure), key=lambda e: e.ts)


def to_line(agent: str, event: Event, level: str = "", dated: bool = True, narrow: bool = False) -> str:
    """`2026-11-30 12:01:22.123 decode-0/TP1 ERROR   failure room=... text` (`level`: the shown one, default
    the raw one; not `dated`: the time of day alone, for a list whose every line is of one day; `narrow`: the
    level one letter and no kind, the text saying it, `12:01:22.123 decode-0/TP1   E room=... checksum: ...`)."""
    level = level or raw_level(event)
    when = _stamp(event.ts) if dated else stamp(event.ts)
    if narrow:
        return f"{when} {agent:<14} {level[:1].upper()} {_describe(event)}"
    return f"{when} {agent:<16} {level.upper():<7} {_KIND[type(event)]:<9} {_describe(event)}"


def to_json(agent: str, event: Event, level: str = "") -> str:
    """One JSON object: agent (the label), level (shown), raw_level (as logged), kind and the event's own fields
    (`event_fields`)."""
    fields = event_fields(event)
    fields.pop("level", None)
    raw = raw_level(event)
    line = {"agent": agent, "level": level or raw, "raw_level": raw, "kind": _KIND[type(event)], **fields}
    return json.dumps(line, allow_nan=False)


def event_fields(event: Event) -> dict[str, Any]:
    """An event's fields by name, nested records as objects too (a heartbeat's `log`), a hello's AgentInfo as
    `info`, a context line's own kind as `context_kind` (`kind` is the event's): what `json.dumps` takes for
    every kind of event."""
    fields: dict[str, Any] = _plain(event)
    if isinstance(event, AgentHello):
        fields["info"] = fields.pop("agent")
    elif isinstance(event, LogContext):
        fields["context_kind"] = fields.pop("kind")
    return fields


def _plain(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return {name: _plain(item) for name, item in msgspec.structs.asdict(value).items()}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def gap_line(agent: str, batches: int, ts: float) -> str:
    """The line of event batches that never arrived: `... decode-0/TP1 WARNING gap 3 event batches lost`."""
    return f"{_stamp(ts)} {agent:<16} {'WARNING':<7} {'gap':<9} {batches} event batches lost"


def gap_json(agent: str, batches: int, ts: float) -> str:
    return json.dumps({"agent": agent, "level": "warning", "kind": "gap", "ts": ts, "batches": batches})


def _stamp(ts: float) -> str:
    return local_date_time(ts) + f".{int(ts * 1000) % 1000:03d}"


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
    if isinstance(event, LogContext):
        return f"{event.kind}{f' room={event.room}' if event.room is not None else ''}: {event.text[:300]}"
    if isinstance(event, Heartbeat):
        return f"in flight {event.inflight_rooms}, cpu {event.cpu_percent:.0f}%, dropped {event.events_dropped}"
    return f"{event.agent.role} pid {event.agent.pid} on {event.agent.host}, version {event.version}"
