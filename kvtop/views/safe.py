"""Text from the cluster, made safe for a terminal: names, reasons and log lines are any peer's or file's bytes.

A control character (ESC, BEL, CR, DEL, the C1 range; Unicode's bidirectional marks and overrides) in a label or
a reason would reach the operator's terminal as a command: a window title set, the screen cleared, a check's one
line split in two, the rest of a line drawn reversed. The line views show each
as its escape (`\\x1b`); the dashboard, whose styles are laid over character positions, as `?` in its place.
Newlines and tabs stay where a view prints several lines (a traceback).
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""The marks and overrides that reorder the text after them (a log's address `h\\u202eost` drawn reversed): a name
read from a peer could show as another's."""
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
_CONTROL_OR_BREAK = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")


def _escaped(match: re.Match[str]) -> str:
    return repr(match[0])[1:-1]


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab written as its escape."""
    return text if text.isprintable() else _CONTROL.sub(_escaped, text)


def one_line(text: str) -> str:
    """`text` with every control character, newlines and tabs too, written as its escape (a check's one line)."""
    return text if text.isprintable() else _CONTROL_OR_BREAK.sub(_escaped, text)


_IN_PLACE = {
    code: "?"
    for code in (
        *range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
}  # fmt: skip


def in_place(text: str) -> str:
    """`text` with every control character but newline and tab as `?`, each where it was (styles stay in place)."""
    return text if text.isprintable() else text.translate(_IN_PLACE)
