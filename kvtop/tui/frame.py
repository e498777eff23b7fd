"""What one dashboard frame shows, read from the model under its lock (no Textual here).

A worker thread builds a `Frame` on the refresh timer; the app only draws it.
Everything that walks the model (100k rooms, 50k failures) happens here, off
the UI thread, and the fold is recomputed only when failures changed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from kvtop.event_lines import shown, to_line
from kvtop.fold import FailureGroup
from kvtop.model import ClusterModel, Liveness, RankView, RoomView
from kvtop.tables import STUCK_AFTER_S
from transport.events import Event
from transport.kvpoll import KVPoll

WINDOW_S = 60.0
"""Seconds the rates, failure rate and top origins cover."""
GROUPS_SHOWN = 2000
"""The failures view lists the newest groups; older ones stay in `kvtop failures --json`."""
EVENTS_SHOWN = 20_000


class RoomSort(StrEnum):
    """Orders of the rooms view (the `s` key cycles them)."""

    AGE = "age"
    IDLE = "idle"
    BYTES = "bytes"
    ROOM = "room"


@dataclass(frozen=True)
class Health:
    """The cluster health line."""

    ranks_alive: int
    ranks_total: int
    rooms_open: int
    rooms_per_s: float
    gbps: float
    latency_p99_s: float
    failure_rate: float
    failures: int
    stuck: int
    gaps: int


@dataclass(frozen=True)
class RankRow:
    label: str
    role: str
    instance: str
    rank: int
    liveness: Liveness
    gbps: float
    inflight: int
    origins: int
    echoes: int
    cpu_percent: float


@dataclass(frozen=True, slots=True)
class RoomEntry:
    """A room in the rooms view: its view (read when drawn) and outcome (None while some rank has it open)."""

    view: RoomView
    ok: bool | None

    def stuck(self, now: float) -> bool:
        return self.ok is None and now - self.view.last_progress > STUCK_AFTER_S

    def failed(self) -> bool:
        return self.ok is False or KVPoll.Failed in self.view.states.values()


@dataclass(frozen=True)
class Options:
    """What the user chose: filter text, faults only, room order."""

    filter: str = ""
    faults_only: bool = False
    sort: RoomSort = RoomSort.AGE
    level: str = "info"
    """Lowest event level the events view shows (echoes and room traffic are debug)."""


@dataclass(frozen=True)
class Frame:
    """Everything the views draw, consistent as of `now`."""

    now: float
    health: Health
    throughput: list[float]
    """GB/s per second over the last minute, oldest first (the sparkline)."""
    ranks: list[RankRow]
    links: dict[tuple[str, str], tuple[float, int]]
    """(prefill instance, decode instance) -> (GB/s over the window, failed rooms)."""
    top_origins: list[tuple[str, int]]
    rooms: list[RoomEntry]
    groups: list[FailureGroup]
    events: list[tuple[str, Event]]
    error: str = ""
    """The source's last error (bootstrap address not answering, say)."""
    options: Options = field(default_factory=Options)


class FrameBuilder:
    """Builds frames from one model; remembers the last fold so unchanged failures are not refolded."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self._fold_key: tuple[int, int] = (-1, 0)
        self._groups: list[FailureGroup] = []

    def build(self, options: Options, now: float | None = None, error: str = "") -> Frame:
        """Call with the model's lock held."""
        now = time.time() if now is None else now
        model = self.model
        groups = self._fold()
        recent_groups = [g for g in groups if now - g.first_ts <= WINDOW_S]
        rooms = self._rooms(now)
        stuck = sum(entry.stuck(now) for entry in rooms)
        rates = model.rates(now, WINDOW_S)
        failure_rate, _ = model.failure_rate(now, WINDOW_S)
        liveness = [view.liveness(now) for view in model.ranks.values()]
        health = Health(
            ranks_alive=liveness.count(Liveness.ALIVE),
            ranks_total=len(liveness),
            rooms_open=sum(entry.ok is None for entry in rooms),
            rooms_per_s=rates.rooms_per_s,
            gbps=rates.gbps,
            latency_p99_s=rates.latency_p99,
            failure_rate=failure_rate,
            failures=len(recent_groups),
            stuck=stuck,
            gaps=model.gaps,
        )
        return Frame(
            now=now,
            health=health,
            throughput=self._throughput(now),
            ranks=[_rank_row(view, now) for view in sorted(model.ranks.values(), key=_rank_order)],
            links=self._links(now),
            top_origins=Counter(g.title for g in recent_groups).most_common(8),
            rooms=_select(rooms, options, now),
            groups=_select_groups(groups[-GROUPS_SHOWN:], options.filter),
            events=self._events(options),
            error=error,
            options=options,
        )

    def _fold(self) -> list[FailureGroup]:
        failures = self.model.failures
        key = (len(failures), id(failures[-1]) if failures else 0)
        if key != self._fold_key:
            self._fold_key, self._groups = key, self.model.groups()
        return self._groups

    def _rooms(self, now: float) -> list[RoomEntry]:
        """Recently finished rooms, then open ones, each in the order the model first heard of them."""
        gone = {label for label, view in self.model.ranks.items() if view.liveness(now) is Liveness.GONE}
        entries = [RoomEntry(f.view, f.ok) for f in self.model.finished.values() if f.view is not None]
        entries += [
            RoomEntry(view, _outcome(view, gone) if view.finished(gone) else None) for view in self.model.rooms.values()
        ]
        return entries

    def _throughput(self, now: float) -> list[float]:
        rows = self.model.transfers.window(now - WINDOW_S)
        seconds = [0.0] * int(WINDOW_S)
        for ts, nbytes in zip(rows[:, 0].tolist(), rows[:, 1].tolist(), strict=True):
            seconds[min(int(WINDOW_S) - 1, int(WINDOW_S - (now - ts)))] += nbytes / 1e9
        return seconds

    def _links(self, now: float) -> dict[tuple[str, str], tuple[float, int]]:
        """GB/s per link over the window comes from the decode ranks' own rings."""
        by_instance: dict[str, float] = {}
        for view in self.model.ranks.values():
            if view.role == "decode":
                by_instance[view.instance] = by_instance.get(view.instance, 0.0) + view.gbps(now, WINDOW_S)
        links = self.model.links
        senders: dict[str, int] = Counter(decode for _, decode in links)
        return {
            (prefill, decode): (by_instance.get(decode, 0.0) / max(1, senders[decode]), link.failed_rooms)
            for (prefill, decode), link in links.items()
        }

    def _events(self, options: Options) -> list[tuple[str, Event]]:
        """The newest events at or above the level that match the filter, oldest first."""
        needle = options.filter.lower()
        lines: list[tuple[str, Event]] = []
        for label, events in reversed(self.model.journal):
            matching = [(label, e) for e in reversed(events) if shown(e, options.level)]
            if needle:
                matching = [(label, e) for label, e in matching if needle in to_line(label, e).lower()]
            lines.extend(matching)
            if len(lines) >= EVENTS_SHOWN:
                break
        return lines[:EVENTS_SHOWN][::-1]


def _rank_order(view: RankView) -> tuple[bool, str, int]:
    return (view.role != "prefill", view.instance, view.rank)


def _rank_row(view: RankView, now: float) -> RankRow:
    return RankRow(
        view.label, view.role, view.instance, view.rank, view.liveness(now), view.gbps(now, 10.0),
        view.inflight, view.origins, view.echoes, view.cpu_percent,
    )  # fmt: skip


def _outcome(view: RoomView, gone: set[str]) -> bool:
    return all(state is KVPoll.Success for label, state in view.states.items() if label not in gone)


_SORT_KEYS = {
    RoomSort.IDLE: lambda entry: entry.view.last_progress,
    RoomSort.BYTES: lambda entry: -entry.view.bytes_total,
    RoomSort.ROOM: lambda entry: entry.view.room,
}


def _select(entries: list[RoomEntry], options: Options, now: float) -> list[RoomEntry]:
    """Faults only (failed or stuck), the filter (room id, rank, instance or state), then the order."""
    if options.faults_only:
        entries = [e for e in entries if e.failed() or e.stuck(now)]
    if options.filter:
        needle = options.filter.lower()
        entries = [e for e in entries if needle in haystack(e, now)]
    if options.sort is RoomSort.AGE:
        return entries[::-1]
    return sorted(entries, key=_SORT_KEYS[options.sort])


def haystack(entry: RoomEntry, now: float) -> str:
    """The text a filter matches a room against."""
    view = entry.view
    states = " ".join(f"{label} {state.name}" for label, state in view.states.items())
    flags = " stuck" if entry.stuck(now) else " failed" if entry.failed() else ""
    return f"{view.room} {states} {view.link[0]} {view.link[1]}{flags}".lower()


def _select_groups(groups: list[FailureGroup], needle: str) -> list[FailureGroup]:
    if not needle:
        return groups
    needle = needle.lower()
    return [g for g in groups if needle in f"{g.room} {g.title} {g.origin.reason if g.origin else ''}".lower()]
