"""Failure groups for people (a table) and for scripts (JSON); no terminal library needed."""

from __future__ import annotations

from typing import Any

from kvtop.fold import FailureGroup, Observed

_REASON_WIDTH = 90


def _record(failure: Observed) -> dict[str, Any]:
    return {
        "rank": failure.rank,
        "role": failure.role,
        "instance": failure.instance,
        "reason": failure.reason,
        "reason_class": failure.reason_class,
        "ts": failure.ts,
        "level": failure.level,
    }


def to_json(groups: list[FailureGroup]) -> list[dict[str, Any]]:
    """The stable JSON of `kvtop failures --json` (README documents the fields)."""
    return [
        {
            "room": group.room,
            "origin": _record(group.origin) if group.origin else None,
            "origin_label": group.origin_label,
            "echo_count": group.echo_count,
            "echoes": [{**_record(echo), "origin": echo.origin} for echo in group.echoes],
        }
        for group in groups
    ]


def render_groups(groups: list[FailureGroup], debug: bool) -> str:
    """One line per origin (with its echo count); with `debug`, each echo indented below it."""
    lines = [f"{'ROOM':<20} {'ORIGIN':<16} {'CLASS':<18} {'ECHOES':>6}  REASON"]
    for group in groups:
        origin = group.origin
        label = group.origin_label or "origin unknown"
        reason = origin.reason if origin else "(the origin's own event was not seen)"
        reason_class = origin.reason_class if origin else "-"
        lines.append(f"{group.room:<20} {label:<16} {reason_class:<18} {group.echo_count:>6}  {reason[:_REASON_WIDTH]}")
        if debug:
            lines.extend(
                f"{'':<20}   echo {echo.rank:<16} {echo.reason_class:<13} {echo.reason[:_REASON_WIDTH]}"
                for echo in group.echoes
            )
    return "\n".join(lines)
