"""A running view of a rank whose entry another client took: the listing names the taker's entry under the rank's
label at every discovery. The view made the rank's view anew as the taker's (never heard: gone) each time, and the
rank's next batch made it anew again: its state flickered to gone and its counts started over every 2 s."""

from __future__ import annotations

import time

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.shapes import Liveness
from transport.plane.events import EVENT_SCHEMA, AgentHello, Event, EventBatch, Failure, Heartbeat, Snapshot
from transport.wire import AgentInfo


def test_a_listed_entry_of_another_incarnation_leaves_the_view_of_a_rank_heard_alive() -> None:
    now = time.time()
    own = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    taker = msgspec.structs.replace(own, data_endpoint="tcp://10.0.0.9:1", host="elsewhere", pid=1, incarnation=5)
    model = ClusterModel()
    hello = AgentHello(now - 1, own, "1.0", "tcp://10.0.0.3:3", "tcp://10.0.0.3:4")
    beat = Heartbeat(now - 1, {"rooms_ok": 12}, 2, 0, 1.0, 1 << 20, 10.0, registration="refused: taken")
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 1, [hello, beat]), now - 1)

    model.register(taker)

    view = model.ranks[own.label]
    assert (view.incarnation, view.host, view.pid, view.counters, view.inflight) == (
        77,
        "node-3",
        4321,
        {"rooms_ok": 12},
        2,
    )
    assert view.liveness(now) is Liveness.ALIVE and view.registration == "refused: taken"


def test_a_listed_new_incarnation_replaces_a_view_gone_quiet() -> None:
    """A restart the view did not hear yet (its old incarnation silent past `STALE_S`) is listed as before."""
    now = time.time()
    own = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    model = ClusterModel()
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 9, []), now - 9)
    model.sweep(now)

    model.register(msgspec.structs.replace(own, pid=4400, incarnation=78))

    assert (model.ranks[own.label].incarnation, model.ranks[own.label].pid) == (78, 4400)


def test_a_rank_heard_as_taken_and_then_under_its_own_label_is_one_view() -> None:
    """While another client holds its entry a rank is heard under `prefill-0/TP0~taken`, beside the taker's view;
    once it holds its entry again its batches come under its own label, and the taken view of it goes (it left a
    second row, gone, for good)."""
    now = time.time()
    taken, plain = "prefill-0/TP0~taken", "prefill-0/TP0"
    model = ClusterModel()
    model.apply(taken, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 2, []), now - 2)
    model.apply(plain, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 5, 1, now - 2, []), now - 2)
    assert {label: view.incarnation for label, view in model.ranks.items()} == {taken: 77, plain: 5}
    assert (model.ranks[taken].instance, model.ranks[taken].rank) == ("prefill-0", 0)

    model.apply(plain, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 2, now - 1, []), now - 1)

    assert {label: view.incarnation for label, view in model.ranks.items()} == {plain: 77}


TAKEN, PLAIN = "prefill-0/TP0~taken", "prefill-0/TP0"


def refused(ts: float, room: int, rank: str = PLAIN) -> Failure:
    """An origin as an agent records it: its own label, whatever label a view hears it under."""
    return Failure(ts, room, rank, f"Prefill rank 0 refused room {room}: its KV pool is full", "refused", "warning",
                   False, rank, rank)  # fmt: skip


def batch(rank: int, incarnation: int, seq: int, ts: float, events: list[Event]) -> EventBatch:
    return EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", rank, incarnation, seq, ts, events)


def test_the_failures_of_a_rank_heard_as_taken_are_its_own_not_its_taker_s() -> None:
    """Two processes claim `prefill-0/TP0`, both refusing rooms: the taken one's records name `prefill-0/TP0` as the
    taker's do, and one incident counted both as the taker's (suspect, origins, who noticed). A record heard under
    the taken label names that label for the rank itself: two incidents, each process's rooms under its own row."""
    now = time.time()
    model = ClusterModel()
    model.apply(TAKEN, batch(0, 77, 1, now - 3, [refused(now - 3, room) for room in (1, 2, 3)]), now - 3)
    model.apply(PLAIN, batch(0, 5, 1, now - 3, [refused(now - 3, room) for room in (4, 5)]), now - 3)
    model.sweep(now)

    found = {i.suspect.text: (sorted(i.rooms), i.noticed_by) for i in model.incidents.incidents.values()}
    assert found == {TAKEN: ([1, 2, 3], {TAKEN: 3}), PLAIN: ([4, 5], {PLAIN: 2})}
    assert {(f.room, f.rank, f.origin, f.suspect) for f in model.failures if f.room == 1} == {(1, TAKEN, TAKEN, TAKEN)}
    assert (model.ranks[TAKEN].origins, model.ranks[PLAIN].origins) == (3, 2)


def test_a_taken_rank_s_echo_names_another_taken_rank_as_its_view_does_and_a_listed_one_as_listed() -> None:
    """A sidecar's whole server claimed twice: its TP1, heard as taken too, echoes its TP0's failure (both taken) and
    the group folds under the taken TP0; a room that TP1 echoes of decode-0/TP0 (listed) keeps decode-0/TP0."""
    now = time.time()
    model = ClusterModel()
    model.apply(TAKEN, batch(0, 77, 1, now - 3, [refused(now - 3, 1)]), now - 3)
    echoes = [
        Failure(now - 2.9, 1, "prefill-0/TP1", "Failed due to an unknown reason from another rank", "propagated",
                "debug", True, PLAIN),
        Failure(now - 2.9, 2, "prefill-0/TP1", "Aborted by decode peer", "propagated", "debug", True, "decode-0/TP0"),
    ]  # fmt: skip
    model.apply("prefill-0/TP1~taken", batch(1, 78, 1, now - 3, echoes), now - 3)

    [group] = [group for group in model.groups(now) if group.room == 1]
    assert group.origin is not None and group.origin.rank == TAKEN
    assert [(echo.rank, echo.origin) for echo in group.echoes] == [("prefill-0/TP1~taken", TAKEN)]
    assert [f.origin for f in model.failures if f.room == 2] == ["decode-0/TP0"]


def test_a_taken_rank_s_snapshot_asked_again_adds_none_of_its_failures_twice() -> None:
    now = time.time()
    model = ClusterModel()
    model.apply(TAKEN, batch(0, 77, 1, now - 3, [refused(now - 3, 1)]), now - 3)
    model.failure_keys()  # as a gap's snapshot makes them
    again = Snapshot(1, EVENT_SCHEMA, 77, 1, None, None, [], [], [refused(now - 3, 1)])

    model.apply(TAKEN, again, now - 2)

    assert [(f.room, f.rank) for f in model.failures] == [(1, TAKEN)]
