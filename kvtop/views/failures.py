"""Failure groups for people (a table) and for scripts (JSON); no terminal library needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvtop.model.fold import FailureGroup, Observed, shown_level
from kvtop.model.suspects import carrying_echo
from kvtop.views.times import spans_days, stamp
from transport.wire import rank_label

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.sglang import Context

_REASON_WIDTH = 90
_CAUSES_SHOWN = 2
_RANKS_WIDTH = 16
_RANKS_WIDTH_MAX = 40
_UNKNOWN_ORIGIN = "origin unknown"


def _record(failure: Observed, level: str) -> dict[str, Any]:
    """One member of a group; `level` as shown (levels follow the fold), `raw_level` as the rank logged it,
    `suspect` what it named (an echo: what its origin named), `origin_class` the class its origin recorded (an
    echo's, "" when it did not learn it)."""
    return {
        "rank": failure.rank,
        "role": failure.role,
        "instance": failure.instance,
        "reason": failure.reason,
        "reason_class": failure.reason_class,
        "ts": failure.ts,
        "level": level,
        "raw_level": failure.level,
        "suspect": failure.suspect,
        "origin_class": failure.origin_class,
    }


def not_kept(model: ClusterModel, since: float | None = None) -> int:
    """Failures the model took and forgot (it keeps the newest ones) that a list from `since` would hold: all it
    forgot, none when the failures it kept reach back before `since` (it forgets the first to arrive)."""
    if since is not None and model.failures and model.failures[0].ts < since:
        return 0
    return model.failures_total - len(model.failures)


def failures_json(
    groups: list[FailureGroup], context: Sequence[Sequence[Context]] | None, incidents: Sequence[int], cut: int
) -> dict[str, Any]:
    """The stable JSON of `kvtop failures --json` (docs/json.md documents the fields): the groups, and `not_kept`, how
    many failures older than theirs the model did not keep (`cut`, from `not_kept()`)."""
    return {"groups": to_json(groups, context, incidents), "not_kept": cut}


def to_json(
    groups: list[FailureGroup],
    context: Sequence[Sequence[Context]] | None = None,
    incidents: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Each group as `kvtop failures --json` lists it; `incidents`: each group's incident id (0 where it is in
    none the model keeps)."""
    lines = context if context is not None else [[] for _ in groups]
    ids = incidents if incidents is not None else [0] * len(groups)
    return [
        {
            "room": group.room,
            "incident": incident,
            "origin": _record(group.origin, shown_level(group.origin)) if group.origin else None,
            "origin_label": group.origin_label,
            "aborted": group.aborted,
            "echo_count": group.echo_count,
            "echoes": [{**_record(echo, "debug"), "origin": echo.origin} for echo in group.echoes],
            "context": [line.as_dict() for line in near],
        }
        for group, near, incident in zip(groups, lines, ids, strict=True)
    ]


def _member_line(what: str, ts: float, dated: bool, where: str, reason_class: str, text: str, ranks: int) -> str:
    """A line under a group's, in its columns: what it is under ROOM (indented), then its time, rank, class and
    words under TIME, ORIGIN (`ranks` wide), CLASS and REASON."""
    return f"  {what:<18} {stamp(ts, dated)} {where:<{ranks}} {reason_class:<18} {'':>6}  {text[:_REASON_WIDTH]}"


def _context_line(line: Context, dated: bool, ranks: int) -> str:
    """`  lost_connection ... decode-0/TP1 ...`: its rank where its line named one (two ranks' same words are two
    lines; a pipeline stage's `decode-0/PP1-TP1`), its instance where not."""
    text = line.text.splitlines()[-1].strip() if line.kind == "traceback" else line.text
    what = "likely cause" if line.likely_cause else line.kind
    return _member_line(what, line.ts, dated, _where(line), "", text, ranks)


def _where(line: Context) -> str:
    """Its rank where its line named one, its instance where not."""
    return line.source if line.tp is None else rank_label(line.source, line.tp, line.pp, line.dp)


def _shown(near: Sequence[Context], debug: bool) -> Sequence[Context]:
    """The lines shown under a group of those near it: all with `debug`, else its likely causes (a few)."""
    return near if debug else [line for line in near if line.likely_cause][:_CAUSES_SHOWN]


def _ranks_width(groups: Sequence[FailureGroup], debug: bool, context: Sequence[Sequence[Context]] | None) -> int:
    """The ORIGIN column's width: `_RANKS_WIDTH`, wider for a longer rank shown in it (a pipeline stage's or a DP
    replica's, `prefill-0/DP1-PP1-TP3`), up to `_RANKS_WIDTH_MAX`."""
    shown = [group.origin_label or _UNKNOWN_ORIGIN for group in groups]
    shown += [echo.rank for group in groups for echo in group.echoes] if debug else []
    shown += [_where(line) for near in context or () for line in _shown(near, debug)]
    return min(max([_RANKS_WIDTH, *map(len, shown)]), _RANKS_WIDTH_MAX)


def render_groups(
    groups: list[FailureGroup],
    debug: bool,
    context: Sequence[Sequence[Context]] | None = None,
    cut: tuple[int, int] = (0, 0),
) -> str:
    """One line per origin (with its echo count and when it started); with `debug`, each echo below it in time order, in
    the same columns (its own time, rank, class and reason).

    Times carry their date when the groups fall on more than one day. With context (from logs): the likely
    causes (transport-library lines) under each origin, and with `debug` every related line too. `cut`: how
    many older failures the model did not keep, and how many it keeps (a last line says so when any).
    """
    dated = spans_days([group.first_ts for group in groups])
    width = len(stamp(0.0, dated))
    ranks = _ranks_width(groups, debug, context)
    lines = [f"{'ROOM':<20} {'TIME':<{width}} {'ORIGIN':<{ranks}} {'CLASS':<18} {'ECHOES':>6}  REASON"]
    for index, group in enumerate(groups):
        origin = group.origin
        label = group.origin_label or _UNKNOWN_ORIGIN
        carried = carrying_echo(group) if origin is None else None
        reason = origin.reason if origin else "(the origin's own event was not seen)"
        reason_class = origin.reason_class if origin else "-"
        if carried is not None and carried.origin_class:
            reason_class = carried.origin_class
            reason = f"(its own event was not seen; an echo carried its class and suspect, {carried.suspect})"
        lines.append(
            f"{group.room:<20} {stamp(group.first_ts, dated)} {label:<{ranks}} {reason_class:<18} "
            f"{group.echo_count:>6}  {reason[:_REASON_WIDTH]}"
        )
        if debug:
            lines.extend(
                _member_line("echo", echo.ts, dated, echo.rank, echo.reason_class, echo.reason, ranks)
                for echo in sorted(group.echoes, key=lambda echo: echo.ts)
            )
        near = context[index] if context is not None else []
        lines.extend(_context_line(line, dated, ranks) for line in _shown(near, debug))
    forgotten, kept = cut
    if forgotten:
        lines.append(f"... and {forgotten:,} more failures, older than these: the model keeps the newest {kept:,}")
    return "\n".join(lines)
