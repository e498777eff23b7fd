"""Bar charts and sparklines of a timeline as plain strings, and the time axis under them (testable as strings)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EIGHTHS = "▁▂▃▄▅▆▇█"
ZERO = "·"
"""A sparkline's cell where nothing came (a blank would not read as part of the line)."""


def shares(values: Sequence[float], width: int) -> list[float]:
    """What each of `width` columns shows: the largest of the values it covers (a value over several columns
    where there are fewer values than columns)."""
    count = len(values)
    if not count or width <= 0:
        return [0.0] * max(width, 0)
    return [max(values[column * count // width : max(column * count // width + 1, (column + 1) * count // width)])
            for column in range(width)]  # fmt: skip


def bars(values: Sequence[float], width: int, height: int, peak: float) -> list[str]:
    """`height` lines (the top first) of `width` cells: a bar per column up to its share of `peak`, in eighths of a
    cell; any value above 0 shows at least an eighth (one failure is seen)."""
    levels = [math.ceil(value / peak * height * 8) if peak > 0 and value > 0 else 0 for value in shares(values, width)]
    lines = []
    for row in reversed(range(height)):
        floor = row * 8
        lines.append("".join(" " if level <= floor else EIGHTHS[min(level - floor, 8) - 1] for level in levels))
    return lines


def spark(values: Sequence[float], peak: float) -> str:
    """One line, a cell per value: its share of `peak` in eighths, `ZERO` where it is 0."""
    if peak <= 0:
        return ZERO * len(values)
    scale = 8 / peak
    return "".join(EIGHTHS[min(7, math.ceil(value * scale) - 1)] if value > 0 else ZERO for value in values)


def time_axis(width: int, span_s: float, every_s: float = 60.0) -> str:
    """Labels under a chart of `width` columns covering the last `span_s` seconds: `-5m` where each minute
    starts, `now` at the right end; a label that would touch the one before it is left out."""
    line = [" "] * width
    end = width - len("now")
    if end < 0:
        return ""
    line[end:] = "now"
    ticks = int(span_s // every_s)
    taken = -1
    for back in range(ticks, 0, -1):
        column = round((span_s - back * every_s) / span_s * width)
        label = f"-{back * every_s / 60:g}m" if every_s >= 60 else f"-{back * every_s:g}s"
        if column <= taken or column + len(label) >= end:
            continue
        line[column : column + len(label)] = label
        taken = column + len(label)
    return "".join(line)
