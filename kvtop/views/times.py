"""Times for people: the time of day, with the date once the times shown fall on more than one day."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvtop.model.dates import local_date_time


def spans_days(times: Sequence[float]) -> bool:
    """True when `times` fall on more than one local date (then each one is shown with its date)."""
    return bool(times) and time.localtime(min(times))[:3] != time.localtime(max(times))[:3]


def stamp(ts: float, dated: bool = False) -> str:
    """`HH:MM:SS.mmm`, or `YYYY-MM-DD HH:MM:SS.mmm` when `dated`."""
    clock = local_date_time(ts) if dated else time.strftime("%H:%M:%S", time.localtime(ts))
    return f"{clock}.{int(ts * 1000) % 1000:03d}"


def seconds(span_s: float) -> str:
    """A window's length: `60s`, `15s` (a recording's 15.03 s), past an hour `3h02m` (a log's year: `8760h00m`)."""
    if span_s < 3600:
        return f"{span_s:.0f}s" if span_s >= 10 else f"{span_s:.3g}s"
    whole = round(span_s)
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
