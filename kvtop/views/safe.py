"""Text from the cluster, made safe for a terminal: names, reasons and log lines are any peer's or file's bytes.

A control character (ESC, BEL, CR, DEL, the C1 range) in a label or a reason would reach the operator's terminal
as a command: a window title set, the screen cleared, a check's one line split in two. The line views show each
as its escape (`\\x1b`); the dashboard, whose styles are laid over character positions, as `?` in its place.
Newlines and tabs stay where a view prints several lines (a traceback).
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_BREAK = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return repr(match[0])[1:-1]


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab written as its escape."""
    return text if text.isprintable() else _CONTROL.sub(_escaped, text)


def one_line(text: str) -> str:
    """`text` with every control character, newlines and tabs too, written as its escape (a check's one line)."""
    return text if text.isprintable() else _CONTROL_OR_BREAK.sub(_escaped, text)


_IN_PLACE = {code: "?" for code in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def in_place(text: str) -> str:
    """`text` with every control character but newline and tab as `?`, each where it was (styles stay in place)."""
    return text if text.isprintable() else text.translate(_IN_PLACE)
