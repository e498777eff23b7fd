"""Times on the command line (`--at`, `--since`, `--until`) and the window of a recording or a log they pick.

Accepted: ISO 8601 (`2026-12-01T03:00:00`, `2026-12-01 03:00`, with `Z` or an offset; without one, local
time), a time of day today (`03:00`, `03:00:15`), seconds since the epoch (`1780000000.5`), `now`, and
`N UNIT ago` (`5 minutes ago`, `90s ago`, `2 h ago`; units s, m, h, d and their English names).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass

_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600, "d": 86400}
_UNITS["day"] = 86400
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s+ago\s*$", re.IGNORECASE)
_CLOCK = re.compile(r"^\s*\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


_LATEST = 253_402_300_799.0
"""9999-12-31 23:59:59 UTC: a time past it names no instant the platform's clock can show."""
_LONGEST = 100 * 366 * 86_400.0
"""A century: a duration past it is a typo, not a retention."""


def parse_time(text: str, now: float | None = None) -> float:
    """Seconds since the epoch that `text` names; raises ValueError naming the accepted forms."""
    ts = _parse_time(text, time.time() if now is None else now)
    if not 0.0 <= ts <= _LATEST:
        raise ValueError(f"{text!r} is not a time between 1970 and 9999")
    return ts


def _parse_time(text: str, now: float) -> float:
    value = text.strip()
    if value.lower() == "now":
        return now
    ago = _AGO.match(value)
    if ago and ago.group(2).lower() in _UNITS:
        return now - float(ago.group(1)) * _UNITS[ago.group(2).lower()]
    if re.fullmatch(r"\d{9,}(\.\d+)?", value):
        return float(value)
    try:
        if _CLOCK.match(value):
            today = dt.datetime.fromtimestamp(now).date().isoformat()
            return dt.datetime.fromisoformat(f"{today}T{value}").timestamp()
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):  # a date past what the platform's clock can show
        pass
    raise ValueError(f"{text!r} is not a time (examples: 2026-12-01T03:00:00, 03:00, '5 minutes ago', 1780000000, now)")


def on_their_day(option: str, ts: float, start: float, end: float) -> str:
    """` (a time of day is today's: --at 2026-03-05T09:00:20 is within them)` where `ts`'s time of day on the first
    or last day of [start, end] falls within it: what a time of day typed for logs or a recording of another day
    meant; '' where no such instant is in the span."""
    clock = dt.datetime.fromtimestamp(ts).time()
    for edge in (start, end):
        moved = dt.datetime.combine(dt.datetime.fromtimestamp(edge).date(), clock)
        if moved.timestamp() != ts and start <= moved.timestamp() <= end:
            shown = moved.isoformat(timespec="milliseconds" if moved.microsecond else "seconds")
            return f" (a time of day is today's: {option} {shown} is within them)"
    return ""


def parse_duration(text: str) -> float:
    """Seconds in `24h`, `90m`, `3600`, `2 days`; raises ValueError."""
    match = _DURATION.match(text)
    unit = match.group(2).lower().removesuffix("s") if match else ""
    factor = 1 if unit == "" else _UNITS.get(unit)
    if not match or factor is None or not 0 < float(match.group(1)) * factor <= _LONGEST:
        raise ValueError(f"{text!r} is not a duration of at most a century (examples: 24h, 90m, 3600, 2d)")
    return float(match.group(1)) * factor


@dataclass(frozen=True)
class When:
    """The instant and window a view reads: `at` (or `until`) is "now" for it; `since` starts its window."""

    at: float | None = None
    since: float | None = None

    def window(self, default_s: float, now: float) -> float:
        """The view's window: from `since` to now when given (at least 1 s), else the view's own."""
        return max(1.0, now - self.since) if self.since is not None else default_s


def pick(at: str, since: str, until: str) -> When:
    """`--at`, `--since` and `--until` checked together (`--at` and `--until` are one thing: give one)."""
    if at and until:
        raise ValueError("give --at or --until, not both (both name the instant the views read)")
    option = "--at" if at else "--until"
    instant = _option_time(option, at or until) if (at or until) else None
    start = _option_time("--since", since) if since else None
    if start is not None and instant is not None and start > instant:
        raise ValueError(f"--since is after {option} (--since {since}, {option} {at or until})")
    return When(instant, start)


def _option_time(option: str, text: str) -> float:
    """`parse_time(text)`, its error naming the option that gave the text."""
    try:
        return parse_time(text)
    except ValueError as error:
        raise ValueError(f"{option}: {error}") from None
