"""A benchmark's result as text, printed from its data (the JSON's names and values).

First the setting measured, then each figure against its baseline of the same run with the figure relating
them (a ratio, or a cost) and each target's verdict, then every other figure: `name: value unit`. Units come
from the names (`_gbps` GB/s, `_ms` ms, `_per_s` /s, `_mib` MiB, ...); `cost` and `share` are fractions,
printed as percentages. A figure that is None (a leg not asked for) is left out; nested records print with
dotted names, or side by side in one table when `Report.table` names them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_UNITS = (
    (r"ratio|(^|_)vs(_|$)", ""),
    (r"gbps", "GB/s"),
    (r"(^|_)s_per_gb", "s/GB"),
    (r"(^|_)s_per_million", "s/M events"),
    (r"bytes_per_million", "bytes/M events"),
    (r"per_collector_cpu_s", "/CPU s"),
    (r"(^|_)per_s(_|$)", "/s"),
    (r"(^|_)ms(_|$)", "ms"),
    (r"(^|_)us(_|$)", "us"),
    (r"(^|_)(s|seconds)(_|$)", "s"),
    (r"(^|_)hours$", "h"),
    (r"(^|_)(mib|mb)(_|$)", "MiB"),
    (r"(^|_)bytes(_|$)", "bytes"),
    (r"percent", "%"),
    (r"cores", "cores"),
)
_FRACTION = r"(^|_)(cost|share)$"


@dataclass(frozen=True)
class Compare:
    """`measured` against `baseline` (measured in the same run) and `ratio`, the figure relating them."""

    measured: str
    baseline: str
    ratio: str


@dataclass(frozen=True)
class Target:
    """A figure's target (DESIGN.md): at most, or at least, `bound`."""

    figure: str
    bound: float
    at_most: bool

    def verdict(self, value: object) -> str:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return ""
        met = value <= self.bound if self.at_most else value >= self.bound
        sign = "<=" if self.at_most else ">="
        return f" (target {sign} {_value(self.figure, self.bound)}: {'met' if met else 'MISSED'})"


def at_most(figure: str, bound: float) -> Target:
    return Target(figure, bound, at_most=True)


def at_least(figure: str, bound: float) -> Target:
    return Target(figure, bound, at_most=False)


@dataclass(frozen=True)
class Report:
    """How a result reads: names of its figures (dotted for nested ones) in the roles they play."""

    setting: tuple[str, ...] = ()
    """What was measured (sizes, counts): printed first."""
    compare: tuple[Compare, ...] = ()
    targets: tuple[Target, ...] = ()
    table: tuple[str, ...] = ()
    """Records of the same fields (a benchmark's legs), printed as one table: a row per field, a column each."""


def text(data: Mapping[str, object], report: Report) -> str:
    """`data` (a result's `as_dict()`) as lines for people, read as `report` says."""
    figures = dict(_flatten(data))
    targets = {target.figure: target for target in report.targets}
    shown: set[str] = set()

    def figure(name: str) -> str:
        shown.add(name)
        verdict = targets[name].verdict(figures[name]) if name in targets else ""
        return f"{_value(name, figures[name])}{verdict}"

    lines = [f"{name}: {figure(name)}" for name in report.setting if name in figures]
    for c in report.compare:
        if {c.measured, c.baseline, c.ratio} <= figures.keys():
            lines.append(
                f"{c.measured}: {figure(c.measured)} vs {c.baseline} {figure(c.baseline)}: {c.ratio} {figure(c.ratio)}"
            )
    lines += [f"{name}: {figure(name)}" for name in targets if name in figures and name not in shown]
    tabled = tuple(f"{name}." for name in report.table)
    lines += [
        f"{name}: {_value(name, v)}" for name, v in figures.items() if not name.startswith(tabled) and name not in shown
    ]
    columns = {name: record for name in report.table if isinstance(record := data.get(name), Mapping)}
    lines += _table(columns) if columns else []
    return "\n".join(lines)


def unit(name: str) -> str:
    """The unit a figure's name says (dots count as underscores: `runs_gbps.raw` is in GB/s); none for ratios
    and fractions (`cost`, `share`: printed as percentages)."""
    flat = name.replace(".", "_")
    return next((unit for pattern, unit in _UNITS if re.search(pattern, flat)), "")


def _flatten(data: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            yield from _flatten(value, prefix=f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _value(name: str, value: object) -> str:
    """`value` with the unit its name says."""
    if isinstance(value, list | tuple):
        numbers = ", ".join(_number(name, item) for item in value)
    else:
        numbers = _number(name, value)
    suffix = unit(name)
    return numbers + (suffix if suffix.startswith("/") or not suffix else f" {suffix}")


def _number(name: str, value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if re.search(_FRACTION, name.replace(".", "_")):
            return f"{value:.2%}"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _table(columns: Mapping[str, Mapping[str, object]]) -> list[str]:
    """Records side by side: a row per field with its unit, a column per record."""
    fields = dict.fromkeys(field for record in columns.values() for field in record)
    rows = [["", *columns, ""]]
    rows += [[field, *(_number(field, rec.get(field)) for rec in columns.values()), unit(field)] for field in fields]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [" ".join(_aligned(row, widths)).rstrip() for row in rows]


def _aligned(row: list[str], widths: list[int]) -> list[str]:
    """The row's name to the left, its numbers to the right, its unit as it is."""
    numbers = (cell.rjust(width) for cell, width in zip(row[1:-1], widths[1:-1], strict=True))
    return [row[0].ljust(widths[0]), *numbers, row[-1]]
