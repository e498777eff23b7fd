"""Detail panels: a room's timeline across all its ranks, a rank's history (Rich text, read under the lock).

A panel's text changes only when its subject does (`kvtop.tui.panels` follows it from frame to frame): its
times are clock times, its ages whole seconds, its throughput per 10 s of the clock (the latest complete ones).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rich.text import Text

from kvtop.model.cluster import ClusterModel
from kvtop.tui.rows import Palette, clock
from kvtop.views import units
from kvtop.views.event_lines import to_line
from kvtop.views.incidents import plural
from kvtop.views.tables import crash_line, sidecar_lines, unlisted_line
from kvtop.views.times import spans_days
from transport.plane.events import Event, Failure, Heartbeat

_HISTORY_BUCKET_S = 10.0
Journaled = Iterable[tuple[str, Event]]
"""Events of the journal as (agent label, event), oldest first."""


def of_room(room: int, label: str, event: Event) -> bool:
    """Whether `event` belongs in `room`'s timeline."""
    return getattr(event, "room", None) == room


def of_rank(rank: str, label: str, event: Event) -> bool:
    """Whether `event` belongs in `rank`'s history (its heartbeats)."""
    return label == rank and isinstance(event, Heartbeat)


def journaled(model: ClusterModel) -> Journaled:
    """Every event the model's journal holds."""
    return ((label, event) for label, batch in model.journal for event in batch)


def room_timeline(
    model: ClusterModel, room: int, now: float, palette: Palette, journal: Journaled | None = None
) -> Text:
    """Every event the model still holds for `room`, from every rank, in time order, then its failures;
    `journal`: those of its events already picked out of the model's journal (all of it when None)."""
    events: list[tuple[float, str, Event]] = [
        (event.ts, label, event)
        for label, event in (journaled(model) if journal is None else journal)
        if of_room(room, label, event)
    ]
    view = model.rooms.get(room)
    finished = model.finished.get(room)
    view = view or (finished.view if finished else None)
    text = Text(f"Room {room}\n", style="bold")
    if view is not None:
        idle = "" if finished is not None else f" ({now - view.last_progress:.0f} s ago)"  # a retired room: no age
        text.append(f"first seen {clock(view.first_seen)}, last progress {clock(view.last_progress)}{idle}\n")
        text.append(f"{units.progress(view.bytes_done, view.bytes_total)}, ")  # a line apiece: 80 columns held both
        text.append(f"link {view.link[0] or '-'} -> {view.link[1] or '-'}\n")
        for label, state in sorted(view.states.items()):
            text.append(f"  {label:<18}{state.name}\n", style=palette.error if state.name == "Failed" else "")
    if finished is not None:
        text.append("retired: ", style=palette.dim)
        text.append(
            "succeeded\n" if finished.ok else "FAILED\n", style=palette.success if finished.ok else palette.error
        )
    text.append(f"\nTimeline ({len(events)} events still in the journal)\n", style="bold")
    start = min((ts for ts, _, _ in events), default=now)
    for ts, label, event in sorted(events, key=lambda item: item[0]):
        style = palette.error if isinstance(event, Failure) else ""
        text.append(f"  +{(ts - start) * 1000:9.1f} ms  ", style=palette.dim)
        line = to_line(label, event, narrow=True).split(" ", 2)[2].replace(f"room={room} ", "", 1)  # its own room
        text.append(line + "\n", style=style)
    if not events:
        text.append("  (older than the journal: only the summary above is kept)\n", style=palette.dim)
    return text


def rank_history(
    model: ClusterModel, label: str, now: float, palette: Palette, journal: Journaled | None = None
) -> Text:
    """A rank's identity, counters, throughput per 10 s, host load from its heartbeats and its failures;
    `journal`: its heartbeats already picked out of the model's journal (all of it when None)."""
    view = model.ranks.get(label)
    if view is None:
        return Text(f"{label}: not in the model", style=palette.error)
    text = Text(
        f"{label}  {view.role}, pid {view.pid} on {view.host or '?'}, incarnation {view.incarnation}\n", style="bold"
    )
    state = model.liveness_of(view, now)
    text.append(f"{state}, last heard {now - view.last_seen:.0f} s ago, {plural(view.inflight, 'room')} in flight, ")
    text.append(f"{plural(view.origins, 'origin')}, {plural(view.echoes, 'echo', 'echoes')}\n")
    crash = model.crashes.get(label)
    if crash is not None:
        text.append(f"{crash_line(model, label, crash, spans_days([crash.ts, now]))}\n", style=palette.error)
    if view.registration:
        text.append(f"{unlisted_line(view)}\n", style=palette.error)
    for line in sidecar_lines(model, label):
        text.append(f"{line}\n", style=palette.warning if view.log is not None and view.log.idle else "")
    end = math.floor(now / _HISTORY_BUCKET_S) * _HISTORY_BUCKET_S  # the latest complete 10 s of the clock
    text.append(f"\nThroughput per 10 s to {clock(end)[:8]} (newest last)\n", style="bold")
    rows = view.transfers.window(end - 12 * _HISTORY_BUCKET_S)
    buckets = [0.0] * 12
    for ts, nbytes in zip(rows[:, 0].tolist(), rows[:, 1].tolist(), strict=True):
        if ts < end:
            buckets[max(0, min(11, int(12 - (end - ts) / _HISTORY_BUCKET_S)))] += nbytes / _HISTORY_BUCKET_S
    for row in range(0, len(buckets), 4):  # four a row: six made 67 columns, past an 80-column terminal's panel
        text.append("  " + " ".join(f"{units.rate(per_s):>10}" for per_s in buckets[row : row + 4]) + "\n")
    own = ((name, event) for name, batch in model.journal if name == label for event in batch)
    picked = own if journal is None else journal
    beats = [(event.ts, event) for name, event in picked if name == label and isinstance(event, Heartbeat)]
    text.append(f"\nHeartbeats ({len(beats)} in the journal)\n", style="bold")
    for ts, beat in beats[-10:]:
        text.append(f"  {clock(ts)}  cpu {beat.cpu_percent:5.1f}%  rss {units.size(beat.rss_bytes):>8}  ")
        text.append(f"in flight {beat.inflight_rooms:3}  dropped {beat.events_dropped}\n")
    text.append("\nCounters\n", style="bold")
    for name, count in sorted(view.counters.items()):
        text.append(f"  {name:<28}{count:>12,}\n")
    mine = [f for f in model.failures if f.rank == label][-20:]
    text.append(f"\nFailures seen by this rank (last {len(mine)})\n", style="bold")
    dated = spans_days([failure.ts for failure in mine])
    for failure in mine:
        kind = "origin" if failure.is_origin else f"echo of {failure.origin or 'unknown'}"
        text.append(f"  {clock(failure.ts, dated)}  room {failure.room}  {failure.reason_class}  {kind}\n",
                    style=palette.error if failure.is_origin else palette.dim)  # fmt: skip
    return text
