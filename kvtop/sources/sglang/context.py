"""Context lines: what the logs say beside the failures (sessions, NIXL errors, tracebacks, glog, UCX), and
which of them belong with which failure group."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import ROOM_REUSE_S, FailureGroup
from kvtop.model.suspects import is_transport_error
from transport.plane.events import LogContext
from transport.registration import TAKEN_SUFFIX
from transport.wire import label_parts, label_replica

CONTEXT_KEPT = 10_000
CONTEXT_S = 5.0
"""Lines without a room are shown with failure groups that started this close in time."""


class Context(msgspec.Struct, frozen=True):
    """A line shown beside the failure groups it may explain."""

    ts: float
    source: str
    """The instance whose log holds it (the file name while its kind is unknown)."""
    tp: int | None
    kind: str
    room: int | None
    text: str
    pp: int | None = None
    """The pipeline stage the line names (None: none)."""
    dp: int | None = None
    """The DP replica the line is of (None: none named, or the server's DP ranks are no replicas)."""

    @property
    def likely_cause(self) -> bool:
        """Transport libraries (glog, UCX, Ascend MemFabric) log the low-level error that failed the rooms near it."""
        return self.kind in ("glog", "ucx", "memfabric")

    @property
    def transport_error(self) -> bool:
        """An error the transfer's own layers logged (`is_transport_error`)."""
        return is_transport_error(self.kind, self.text)

    def as_dict(self) -> dict[str, Any]:
        return {**msgspec.structs.asdict(self), "likely_cause": self.likely_cause}


def published_errors(model: ClusterModel, since: float, until: float) -> list[Context]:
    """The transport errors (`is_transport_error`) log sidecars published from `since` to `until`."""
    return [_published(label, line) for label, line in model.transport_errors if since <= line.ts <= until]


def _published(label: str, line: LogContext) -> Context:
    """A context line a log sidecar published under the rank `label` (its stage and its DP replica are the
    rank's, one heard as taken's too: `rank_label` of the two names it again)."""
    rank = label.removesuffix(TAKEN_SUFFIX)
    parts = label_parts(rank)
    return Context(
        line.ts, rank.rpartition("/")[0], line.tp, line.kind, line.room, line.text, parts[1] if parts else None,
        label_replica(rank),
    )  # fmt: skip


def context_for(context: Iterable[Context], groups: Sequence[FailureGroup]) -> list[list[Context]]:
    """For each group: lines about its room, and lines near it in time (its instances', transport libraries')."""
    ordered = sorted(context, key=lambda c: c.ts)
    times = [c.ts for c in ordered]
    by_room: dict[int, list[Context]] = {}
    for line in ordered:
        if line.room is not None:
            by_room.setdefault(line.room, []).append(line)
    found: list[list[Context]] = []
    for group in groups:
        start = group.first_ts
        instances = {e.instance for e in group.echoes} | {group.origin_label.rpartition("/")[0]}
        near = ordered[bisect.bisect_left(times, start - CONTEXT_S) : bisect.bisect_right(times, start + CONTEXT_S)]
        lines = [c for c in by_room.get(group.room, []) if abs(c.ts - start) <= ROOM_REUSE_S]
        lines += [c for c in near if c.room is None and (c.likely_cause or c.source in instances)]
        found.append(
            sorted(
                set(lines), key=lambda c: (c.ts, c.source, c.dp or 0, c.pp or 0, -1 if c.tp is None else c.tp, c.text)
            )
        )
    return found


def published_context(model: ClusterModel, groups: Sequence[FailureGroup]) -> list[list[Context]] | None:
    """`context_for` over the context lines log sidecars published (None when none did: agents' groups)."""
    if not model.context:
        return None
    return context_for([_published(label, line) for label, line in model.context], groups)
