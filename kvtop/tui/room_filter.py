"""The rooms filter: each room's text is kept until the room changes, so a filtered frame costs the matching.

A room's text (id, ranks and their states, link) is built from its `codes` dict and its `link`; the model
replaces a room's codes dict on every change, never changes it in place, so a kept text whose dict is the
room's own (`is`) and whose link equals the room's is current. Whether a room is stuck or failed moves with
the clock and with ranks going away, so those words are judged at each frame, and only for a filter that
could touch them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtop.model.shapes import RoomView
from transport.kvpoll import KVPoll

STUCK, FAILED = " stuck", " failed"
"""The words a room's text ends with when it is stuck or failed (judged at each frame, never kept)."""
PRUNE_SLACK = 4096
"""The texts of rooms gone are dropped once the kept ones outnumber twice a frame's rooms by this many."""

_STATE_NAMES = {int(state): state.name for state in KVPoll}
"""A KVPoll code's name without building the enum member (a filter names the states of 100k rooms' ranks)."""


def room_text(room: RoomView) -> str:
    """What a filter matches a room against, its stuck/failed word apart: id, ranks and states, link."""
    states = " ".join(f"{label} {_STATE_NAMES[code]}" for label, code in room.codes.items())
    return f"{room.room} {states} {room.link[0]} {room.link[1]}".lower()


def flag_words(needle: str) -> tuple[str, ...]:
    """The stuck/failed words `needle` can match a room's text with: those it lies inside, or whose start it
    ends with (the match then begins in the text before the word)."""
    return tuple(
        word
        for word in (STUCK, FAILED)
        if needle in word or any(word.startswith(needle[cut:]) for cut in range(1, len(needle)))
    )


class RoomTexts:
    """The filter's text of each room, by room id, with the codes dict and link it was built from."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[dict[str, int], tuple[str, str], str]] = {}
        self.built = 0
        """Texts built so far (a kept one reused is not counted)."""

    def __len__(self) -> int:
        return len(self._texts)

    def matching(
        self,
        rooms: Sequence[RoomView],
        needle: str,
        flag: Callable[[RoomView, tuple[str, ...]], str],
        also: set[int],
    ) -> list[RoomView]:
        """The rooms whose text holds `needle` (lower case), and those whose id is in `also` (a failure's reason
        holds it). `flag(room, words)` is the room's word among `words` (STUCK, FAILED), or "": asked only of
        rooms the needle could match by that word."""
        texts = self._texts
        words = flag_words(needle)
        before = len(needle) - 1
        """Characters of the text before the word that a match ending in the word can start in."""
        kept: list[RoomView] = []
        for room in rooms:
            entry = texts.get(room.room)
            if entry is not None and entry[0] is room.codes and entry[1] == room.link:
                text = entry[2]
            else:
                text = room_text(room)
                texts[room.room] = (room.codes, room.link, text)
                self.built += 1
            if (
                needle in text
                or room.room in also
                or (words and (word := flag(room, words)) and needle in text[len(text) - before :] + word)
            ):
                kept.append(room)
        if len(texts) > 2 * len(rooms) + PRUNE_SLACK:
            self._prune(rooms)
        return kept

    def clear(self) -> None:
        self._texts = {}

    def _prune(self, rooms: Sequence[RoomView]) -> None:
        """Keep only the texts of `rooms` (rooms retired long ago no longer come)."""
        texts = self._texts
        self._texts = {room.room: texts[room.room] for room in rooms if room.room in texts}
