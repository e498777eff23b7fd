"""The model's fast ingest applies deliveries exactly as a plain event-by-event reference does."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtop.model.cluster import SETTLE_S, ClusterModel, Identity
from kvtop.model.fold import ROOM_REUSE_S, Observed
from kvtop.model.resync import unheld
from kvtop.model.shapes import GONE_S, LinkView, RankView, RoomView
from transport.kvpoll import KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    AbortEvent,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    Progress,
    RoomState,
    Snapshot,
    TransferDone,
)
from transport.wire import AgentInfo

T0 = 1_000_000.0
LABELS = ["prefill-0/TP0", "decode-0/TP0", "decode-0/TP1"]


class ReferenceModel(ClusterModel):
    """The model's rules written one event at a time, as plainly as possible (the definition of ingest)."""

    def apply(self, label: str, item: Snapshot | EventBatch, now: float) -> None:
        self._now = now
        view = self._rank(label, item)
        again = isinstance(item, Snapshot) and view.last_seen > 0 and view.incarnation == item.incarnation
        view.last_seen = now
        if isinstance(item, Snapshot) and again:  # asked again after a gap: only what the model lacks
            self._failure_keys = None  # made afresh from the failures held (the model keeps its set up to date)
            events: list[Event] = unheld(self, view, item)
        elif isinstance(item, Snapshot):
            events = [e for e in (item.hello, item.heartbeat) if e is not None]
            events += [*item.finished_rooms, *item.live_rooms, *item.progress, *item.failures, *item.transfers]
        else:
            events = list(item.events)
        if self._journal_kept:
            self._journal(label, events)
        for event in events:
            self._apply_one(view, event)

    def _apply_one(self, view: RankView, event: Event) -> None:
        if isinstance(event, AgentHello):
            agent = event.agent
            view.role, view.host, view.pid, view.incarnation = agent.role, agent.host, agent.pid, agent.incarnation
            self._hellos[view.label] = Identity(agent.incarnation, agent.host, agent.pid, agent.kind)
        elif isinstance(event, Heartbeat):
            view.inflight, view.counters = event.inflight_rooms, event.counters
            view.cpu_percent, view.rss_bytes = event.cpu_percent, event.rss_bytes
        elif isinstance(event, RoomState):
            self._one_room_state(view, event)
        elif isinstance(event, TransferDone):
            view.transfers.extend(np.array([[event.ts, event.nbytes]]))
            if view.role != "decode":
                return
            self.transfers.extend(np.array([[event.ts, event.nbytes, event.seconds]]))
            link = self.links.setdefault((event.peer, view.instance), LinkView())
            link.recent.extend(np.array([[event.ts, event.nbytes]]))
            link.transfers += 1
            link.nbytes += event.nbytes
        elif isinstance(event, Progress):
            room = self.rooms.get(event.room)
            if room is not None:
                room.bytes_done = max(room.bytes_done, event.bytes_done)
                room.last_progress = max(room.last_progress, event.ts)
        elif isinstance(event, Failure):
            self.failures.append(Observed(event.ts, event.room, event.rank, view.role, event.reason,
                                          event.reason_class, event.origin, event.level,
                                          event.is_from_another_rank, view.from_log))  # fmt: skip
            self.failures_total += 1
            if event.origin == event.rank:
                view.origins += 1
            else:
                view.echoes += 1

    def _ended(self, gone: set[str]) -> list[RoomView]:
        """Every room that all live ranks ended, by walking them all (what sweep and rates look at)."""
        return [room for room in self.rooms.values() if room.finished(gone)]

    def _settled(self, now: float, gone: set[str]) -> list[RoomView]:
        """Every room all live ranks ended and no delivery touched for `SETTLE_S`, by walking them all."""
        return [room for room in self.rooms.values() if now - room.touched_at > SETTLE_S and room.finished(gone)]

    def _one_room_state(self, view: RankView, event: RoomState) -> None:
        if event.state not in set(KVPoll):
            self.rejected += 1
            return
        room = self.rooms.get(event.room)
        retired = self.finished.get(event.room)
        if room is None and retired is not None and event.ts - retired.ts <= ROOM_REUSE_S:
            retired.ok = retired.ok and event.state != KVPoll.Failed
            if retired.view is not None:
                retired.view.outcome = retired.ok
            return
        if room is None:
            room = self.rooms[event.room] = RoomView(event.room, event.ts, event.ts)
        room.touched_at = self._now
        room.codes[view.label] = int(KVPoll(event.state))
        if room.finished():
            self._open.discard(room.room)
        else:
            self._open.add(room.room)
        if view.role == "decode" and event.peer:
            room.link = (event.peer, view.instance)
        room.bytes_total = max(room.bytes_total, event.bytes_total)
        room.last_progress = max(room.last_progress, event.ts)


def observed(model: ClusterModel, now: float) -> dict[str, Any]:
    """Everything a view can read from the model, as plain comparable data."""

    def rows(ring: Any) -> list[list[float]]:
        return sorted(ring.window(float("-inf")).tolist())

    ranks = {
        label: (v.role, v.instance, v.rank, v.host, v.pid, v.incarnation, v.last_seen, v.inflight, v.counters,
                v.cpu_percent, v.rss_bytes, v.origins, v.echoes, rows(v.transfers))
        for label, v in model.ranks.items()
    }  # fmt: skip
    return {
        "ranks": ranks,
        "rooms": dict(model.rooms),
        "finished": {room: (f.ts, f.ok) for room, f in model.finished.items()},
        "failures": list(model.failures),
        "transfers": rows(model.transfers),
        "links": {
            key: (link.transfers, link.nbytes, link.failed_rooms, rows(link.recent))
            for key, link in model.links.items()
        },
        "groups": [(g.title, g.echo_count) for g in model.groups()],
        "open": sorted(room.room for room in model.open_rooms(now)),
        "stuck": sorted(room.room for room in model.stuck(now, 2.0)),
        "failures_total": model.failures_total,
        "rejected": model.rejected,
        "rates": model.rates(now, 30.0),
        "failure_rate": model.failure_rate(now, 30.0),
        "liveness": model.liveness(now),
    }


def slots(model: ClusterModel) -> dict[str, Any]:
    """Every ring's rows in slot order (the fast model's rings take transfers in bulk: each row lands where the
    reference's single appends put it, as a keyframe keeps them)."""

    def held(ring: Any) -> tuple[list[list[float]], int, int]:
        data, next_slot, size = ring.state()
        return data[:size].tolist(), next_slot, size

    return {
        "ranks": {label: held(view.transfers) for label, view in model.ranks.items()},
        "model": held(model.transfers),
        "links": {key: held(link.recent) for key, link in model.links.items()},
    }


_ts = st.floats(T0, T0 + 90, allow_nan=False).map(lambda x: round(x, 1))
_room = st.integers(0, 5)
_peer = st.sampled_from(["", "prefill-0", "prefill-1"])
_room_state = st.builds(RoomState, _ts, _room, st.sampled_from([*(int(s) for s in KVPoll), 99]), st.just(0), _peer,
                        st.integers(0, 3).map(lambda x: x * 100))  # fmt: skip
_progress = st.builds(Progress, _ts, _room, st.integers(0, 300), st.just(300))
_done = st.builds(TransferDone, _ts, _room, st.integers(1, 300), st.floats(0.001, 1.0), _peer)
_failure = st.builds(
    lambda ts, room, rank, origin: Failure(ts, room, rank, "why", "checksum", "error", rank != origin, origin),
    _ts, _room, st.sampled_from(LABELS), st.sampled_from(["", *LABELS]),
)  # fmt: skip
_heartbeat = st.builds(Heartbeat, _ts, st.just({"rooms": 1}), st.integers(0, 9), st.just(0), st.just(1.0),
                       st.just(1), st.just(1.0))  # fmt: skip
_abort = st.builds(AbortEvent, _ts, _room, st.just("sent"), st.just("prefill-0/TP0"), st.just(""))
_event: st.SearchStrategy[Event] = st.one_of(
    _room_state, _room_state, _room_state, _progress, _done, _failure, _heartbeat, _abort
)


def _hello(label: str, role: str, incarnation: int) -> AgentHello:
    instance, _, rank = label.rpartition("/TP")
    agent = AgentInfo(role, instance, int(rank), 2, 4096, "", "", 7, "host", incarnation)
    return AgentHello(T0, agent, "1", "", "")


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[str, Snapshot | EventBatch | None, float]]:
    """(label, delivery, now) steps; a None delivery is a sweep at `now` (time moves forward)."""
    steps: list[tuple[str, Snapshot | EventBatch | None, float]] = []
    now = T0
    for seq in range(1, draw(st.integers(1, 12)) + 1):
        now += draw(st.sampled_from([0.0, 0.5, 2.0, GONE_S + 1, 70.0]))
        label = draw(st.sampled_from(LABELS))
        instance, _, rank = label.rpartition("/TP")
        role = draw(st.sampled_from(["prefill", "decode", ""])) or ("decode" if "decode" in label else "prefill")
        incarnation = draw(st.integers(1, 2))
        shift = draw(st.sampled_from([0.0, now - T0]))  # events from about now, or old news
        events = [msgspec.structs.replace(e, ts=e.ts + shift) for e in draw(st.lists(_event, max_size=12))]
        kind = draw(st.sampled_from(["batch", "batch", "snapshot", "sweep"]))
        if kind == "sweep":
            steps.append((label, None, now))
        elif kind == "snapshot":
            hello = _hello(label, role, incarnation) if draw(st.booleans()) else None
            states = [e for e in events if isinstance(e, RoomState)]
            snapshot = Snapshot(1, EVENT_SCHEMA, incarnation, seq, hello, None, states[::2], states[1::2],
                                [e for e in events if isinstance(e, Failure)],
                                [e for e in events if isinstance(e, Progress)],
                                [e for e in events if isinstance(e, TransferDone)])  # fmt: skip
            steps.append((label, snapshot, now))
        else:
            if draw(st.booleans()):
                events.insert(draw(st.integers(0, len(events))), _hello(label, role, incarnation))
            steps.append(
                (label, EventBatch(EVENT_SCHEMA, role, instance, int(rank), incarnation, seq, now, events), now)
            )
    return steps


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(deliveries())
def test_ingest_matches_the_event_by_event_reference(steps):
    """Any sequence of batches, snapshots and sweeps leaves the model exactly as the plain reference leaves it."""
    model, reference = ClusterModel(), ReferenceModel()
    for label, item, now in steps:
        for target in (model, reference):
            if item is None:
                target.sweep(now)
            else:
                target.apply(label, item, now)
        assert observed(reference, now) == observed(model, now)
        assert slots(reference) == slots(model)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(deliveries())
def test_a_batch_applies_like_its_events_one_by_one(steps):
    """Splitting every batch into one-event batches changes nothing a view can read."""
    whole, split = ClusterModel(), ClusterModel()
    for label, item, now in steps:
        if item is None:
            whole.sweep(now)
            split.sweep(now)
            continue
        whole.apply(label, item, now)
        if isinstance(item, Snapshot):
            split.apply(label, item, now)
            continue
        for events in [[event] for event in item.events] or [[]]:
            split.apply(label, msgspec.structs.replace(item, events=events), now)
    assert observed(split, now) == observed(whole, now)


def test_runs_of_one_rooms_states_settle_like_single_events():
    """A room's states in a row (a run), split by other rooms, a rejected state and a retired room's late news,
    leave the model as one event at a time does: the last valid state per rank, open only while not ended."""
    label = "decode-0/TP0"
    transferring, success, failed = int(KVPoll.Transferring), int(KVPoll.Success), int(KVPoll.Failed)
    first = [RoomState(T0, 9, success, 0, "prefill-0", 100)]
    events: list[Event] = [
        RoomState(T0 + 1, 1, transferring, 0, "prefill-0", 100),
        RoomState(T0 + 1, 1, 99, 0, "prefill-1", 900),  # rejected: changes nothing
        Progress(T0 + 2, 1, 50, 100),
        RoomState(T0 + 2, 2, transferring, 0, "prefill-1", 200),
        RoomState(T0 + 3, 9, failed, 0, "prefill-0", 100),  # late news of the retired room 9
        RoomState(T0 + 3, 1, success, 0, "prefill-0", 100),
        RoomState(T0 + 4, 2, success, 0, "prefill-1", 200),
        RoomState(T0 + 4, 2, transferring, 0, "prefill-1", 300),
    ]
    model, reference = ClusterModel(), ReferenceModel()
    for target in (model, reference):
        target.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, T0, first), T0)
        target.sweep(T0 + 2)
        target.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 2, T0, events), T0 + 5)

    assert observed(model, T0 + 5) == observed(reference, T0 + 5)
    assert (model.rejected, sorted(model._open), model.finished[9].ok) == (1, [2], False)
    assert (model.rooms[1].codes, model.rooms[2].bytes_total) == ({label: success}, 300)
