"""What an agent sends fits the frame every reader accepts (`wire.MAX_CONTROL_FRAME`).

A reader's socket drops a frame past its bound, and with it the connection: an oversized snapshot or batch is
lost whole, and so is every event in it. Strings are bounded where they enter (`wire.cut_text`), so one event
always fits; a batch that does not is sent in parts (publisher.py), and a snapshot whose histories do not fit
leaves out their oldest entries, counts them in `Snapshot.cut`, and moves `history_since` up to what it kept.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from transport.plane.events import Snapshot
from transport.wire import MAX_CONTROL_FRAME, encode

FRAME_BUDGET: Final = MAX_CONTROL_FRAME - (64 << 10)
"""What a batch or snapshot may take: the bound every reader checks, less room for the envelope's fields."""
_CUT_ORDER: Final = ("context", "transfers", "finished_rooms", "failures", "progress", "live_rooms")
"""What a snapshot gives up first: explanations, then the recent past, the current state last."""
_HISTORIES: Final = frozenset(("context", "transfers", "finished_rooms", "failures"))


def fit_snapshot(snapshot: Snapshot, budget: int = FRAME_BUDGET) -> tuple[bytes, int]:
    """The frame of `snapshot`, cut to `budget` bytes when it is larger, and how many entries were cut.

    Each pass drops the oldest entries of the first list in `_CUT_ORDER` that still has some, as many as its
    mean entry size says the excess takes (a few passes at most)."""
    frame = encode(snapshot)
    cut = 0
    while len(frame) > budget:
        name = next((name for name in _CUT_ORDER if getattr(snapshot, name)), None)
        if name is None:
            break  # nothing left to cut: the frame is its fixed fields and fits in practice
        entries: list[msgspec.Struct] = getattr(snapshot, name)
        mean = len(msgspec.msgpack.encode(entries)) / len(entries)
        dropped = min(len(entries), math.ceil((len(frame) - budget) / mean) + 1)
        kept = entries[dropped:]
        since = snapshot.history_since
        if name in _HISTORIES:  # oldest first: complete from the oldest kept on (or the newest cut, if none is)
            since = max(since, (kept[0] if kept else entries[-1]).ts)  # type: ignore[attr-defined]
        cut += dropped
        snapshot = msgspec.structs.replace(snapshot, **{name: kept}, history_since=since, cut=snapshot.cut + dropped)
        frame = encode(snapshot)
    return frame, cut
