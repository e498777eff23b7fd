"""Keyframes: the whole state of a `ClusterModel` at one instant, as one msgpack record, and back.

A seek restores the latest keyframe before its time and replays the ops after it, so the model it
builds is the one the collector held (`STATE_FIELDS` names every attribute of the model a keyframe
carries; a test fails when the model gains one that is not here). The dashboard's event journal is
left out (a keyframe's model starts with an empty one; the replay after the keyframe fills it), as is what
the model derives from its state when asked (`DERIVED_FIELDS`).
"""

from __future__ import annotations

import math
from collections import deque

import msgspec
import numpy as np

from kvtop.model.clock import ClockEstimate
from kvtop.model.cluster import TRANSFERS_KEPT, ClusterModel, identities
from kvtop.model.fold import Observed
from kvtop.model.histogram import DurationHistogram
from kvtop.model.incidents import IncidentTracker, TrackerState
from kvtop.model.intake import Intake
from kvtop.model.rolling import RingBuffer
from kvtop.model.shapes import LINK_TRANSFERS_KEPT, RANK_TRANSFERS_KEPT, Finished, LinkView, RankView, RoomView
from kvtop.model.timeline import Timeline
from kvtop.model.transfer_ring import TransferRing
from transport.plane.events import LogContext, LogFollowed
from transport.wire import LOG_SIDECAR

JOURNAL_FIELDS = frozenset(("journal", "journal_total", "_journal_kept", "_journal_events"))
"""The event tail of the dashboard's model: not part of a keyframe (rebuilt by the replay)."""
DERIVED_FIELDS = frozenset(
    (
        "_failure_keys",
        "fold",
        "local_faults",
        "failed_sessions",
        "handshakes",
        "unregistered",
        "_hellos",
        "_peers",
        "_instance_peers",
        "series",
        "_holding",
    )
)
"""Made from the state (`ClusterModel.failure_keys`; the fold, from the failures when restored; the peers, from the
links; the local faults, from the transport errors; the ranks' identities, from their views; whether the sweeps hold
the incidents, from the next sweep), or the maker's choice (`series`: a check's model keeps none, a recording's always
does): not part of a keyframe."""
STATE_FIELDS = frozenset(
    (
        "ranks", "rooms", "finished", "failures", "transfers", "links", "gaps", "intake", "rejected",
        "rejected_frames", "lost", "lost_after_s", "_lost_check_at", "_now", "_open", "_touched",
        "failures_total", "_causes", "retired_outcomes", "context", "incidents", "snapshot_cut",
        "correct_clocks", "timeline", "crashes", "logged_after_crash", "instances_at", "transport_errors",
        "peers_unlinked", "tp_sizes", "transport_notes_dropped",
    )
)  # fmt: skip


class Ring(msgspec.Struct, array_like=True):
    rows: int
    columns: int
    next: int
    size: int
    data: bytes


class Buckets(msgspec.Struct, array_like=True):
    """A `Timeline`: its bucket ids and sums."""

    ids: list[int]
    sums: list[float]


class Rank(msgspec.Struct, array_like=True):
    label: str
    role: str
    instance: str
    rank: int
    host: str
    pid: int
    incarnation: int
    last_seen: float
    inflight: int
    counters: dict[str, int]
    rejected: dict[str, dict[str, int]]
    cpu_percent: float
    rss_bytes: int
    origins: int
    echoes: int
    transfers: Ring
    from_log: bool
    history_since: float
    sidecar: bool
    log: LogFollowed | None
    silences: list[tuple[float, float]] = []
    heard_before: float = 0.0
    clock: list[float] = []
    """The rank's clock samples (`ClockEstimate.differences`)."""
    timeline: Buckets | None = None
    """None in keyframes older than timelines: the restored rank's starts empty."""
    kind: str = ""
    """`RankView.kind` (keyframes older than it: `sidecar` alone says a log sidecar)."""
    named_by: list[str] = []
    """`RankView.named_by` (keyframes older than it: none)."""
    registration: str = ""
    """`RankView.registration` (keyframes older than it: none)."""


class Link(msgspec.Struct, array_like=True):
    prefill: str
    decode: str
    transfers: int
    nbytes: int
    failed_rooms: int
    recent: Ring
    duration_counts: list[int]
    duration_total_s: float


class ModelState(msgspec.Struct, array_like=True):
    ranks: list[Rank]
    rooms: list[RoomView]
    finished: list[Finished]
    failures: list[Observed]
    transfers: Ring
    links: list[Link]
    gaps: int
    intake: Intake
    rejected: int
    rejected_frames: int
    lost: int
    lost_after_s: float
    lost_check_at: float
    now: float
    open: list[int]
    touched: list[tuple[float, tuple[int, ...]]]
    failures_total: int
    causes: list[tuple[int, int]]
    retired_outcomes: dict[str, int]
    context: list[tuple[str, LogContext]]
    incidents: TrackerState | None = None
    """None in keyframes older than incidents: the restored model starts with none."""
    snapshot_cut: int = 0
    correct_clocks: bool = False
    timeline: Buckets | None = None
    crashes: list[tuple[str, LogContext]] = []
    """`ClusterModel.crashes` (keyframes older than it: none)."""
    logged_after_crash: dict[str, float] = {}
    """`ClusterModel.logged_after_crash`."""
    instances_at: dict[str, tuple[str, ...]] = {}
    """`ClusterModel.instances_at`."""
    transport_errors: list[tuple[str, LogContext]] = []
    """`ClusterModel.transport_errors` (keyframes older than it: none)."""
    peers_unlinked: int = 0
    """`ClusterModel.peers_unlinked`."""
    tp_sizes: dict[str, int] = {}
    """`ClusterModel.tp_sizes` (keyframes older than it: none)."""
    transport_notes_dropped: int = 0
    """`ClusterModel.transport_notes_dropped`."""


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ModelState)


def _ring(ring: RingBuffer) -> Ring:
    data, next_slot, size = ring.state()
    return Ring(data.shape[0], data.shape[1], next_slot, size, data.tobytes())


def _unring(state: Ring, ring: TransferRing) -> TransferRing:
    """`ring` (a new one, of the kind the model keeps there), holding what the keyframe kept (ValueError for
    rows that are not finite numbers)."""
    data = np.frombuffer(state.data, dtype=np.float64).reshape(state.rows, state.columns).copy()
    if not np.isfinite(data).all():
        raise ValueError("a ring of a keyframe holds numbers that are not finite")
    ring.restore(data, state.next, state.size)
    return ring


def _rank(view: RankView) -> Rank:
    return Rank(
        view.label, view.role, view.instance, view.rank, view.host, view.pid, view.incarnation, view.last_seen,
        view.inflight, view.counters, view.rejected, view.cpu_percent, view.rss_bytes, view.origins, view.echoes,
        _ring(view.transfers), view.from_log, view.history_since, view.sidecar, view.log, view.silences,
        view.heard_before, view.clock.differences(), Buckets(*view.timeline.state()), view.kind, view.named_by,
        view.registration,
    )  # fmt: skip


def _unrank(state: Rank) -> RankView:
    return RankView(
        state.label, state.role, state.instance, state.rank, state.host, state.pid, state.incarnation,
        state.last_seen, state.inflight, state.counters, state.rejected, state.cpu_percent, state.rss_bytes,
        state.origins, state.echoes, _unring(state.transfers, TransferRing(RANK_TRANSFERS_KEPT)), state.from_log,
        state.history_since, state.kind or (LOG_SIDECAR if state.sidecar else ""), state.log, state.silences,
        state.heard_before, ClockEstimate(state.clock), _untimeline(state.timeline), state.named_by,
        registration=state.registration,
    )  # fmt: skip


def _untimeline(state: Buckets | None) -> Timeline:
    return Timeline() if state is None else Timeline.restored(state.ids, state.sums)


def _link(prefill: str, decode: str, view: LinkView) -> Link:
    _, total_s = view.durations.read()  # buckets what the histogram held aside
    counts = [int(n) for n in view.durations.counts]
    return Link(prefill, decode, view.transfers, view.nbytes, view.failed_rooms, _ring(view.recent), counts, total_s)


def _unlink(state: Link) -> LinkView:
    durations = DurationHistogram()
    if len(state.duration_counts) == len(durations.counts):
        durations.counts[:] = state.duration_counts
        durations.total_s = state.duration_total_s
    recent = _unring(state.recent, TransferRing(LINK_TRANSFERS_KEPT))
    return LinkView(state.transfers, state.nbytes, state.failed_rooms, recent, durations)


def capture(model: ClusterModel) -> bytes:
    """The model's state as one msgpack record (take it under the collector's lock: it reads everything)."""
    model.refold()  # the origin and echo counts kept follow the fold of the failures kept
    state = ModelState(
        [_rank(view) for view in model.ranks.values()],
        list(model.rooms.values()),
        list(model.finished.values()),
        list(model.failures),
        _ring(model.transfers),
        [_link(p, d, view) for (p, d), view in model.links.items()],
        model.gaps, model.intake, model.rejected, model.rejected_frames, model.lost, model.lost_after_s,
        model._lost_check_at, model._now, list(model._open), list(model._touched), model.failures_total,
        list(model._causes.items()), dict(model.retired_outcomes), list(model.context), model.incidents.state(),
        model.snapshot_cut, model.correct_clocks, Buckets(*model.timeline.state()), list(model.crashes.items()),
        dict(model.logged_after_crash), dict(model.instances_at), list(model.transport_errors),
        model.peers_unlinked, dict(model.tp_sizes), model.transport_notes_dropped,
    )  # fmt: skip
    return _ENCODER.encode(state)


def restore(data: bytes | memoryview, journal_events: int = 0) -> ClusterModel:
    """The model a keyframe holds (`journal_events`: the event tail to keep from here on, as the model's
    own argument). Raises `msgspec.DecodeError` when the record is no keyframe of this schema, ValueError when
    what it holds does not hang together (a forged or damaged one: a replay skips it)."""
    state = _DECODER.decode(data)
    rooms = {room.room for room in state.rooms}
    if not rooms.issuperset(state.open) or not all(math.isfinite(rank.last_seen) for rank in state.ranks):
        raise ValueError("a keyframe's open rooms or ranks' times do not hang together")
    model = ClusterModel(journal_events, state.lost_after_s)
    model.ranks = {rank.label: _unrank(rank) for rank in state.ranks}
    model.rooms = {room.room: room for room in state.rooms}
    model.finished = {f.room: f for f in state.finished}
    model.failures.extend(state.failures)
    model.failures_total = state.failures_total
    model.fold.sync(model.failures, model.failures_total)
    model.fold.take_moved()  # the counts captured follow this fold already (`capture` refolds)
    model.transfers = _unring(state.transfers, TransferRing(TRANSFERS_KEPT, seconds=True))
    model.timeline = _untimeline(state.timeline)
    model.transfers.feed(model.timeline)
    for link in state.links:
        model.links[(link.prefill, link.decode)] = _unlink(link)
        model.linked((link.prefill, link.decode))
    model.gaps, model.intake, model.rejected = state.gaps, state.intake, state.rejected
    model.rejected_frames, model.lost, model._lost_check_at = state.rejected_frames, state.lost, state.lost_check_at
    model._now, model._open, model._touched = state.now, set(state.open), deque(state.touched)
    model.failures_total, model._causes = state.failures_total, dict(state.causes)
    model.retired_outcomes = dict(state.retired_outcomes)
    model.context.extend(state.context)
    model.crashes = dict(state.crashes)
    model.logged_after_crash = dict(state.logged_after_crash)
    model.instances_at = dict(state.instances_at)
    model.transport_errors.extend(state.transport_errors)
    for label, line in state.transport_errors:
        model.keep_transport_error(label, line, restoring=True)
    model.snapshot_cut, model.correct_clocks = state.snapshot_cut, state.correct_clocks
    model._hellos = identities(model.ranks)
    model.peers_unlinked, model.transport_notes_dropped = state.peers_unlinked, state.transport_notes_dropped
    model.tp_sizes = dict(state.tp_sizes)
    if state.incidents is not None:
        model.incidents = IncidentTracker.restored(state.incidents)
    return model
