"""Half-bad frames: the valid records of a batch or snapshot that fails to decode as a whole.

One record outside its schema (a `TransferDone` of negative seconds from an engine's clock bug) made a subscriber
reject its whole batch, and every later snapshot that mirrored it: the rank's valid events were lost for good.
A subscriber decodes a frame whole first (the fast path); only a frame that fails comes here, where its envelope
is decoded with each record left raw, then each record on its own. Every record that decodes is kept, in order;
each one refused is named with why (`record 5 of 9 (done): Expected float >= 0.0 - at $[3]`) and keyed by a digest
of its bytes: a snapshot mirrors a bad record its batch carried, and every later snapshot holds it again, so a
subscriber counts a key once per agent incarnation. A frame whose envelope itself fails (its seq, its agent, a list
that is no list) is not salvaged: the caller rejects it whole.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, TypeVar

import msgspec

from transport.plane.events import (
    AbortEvent,
    AgentHello,
    Count,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    LogContext,
    Progress,
    RoomState,
    Snapshot,
    Timestamp,
    TransferDone,
)
from transport.wire import RankLabel, ShortText, Stage

T = TypeVar("T")

Refusal = tuple[bytes, str]
"""A record refused: (a digest of its bytes, the same wherever the record is sent again; why it was refused)."""


class _LooseBatch(msgspec.Struct, tag="batch", array_like=True, frozen=True):
    """`EventBatch` with its events left raw."""

    schema: int
    role: ShortText
    instance: RankLabel
    rank: int
    incarnation: int
    seq: int
    sent_at: Timestamp
    events: list[msgspec.Raw]
    pp: Stage | None = None
    dp: Stage | None = None


class _LooseSnapshot(msgspec.Struct, tag="snapshot", array_like=True):
    """`Snapshot` with its records left raw (its scalars checked as there)."""

    req_id: int
    schema: int
    incarnation: int
    seq: int
    hello: msgspec.Raw
    heartbeat: msgspec.Raw
    live_rooms: list[msgspec.Raw]
    finished_rooms: list[msgspec.Raw]
    failures: list[msgspec.Raw]
    progress: list[msgspec.Raw] = []
    transfers: list[msgspec.Raw] = []
    history_since: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)] = 0.0
    context: list[msgspec.Raw] = []
    sent_at: Timestamp = 0.0
    cut: Count = 0


_BATCH = msgspec.msgpack.Decoder(_LooseBatch)
_SNAPSHOT = msgspec.msgpack.Decoder(_LooseSnapshot)
_EVENT: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)
_HELLO = msgspec.msgpack.Decoder(AgentHello | None)
_HEARTBEAT = msgspec.msgpack.Decoder(Heartbeat | None)
_ROOM = msgspec.msgpack.Decoder(RoomState)
_FAILURE = msgspec.msgpack.Decoder(Failure)
_PROGRESS = msgspec.msgpack.Decoder(Progress)
_TRANSFER = msgspec.msgpack.Decoder(TransferDone)
_CONTEXT = msgspec.msgpack.Decoder(LogContext)
_ANY = msgspec.msgpack.Decoder()


def salvage_batch(body: bytes | memoryview) -> tuple[EventBatch, list[Refusal]] | None:
    """The batch in `body` (a frame less its version byte) without the events that fail their schema, and each
    one that failed; None where the envelope fails too."""
    try:
        loose = _BATCH.decode(body)
    except msgspec.DecodeError:
        return None
    refused: list[Refusal] = []
    events = _records(loose.events, _EVENT, "", refused)
    batch = EventBatch(loose.schema, loose.role, loose.instance, loose.rank, loose.incarnation, loose.seq,
                       loose.sent_at, events, loose.pp, loose.dp)  # fmt: skip
    return batch, [(key, f"batch {loose.seq}, {why}") for key, why in refused]


def salvage_snapshot(body: bytes | memoryview) -> tuple[Snapshot, list[Refusal]] | None:
    """The snapshot in `body` (a frame less its version byte) without the records that fail their schema (a bad
    hello or heartbeat becomes None), and each one that failed; None where its envelope fails too."""
    try:
        loose = _SNAPSHOT.decode(body)
    except msgspec.DecodeError:
        return None
    refused: list[Refusal] = []
    hello = _records([loose.hello], _HELLO, "hello ", refused)
    heartbeat = _records([loose.heartbeat], _HEARTBEAT, "heartbeat ", refused)
    snapshot = Snapshot(
        loose.req_id,
        loose.schema,
        loose.incarnation,
        loose.seq,
        hello[0] if hello else None,
        heartbeat[0] if heartbeat else None,
        _records(loose.live_rooms, _ROOM, "live room ", refused),
        _records(loose.finished_rooms, _ROOM, "finished room ", refused),
        _records(loose.failures, _FAILURE, "failure ", refused),
        _records(loose.progress, _PROGRESS, "progress ", refused),
        _records(loose.transfers, _TRANSFER, "transfer ", refused),
        loose.history_since,
        _records(loose.context, _CONTEXT, "context ", refused),
        loose.sent_at,
        loose.cut,
    )
    return snapshot, [(key, f"snapshot {loose.seq}, {why}") for key, why in refused]


def _records(
    raws: list[msgspec.Raw], decoder: msgspec.msgpack.Decoder[T], what: str, refused: list[Refusal]
) -> list[T]:
    """Each of `raws` that `decoder` takes, in order; each it refuses is said in `refused`."""
    kept: list[T] = []
    for index, raw in enumerate(raws, 1):
        try:
            kept.append(decoder.decode(raw))
        except msgspec.DecodeError as error:
            key = hashlib.blake2b(raw, digest_size=16).digest()
            refused.append((key, f"{what}record {index} of {len(raws)}{_named(raw, str(error))}: {error}"))
    return kept


def _named(raw: msgspec.Raw, error: str) -> str:
    """` (done.seconds)`: the record's tag and the field the error points at, as far as they are known."""
    try:
        record: Any = _ANY.decode(raw)
    except msgspec.DecodeError:
        return ""
    tag = record[0] if isinstance(record, list) and record else None
    if not isinstance(tag, str):
        return ""
    fields = _FIELDS.get(tag, ())
    at = _AT.search(error)
    index = int(at[1]) - 1 if at else -1  # element 0 is the tag
    return f" ({tag[:32]}.{fields[index]})" if 0 <= index < len(fields) else f" ({tag[:32]})"


_FIELDS = {
    str(kind.__struct_config__.tag): kind.__struct_fields__
    for kind in (AgentHello, Heartbeat, RoomState, Progress, TransferDone, Failure, AbortEvent, LogContext)
}
"""A record's field names by its tag, in the order its array holds them (after the tag)."""
_AT = re.compile(r"at `\$\[(\d+)\]")
