"""Incidents for people (one line each, ongoing first) and for scripts (JSON); no terminal library needed.

An incident is one cause across rooms: its suspect (what most likely broke), the kind of failure, since when,
how many rooms, its origins (who noticed) and echoes (DOMAIN.md, "Origins, suspects and incidents").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.model.incidents import Incident
from kvtop.model.suspects import Kind
from kvtop.views.text import fit_label
from kvtop.views.times import spans_days, stamp

_SUSPECT_WIDTH = 30
"""The SUSPECT column's least width: it widens to the longest suspect listed, up to `_SUSPECT_MAX`."""
_SUSPECT_MAX = 64


def state(incident: Incident, now: float, quiet_gap_s: float) -> str:
    """`ongoing` while a group came within the quiet gap, else `ended`."""
    return "ongoing" if incident.ongoing(now, quiet_gap_s) else "ended"


def in_span(model: ClusterModel, since: float | None, now: float) -> list[Incident]:
    """The incidents the model keeps that overlap [since, now], in the views' order (`IncidentTracker.in_order`: the
    ongoing first, earliest start on top; then the ended, latest end on top), one still under way at `since` (its
    last room less than a quiet gap before) included (bring them up to date first: `ClusterModel.update_incidents`)."""
    start = None if since is None else since - model.incidents.quiet_gap_s
    return [
        incident
        for incident in model.incidents.in_order(now)
        if (start is None or incident.last_seen >= start) and incident.first_seen <= now
    ]


def suspected_ranks(model: ClusterModel, now: float) -> set[str]:
    """The ranks an ongoing incident (client aborts apart) suspects: a rank by its label, an instance's every rank
    (by its name, or the bootstrap address logs name it by: what broke, where a rank's origins say who noticed)."""
    gap = model.incidents.quiet_gap_s
    suspects = [i.suspect for i in model.incidents.incidents.values() if not i.client and i.ongoing(now, gap)]
    ranks = {s.name for s in suspects if s.kind == "rank"}
    named = [s.name for s in suspects if s.kind == "instance"]
    at = model.instances_at
    instances = {at[name][0] if len(at.get(name, ())) == 1 else name for name in named}  # one log may be there
    if instances:
        ranks.update(label for label, view in model.ranks.items() if view.instance in instances)
    return ranks


def by_incident(model: ClusterModel, groups: Sequence[FailureGroup]) -> dict[int, list[FailureGroup]]:
    """The given groups under the id of their incident (0: a group too old or too new to be in one)."""
    found: dict[int, list[FailureGroup]] = {}
    for group in groups:
        incident = model.incidents.incident_of(group)
        found.setdefault(incident.id if incident is not None else 0, []).append(group)
    return found


def incident_json(incident: Incident, now: float, quiet_gap_s: float) -> dict[str, Any]:
    """One incident as `kvtop incidents --json` gives it (docs/json.md and docs/incidents.md document the fields)."""
    return {
        "id": incident.id,
        "state": state(incident, now, quiet_gap_s),
        "kind": incident.kind,
        "class": incident.title_class,
        "first_class": incident.reason_class,
        "classes": dict(sorted(incident.classes.items(), key=lambda item: -item[1])),
        "headline": incident.headline(),
        "suspect": incident.suspect.as_dict(),
        "suspect_text": incident.suspect_text,
        "evidence": incident.evidence_lines(),
        "client": incident.client,
        "rooms": list(incident.rooms),  # JSON integers, as every room id kvtop writes (docs/json.md)
        "room_count": incident.room_count,
        "roomless": incident.roomless,
        "rooms_complete": incident.rooms_complete,
        "origins": incident.origins,
        "echoes": incident.echoes,
        "noticed_by": dict(sorted(incident.noticed_by.items(), key=lambda item: -item[1])),
        "first_seen": incident.first_seen,
        "last_seen": incident.last_seen,
        "duration_s": round(incident.duration_s, 3),
        "rooms_per_min": round(incident.rooms_per_min, 3),
    }


def to_json(incidents: Sequence[Incident], now: float, quiet_gap_s: float, since: float | None) -> dict[str, Any]:
    """`{"incidents": [...], "ongoing", "now", "since", "quiet_gap_s"}`: every room of each incident listed
    (`rooms_complete` False where the model's bound dropped some)."""
    listed = [incident_json(incident, now, quiet_gap_s) for incident in incidents]
    return {
        "incidents": listed,
        "ongoing": sum(item["state"] == "ongoing" and not item["client"] for item in listed),
        "now": now,
        "since": since,
        "quiet_gap_s": quiet_gap_s,
    }


def render(
    incidents: Sequence[Incident],
    now: float,
    quiet_gap_s: float,
    groups: dict[int, list[FailureGroup]] | None = None,
) -> str:
    """One line per incident, in the order given (`in_span`'s), each suspect whole (a host name tells one server
    from another) up to a column of `_SUSPECT_MAX`; with `groups` (`--debug`), each incident's failure groups under
    it in its columns (the room under SUSPECT, the rank that noticed under WHAT, its class, time, origin/echoes and
    reason)."""
    dated = spans_days([incident.first_seen for incident in incidents] + [now])
    width = len(stamp(0.0, dated)) - 4
    named = min(_SUSPECT_MAX, max([_SUSPECT_WIDTH, *(len(incident.suspect_text) for incident in incidents)]))
    lines = [
        f"{'STATE':<8} {'SUSPECT':<{named}} {'WHAT':<18} {'CLASS':<18} {'ROOMS':>6} {'SINCE':<{width}} "
        f"{'FOR':>8} {'ORIGINS/ECHOES':>15}  EVIDENCE"
    ]
    for incident in incidents:
        evidence = next(iter(incident.evidence_lines()), "")
        suspect = fit_label(incident.suspect_text, named)  # past the widest column, an address keeps its port
        lines.append(
            f"{_state_cell(incident, now, quiet_gap_s):<8} {suspect:<{named}} "
            f"{Kind(incident.kind).verb:<18} {incident.title_class:<18} {_rooms_cell(incident):>6} "
            f"{stamp(incident.first_seen, dated)[:-4]} {duration(incident.duration_s):>8} "
            f"{f'{incident.origins}/{incident.echoes}':>15}  {evidence}"
        )
        for group in (groups or {}).get(incident.id, []):  # a room of it in the same columns: who noticed, as what
            origin = group.origin
            reason = origin.reason if origin else "(the origin's own event was not seen)"
            noticed = fit_label(group.origin_label or "origin unknown", 18)
            lines.append(
                f"{'  room':<8} {group.room:<{named}} {noticed:<18} {origin.reason_class if origin else '-':<18} "
                f"{'':>6} {stamp(group.first_ts, dated)[:-4]} {'':>8} {f'1/{group.echo_count}':>15}  {reason[:80]}"
            )
    return "\n".join(lines)


def _state_cell(incident: Incident, now: float, quiet_gap_s: float) -> str:
    """`ongoing` or `ended`; `aborts` for the client's (no fault: `check` judges them by their rate, as the
    dashboard's incidents panel says)."""
    return "aborts" if incident.client else state(incident, now, quiet_gap_s)


def _rooms_cell(incident: Incident) -> str:
    """`31`, or `2+3` with failures that named no room."""
    return f"{incident.room_count}+{incident.roomless}" if incident.roomless else str(incident.room_count)


def counted(incidents: Sequence[Incident], now: float, quiet_gap_s: float, start: float | None) -> str:
    """`3 incidents from 14:15:00 to 14:27:41 (1 ongoing, 1 of client aborts)`: the window named (client aborts
    are never counted ongoing: no fault, as `check` and the dashboard say)."""
    ongoing = sum(not incident.client and incident.ongoing(now, quiet_gap_s) for incident in incidents)
    clients = sum(incident.client for incident in incidents)
    dated = spans_days([start or now, now])
    where = f"from {stamp(start, dated)[:-4]} to" if start is not None else "kept by the model, as of"
    return (
        f"{plural(len(incidents), 'incident')} {where} {stamp(now, dated)[:-4]} ({ongoing} ongoing, "
        f"{clients} of client aborts)"
    )


def plural(count: int, noun: str, nouns: str = "") -> str:
    """`1 room`, `2 rooms`; `nouns` where adding an s is wrong (`echoes`)."""
    return f"{count} {noun}" if count == 1 else f"{count} {nouns or noun + 's'}"


def incident_size(rooms: int, roomless: int) -> str:
    """`31 rooms`; with failures that named no room, `2 rooms and 3 failures naming none` or `3 failures naming no
    room`."""
    if not roomless:
        return plural(rooms, "room")
    failures = plural(roomless, "failure")
    return f"{plural(rooms, 'room')} and {failures} naming none" if rooms else f"{failures} naming no room"


def duration(seconds: float) -> str:
    """`45s`, `12m05s`, `3h02m`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def ago(seconds: float) -> str:
    """How long ago: `duration`, past two days in days (`92 days`: a log of March read in June)."""
    return f"{int(seconds // 86400)} days" if seconds >= 2 * 86400 else duration(seconds)
