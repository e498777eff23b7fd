"""Dates for people: `YYYY-MM-DD HH:MM:SS` in local time, the year always of four digits.

C's `%Y` (time.strftime) writes a year before 1000 unpadded: a log line dated 0001 showed as `1-01-01`.
"""

from __future__ import annotations

import time


def local_date_time(ts: float) -> str:
    """`ts` (Unix seconds) as `YYYY-MM-DD HH:MM:SS`, local time (raises as `time.localtime` does out of range)."""
    at = time.localtime(ts)
    return f"{at.tm_year:04d}-{at.tm_mon:02d}-{at.tm_mday:02d} {at.tm_hour:02d}:{at.tm_min:02d}:{at.tm_sec:02d}"
