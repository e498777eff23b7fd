"""Lines that fit their width: the least important parts leave first, the essential ones stay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text

ESSENTIAL = 0
"""A part that never leaves (the line is cut at its width only when the essential parts alone are wider)."""


def fit(parts: Sequence[tuple[Text, int]], width: int, shorter: Mapping[int, Text] | None = None) -> Text:
    """`parts` in their order, each (text, rank): while they are wider than `width` cells, the part of the highest
    rank leaves (the last of equals first), or takes its shorter form first where `shorter` has one (by its
    index in `parts`: `2.4% failed in 60 s` for `2.4% failed in 60 s (29 origins)`); rank `ESSENTIAL` parts always
    stay. `width` 0: all of them (not laid out yet)."""
    kept = list(enumerate(parts))
    alternatives = dict(shorter or {})
    while width and sum(text.cell_len for _, (text, _) in kept) > width:
        optional = [place for place, (_, (_, rank)) in enumerate(kept) if rank != ESSENTIAL]
        if not optional:
            break
        place = max(optional, key=lambda at: (kept[at][1][1], at))
        index, (_, rank) = kept[place]
        if index in alternatives:
            kept[place] = (index, (alternatives.pop(index), rank))
        else:
            del kept[place]
    line = Text()
    for _, (text, _) in kept:
        line.append_text(text)
    return line


def squeeze(text: str, width: int) -> str:
    """`text` in at most `width` cells, its end replaced by `…` when cut ("" for no room)."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if width > 0 else ""
