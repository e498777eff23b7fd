"""Windows of a frame's long lists: what a frame from the model process carries of 100k rooms.

A frame built in another process cannot carry every room (pickling 100k rooms takes longer than the frame
may); it carries the rows around each list's scroll position (`PageRequest`), as a `Page`: `len()` is the
whole list's length, and a row outside the window raises `NotFetched` (a list drawing it shows a placeholder
and asks for a frame at its new position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

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
