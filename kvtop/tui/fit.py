"""Lines that fit their width: the least important parts leave first, the essential ones stay."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

ESSENTIAL = 0
"""A part that never leaves (the line is cut at its width only when the essential parts alone are wider)."""


def fit(parts: Sequence[tuple[Text, int]], width: int) -> Text:
    """`parts` in their order, each (text, rank): while they are wider than `width` cells, the part of the highest
    rank leaves (the last of equals first); rank `ESSENTIAL` parts always stay. `width` 0: all of them (not laid
    out yet)."""
    kept = list(parts)
    while width and sum(text.cell_len for text, _ in kept) > width:
        optional = [index for index, (_, rank) in enumerate(kept) if rank != ESSENTIAL]
        if not optional:
            break
        del kept[max(optional, key=lambda index: (kept[index][1], index))]
    line = Text()
    for text, _ in kept:
        line.append_text(text)
    return line


def squeeze(text: str, width: int) -> str:
    """`text` in at most `width` cells, its end replaced by `…` when cut ("" for no room)."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if width > 0 else ""
