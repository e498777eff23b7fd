"""Byte sizes on the command line: `65536`, `64KiB`, `1MiB`, `4M`."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, minimum: int = 1) -> int:
    """Bytes in `text`, at least `minimum`; raises ValueError naming the accepted forms (or the minimum)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (examples: 65536, 64KiB, 1MiB, 4M)")
    value = int(match.group(1)) * _UNITS[unit]
    if value < minimum:
        raise ValueError(f"{text!r} must be positive" if minimum == 1 else f"{text!r} is below {format_size(minimum)}")
    return value


def format_size(nbytes: int) -> str:
    """The shortest exact binary form: 64KiB, 1MiB, 1000B."""
    for suffix, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return f"{nbytes}B"
