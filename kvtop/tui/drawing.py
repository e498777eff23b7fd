"""The dashboard on a terminal whose encoding lacks its drawing characters (a latin-1 locale, an ASCII one).

Textual draws with Unicode's box and block characters (tab underlines, borders, scroll bars) and so do the views
(sparklines, the heat map's shades, `…` where a text is cut). Written as escapes (`\\u2501`, the line views' way)
each took six cells, and no row lined up. While the dashboard runs, a character the terminal's encoding cannot
write is drawn as an ASCII stand-in as wide as it: `━` as `-`, `│` as `|`, `█` as `#`, `…` as `~`, a character of
another script as `?` (two for a wide one). What the encoding has (latin-1's `·`, `é`) is written as it is.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import sys
import unicodedata
from collections.abc import Iterator
from typing import TextIO

from rich.cells import get_character_cell_size

ERRORS = "kvtop-stand-in"
"""The codec error handler that writes stand-ins."""
_STAND_INS = {
    **dict(zip("▁▂▃▄▅▆▇█", "_-=+*%@#", strict=True)),  # a sparkline's eighths, least to most
    **dict(zip("░▒▓", ":+@", strict=True)),  # the heat map's shades
    "▔": "-", "▀": '"',  # rules along a row's top
    "…": "~", "·": ".", "—": "-", "\u2013": "-", "→": ">", "←": "<", "↑": "^", "↓": "v", "▶": ">", "▼": "v",
    "✗": "x", "✓": "v", "\u00d7": "x", "•": "*", "µ": "u", "≥": ">", "≤": "<",
}  # fmt: skip


def stand_in(char: str) -> str:
    """An ASCII stand-in for `char`, as many cells wide as it."""
    if char in _STAND_INS:
        return _STAND_INS[char]
    width = get_character_cell_size(char)
    name = unicodedata.name(char, "")
    if name.startswith("BOX DRAWINGS "):
        words = set(name.split())
        if "DIAGONAL" in words:
            return "X" if "CROSS" in words else "/" if "UPPER RIGHT TO LOWER LEFT" in name else "\\"
        across, down = words & {"HORIZONTAL", "LEFT", "RIGHT"}, words & {"VERTICAL", "UP", "DOWN"}
        return "+" if (across and down) or "ARC" in words else "-" if across else "|" if down else "x"
    if name.startswith(("LEFT ", "RIGHT ")) and "BLOCK" in name:  # ▏▌▐▕: a column's edge
        return "|"
    if "BLOCK" in name or name.startswith("QUADRANT"):
        return "#"
    decomposed = unicodedata.normalize("NFKD", char)
    base, marks = decomposed[:1], decomposed[1:]
    if width == 1 and base.isascii() and base.isprintable() and all(map(unicodedata.combining, marks)):  # é as e
        return base
    return "?" * width


def _replace(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return "".join(map(stand_in, error.object[error.start : error.end])), error.end


codecs.register_error(ERRORS, _replace)


@contextlib.contextmanager
def drawable(stream: TextIO | None = None) -> Iterator[None]:
    """While in the block, what `stream` (Textual's: the process's own stderr) cannot encode is written as
    stand-ins; its error handling is restored after."""
    stream = stream if stream is not None else sys.__stderr__
    if not isinstance(stream, io.TextIOWrapper):
        yield
        return
    before = stream.errors
    stream.reconfigure(errors=ERRORS)
    try:
        yield
    finally:
        stream.reconfigure(errors=before)
