"""Windows of a frame's long lists: what a frame from the model process carries of 100k rooms.

A frame built in another process cannot carry every room (pickling 100k rooms takes longer than the frame
may); it carries the rows around each list's scroll position (`PageRequest`), as a `Page`: `len()` is the
whole list's length, and a row outside the window raises `NotFetched` (a list drawing it shows a placeholder
and asks for a frame at its new position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

T = TypeVar("T")

MARGIN_ROWS = 200
"""Rows fetched above and below the visible ones: a page key moves within them without waiting."""


class NotFetched(LookupError):
    """The row exists in the model's list but not in this frame's window."""


@dataclass(frozen=True)
class PageRequest:
    """Rows `first` to `first + count` of a list; `first` < 0: its last `count` rows (a tail being followed)."""

    first: int
    count: int

    @classmethod
    def around(cls, top: int, height: int) -> PageRequest:
        """The visible rows from `top`, with `MARGIN_ROWS` on either side."""
        return cls(max(0, top - MARGIN_ROWS), height + 2 * MARGIN_ROWS)

    @classmethod
    def tail(cls, height: int) -> PageRequest:
        return cls(-1, height + MARGIN_ROWS)


class Page(Sequence[T]):
    """A window of a list of `total` rows: rows `first` to `first + len(rows)`."""

    __slots__ = ("first", "rows", "total")

    def __init__(self, total: int, first: int, rows: list[T]) -> None:
        self.total, self.first, self.rows = total, first, rows

    @classmethod
    def of(cls, rows: Sequence[T], request: PageRequest) -> Page[T]:
        first = max(0, len(rows) - request.count) if request.first < 0 else min(request.first, len(rows))
        return cls(len(rows), first, list(rows[first : first + request.count]))

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            raise TypeError("a Page is read row by row")
        if index < 0:
            index += self.total
        offset = index - self.first
        if 0 <= offset < len(self.rows):
            return self.rows[offset]
        if 0 <= index < self.total:
            raise NotFetched(index)
        raise IndexError(index)

    def __reduce__(self) -> tuple[type[Page[T]], tuple[int, int, list[T]]]:
        return (Page, (self.total, self.first, self.rows))


def row(rows: Sequence[T], index: int) -> T | None:
    """Row `index`, or None when `rows` is a page without it."""
    try:
        return rows[index]
    except NotFetched:
        return None


Shipped = list[int | tuple[int, T]]
"""A list as sent again: an item the other side has is its key alone, a new one comes with its key."""


class Shipper(Generic[T]):
    """Sends a list of immutable items that changes little between frames (the failure groups: the live fold
    replaces a group that changes, never edits it) as keys of what was sent before plus the new items, so
    that a frame pickles (under the model's lock) and unpickles only what changed."""

    def __init__(self) -> None:
        self._sent: dict[int, T] = {}
        """What the other side holds, by key (`id()`: the items are kept here, so no key is reused meanwhile)."""

    def pack(self, items: list[T]) -> Shipped[T]:
        sent, packed = self._sent, []
        kept: dict[int, T] = {}
        for item in items:
            key = id(item)
            packed.append(key if sent.get(key) is item else (key, item))
            kept[key] = item
        self._sent = kept
        return packed


class Receiver(Generic[T]):
    """The other side of a `Shipper`: the list again, from the keys it holds and the items that came."""

    def __init__(self) -> None:
        self._held: dict[int, T] = {}

    def unpack(self, packed: Shipped[T]) -> list[T]:
        """Raises KeyError on a key never received (the two sides out of step)."""
        held, items = self._held, []
        kept: dict[int, T] = {}
        for entry in packed:
            key, item = (entry, held[entry]) if isinstance(entry, int) else entry
            kept[key] = item
            items.append(item)
        self._held = kept
        return items
