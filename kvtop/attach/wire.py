"""The frames of the model's local socket, written down once (a ZeroMQ ROUTER in the model process, a DEALER
in the view that asks).

    ask      [VERSION, msgpack(StateQuery)]                    at most MAX_ASK_BYTES
    answer   [VERSION, msgpack(State), keyframe, journal]      keyframe: a zstd frame of a keyframe record
                                                               (kvtop.record.keyframes, as a recording
                                                               holds it); journal: a zstd frame of
                                                               msgpack(Journal), or b"" when not asked
    refusal  [VERSION, msgpack(Refused)]                       the ask could not be read (why, and what
                                                               this side has refused so far)

Nothing here is pickled: both sides decode with msgspec, which checks every field's type and bounds as it
decodes (a keyframe is checked by `restore` the same way), and each frame's size is bounded before it is
decompressed or decoded. A view and a model process of other versions refuse each other's `VERSION`.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from transport.plane.events import Event

VERSION: Final = b"kvtop-model/1"
MAX_ASK_BYTES: Final = 4096
"""An ask is a few dozen bytes; the socket itself drops a peer past `MAX_SOCKET_BYTES`."""
MAX_SOCKET_BYTES: Final = 1 << 20
MAX_STATE_BYTES: Final = 1 << 20
MAX_FRAME_BYTES: Final = 256 << 20
"""A keyframe or a journal, compressed and raw (as a recording's block: `MAX_BLOCK_BYTES`)."""
MAX_JOURNAL_EVENTS: Final = 200_000
"""At most this many journaled events in one answer (the dashboard's journal keeps as many)."""

_Text = Annotated[str, msgspec.Meta(max_length=4096)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
_Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]
"""An epoch time or a duration: finite (NaN fails every bound)."""


class StateQuery(msgspec.Struct, tag="state", forbid_unknown_fields=True):
    """Ask for the model's state; `journal_after`: also the journal's deliveries numbered past it (the
    model's `journal_total` when they were journaled), -1 for none."""

    journal_after: Annotated[int, msgspec.Meta(ge=-1, le=1 << 62)] = -1


class State(msgspec.Struct, tag="state"):
    """What the model process says beside the keyframe: who it is and what its source has heard."""

    pid: _Count
    source: _Text
    """The source it collects from, as `kvtop top` was given it (`bootstrap tcp://...`)."""
    captured_at: _Seconds
    """The instant the keyframe holds (its source's clock): views judge at it."""
    listening_s: _Seconds
    """How long the source has been listening (a rank that never answered in that time is gone)."""
    heard: bool
    """Some agent answered (silence is a finding, as a collector's `heard()`)."""
    synced: bool
    """Every agent's snapshot is in (else the view asks again until its wait ends)."""
    error: _Text
    """The source's last error ("" while it answers)."""
    raw_len: Annotated[int, msgspec.Meta(ge=0, le=MAX_FRAME_BYTES)]
    """The keyframe's length before compression."""
    journaling: bool
    journal_total: _Count
    journal_raw_len: Annotated[int, msgspec.Meta(ge=0, le=MAX_FRAME_BYTES)] = 0
    answered: _Count = 0
    """Asks answered so far, this one included."""
    refused: dict[Annotated[str, msgspec.Meta(max_length=64)], _Count] = {}
    """Asks refused so far, by reason."""
    lock_held_s: _Seconds = 0.0
    """How long this answer held the model's lock (the fork, the journal's copy): what it cost the dashboard."""


class Journal(msgspec.Struct, array_like=True):
    """Journaled deliveries as (agent label, events), oldest first, and the number of the last one."""

    deliveries: list[tuple[_Text, list[Event]]]
    total: _Count


class Refused(msgspec.Struct, tag="refused"):
    reason: _Text
    refused: dict[Annotated[str, msgspec.Meta(max_length=64)], _Count] = {}


ASK_DECODER: Final = msgspec.msgpack.Decoder(StateQuery)
ANSWER_DECODER: Final = msgspec.msgpack.Decoder(State | Refused)
JOURNAL_DECODER: Final = msgspec.msgpack.Decoder(Journal)
ENCODER: Final = msgspec.msgpack.Encoder()
