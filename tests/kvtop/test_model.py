"""The cluster model from event batches: liveness, rooms across ranks, rates, links, stuck rooms."""

from __future__ import annotations

import numpy as np

from kvtop.model.cluster import SETTLE_S, ClusterModel
from kvtop.model.rolling import RingBuffer, percentiles
from kvtop.model.shapes import GONE_S, STALE_S, LinkView, Liveness
from kvtop.model.transfer_ring import WAITING_KEPT, TransferRing
from kvtop.views.tables import ranks_json, status_json, status_text
from transport.kvpoll import LOST_AFTER_S, LOST_SWEEP_EVERY_S, KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    Progress,
    RoomState,
    TransferDone,
)

T0 = 1_000_000.0


def batch(label: str, seq: int, events: list[Event], incarnation: int = 1) -> EventBatch:
    instance, _, rank = label.rpartition("/TP")
    role = "prefill" if instance.startswith("prefill") else "decode"
    return EventBatch(EVENT_SCHEMA, role, instance, int(rank), incarnation, seq, T0, events)


def room_events(room: int, ts: float, final: KVPoll, peer: str = "") -> list[Event]:
    return [
        RoomState(ts, room, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), peer, 1000),
        RoomState(ts + 0.1, room, int(final), int(KVPoll.Transferring), peer, 1000),
    ]


def test_rank_liveness_follows_the_age_of_its_last_batch():
    """Alive while batches keep coming, stale after a silence, gone after a longer one."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, []), T0)

    assert [model.liveness(T0 + age)["prefill-0/TP0"] for age in (0, STALE_S + 1, GONE_S + 1)] == [
        Liveness.ALIVE,
        Liveness.STALE,
        Liveness.GONE,
    ]


def test_a_room_is_finished_when_every_rank_ended_it_and_counts_as_failed_if_one_failed():
    """One room succeeds everywhere, one fails on one rank: failure rate 1/2 once they settle."""
    model = ClusterModel()
    for label in ("prefill-0/TP0", "decode-0/TP0"):
        peer = "prefill-0" if label.startswith("decode") else ""
        final = KVPoll.Failed if label.startswith("decode") else KVPoll.Success
        model.apply(
            label, batch(label, 1, room_events(1, T0, KVPoll.Success, peer) + room_events(2, T0, final, peer)), T0
        )

    model.sweep(T0 + SETTLE_S + 1)

    assert model.failure_rate(T0 + 2, 60) == (0.5, 2)
    assert model.rooms == {}
    assert model.links[("prefill-0", "decode-0")].failed_rooms == 1


def test_a_links_failed_rooms_count_a_failed_room_before_it_settles_and_once_after():
    """A one-shot view reads before rooms settle: status names the failed room on its link then, and once later."""
    model = ClusterModel()
    for label in ("prefill-0/TP0", "decode-0/TP0"):
        peer = "prefill-0" if label.startswith("decode") else ""
        model.apply(label, batch(label, 1, room_events(2, T0, KVPoll.Failed, peer)), T0)

    before = status_json(model, T0 + 0.2, 60)["links"]
    model.sweep(T0 + SETTLE_S + 1)
    after = status_json(model, T0 + SETTLE_S + 1, 60)["links"]

    assert [(link["prefill"], link["decode"], link["failed_rooms"]) for link in before] == [
        ("prefill-0", "decode-0", 1)
    ]
    assert [link["failed_rooms"] for link in after] == [1]


def test_a_gone_rank_does_not_keep_a_room_open():
    """A room its dead rank never finished is decided by the live ranks."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, room_events(3, T0, KVPoll.Failed)[:1]), T0)
    later = T0 + GONE_S + 5
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(3, later - 2, KVPoll.Failed, "prefill-0")), later)

    model.sweep(later)

    assert model.failure_rate(later, 60) == (1.0, 1)


def test_a_room_whose_only_rank_was_gone_at_a_sweep_is_retired_once_the_rank_is_back():
    """A sweep while the room's every rank is gone cannot decide it; the first sweep after one returns does."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, room_events(4, T0, KVPoll.Success)), T0)
    while_gone = T0 + GONE_S + 1
    model.sweep(while_gone)
    assert 4 in model.rooms

    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 2, []), while_gone)
    model.sweep(while_gone)

    assert 4 not in model.rooms and model.finished[4].ok


def test_sweeps_retire_only_rooms_ended_on_every_rank_and_quiet_for_the_settle_time():
    """Ended and quiet: retired; ended but touched again lately, or still open: kept for a later sweep."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, room_events(1, T0, KVPoll.Success)), T0)
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 2, room_events(2, T0, KVPoll.Success)[:1]), T0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(3, T0, KVPoll.Success)), T0)
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 3, room_events(3, T0, KVPoll.Success)), T0 + 1)

    model.sweep(T0 + SETTLE_S + 0.5)
    assert sorted(model.rooms) == [2, 3] and sorted(model.finished) == [1]

    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 4, room_events(2, T0 + 2, KVPoll.Failed)[1:]), T0 + 2)
    model.sweep(T0 + 2 + SETTLE_S + 0.5)
    assert model.rooms == {} and {room: f.ok for room, f in model.finished.items()} == {1: True, 2: False, 3: True}


def test_rooms_without_progress_are_stuck_whatever_state_they_claim():
    """A Transferring room whose last progress is older than the threshold is stuck; a moving one is not."""
    model = ClusterModel()
    events: list[Event] = [
        RoomState(T0, 5, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "", 10),
        RoomState(T0, 6, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "", 10),
        Progress(T0 + 9, 6, 5, 10),
    ]
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, events), T0 + 9)

    assert [room.room for room in model.stuck(T0 + 10, threshold_s=5)] == [5]


def test_an_older_progress_arriving_late_does_not_make_a_room_look_stuck():
    """A late batch from another rank with older progress leaves the room's last progress at the newest."""
    model = ClusterModel()
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(7, T0, KVPoll.Transferring)[:1]), T0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 2, [Progress(T0 + 9, 7, 5, 10)]), T0 + 9)
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, [Progress(T0 + 1, 7, 4, 10)]), T0 + 9)

    assert (model.rooms[7].last_progress, model.stuck(T0 + 10, threshold_s=5)) == (T0 + 9, [])


def test_rates_come_from_decode_transfers_in_the_window():
    """GB/s and latency percentiles use the decode ranks' finished transfers of the window only."""
    model = ClusterModel()
    done: list[Event] = [TransferDone(T0 + i, 100 + i, 1e9, 0.01 * (i + 1), "prefill-0") for i in range(10)]
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, done), T0 + 10)

    rates = model.rates(T0 + 10, window_s=5)

    assert round(rates.gbps, 3) == round(5e9 / 5 / 1e9, 3)
    assert model.links[("prefill-0", "decode-0")].transfers == 10


def test_a_rank_s_rate_is_what_it_moves_now_and_none_once_it_is_gone():
    """`kvtop ranks` averaged a rank's bytes over a minute: a rank gone 20 s showed `11.5 MB/s` beside `gone`
    (the dashboard, over 10 s, said 0 B/s)."""
    model = ClusterModel()
    done: list[Event] = [TransferDone(T0 + i, 100 + i, 1e9, 0.01, "prefill-0") for i in range(10)]
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, done), T0 + 10)

    moving, gone = (ranks_json(model, T0 + age)[0] for age in (10, 30))

    assert (moving["state"], moving["gbps"]) == ("alive", 1.0)
    assert (gone["state"], gone["gbps"]) == ("gone", 0.0)


def test_a_rank_not_heard_from_shows_no_rate_and_once_gone_no_rooms_in_flight():
    """After a `kill -9` the rank showed `stale 1.4 MB/s` for 10 s, then `gone` with 1 room in flight: a silent rank
    moves nothing kvtop hears of, and a gone rank's rooms are no longer counted open (`status` leaves them out)."""
    model = ClusterModel()
    done: list[Event] = [TransferDone(T0 + i, 100 + i, 1e7, 0.01, "prefill-0") for i in range(10)]
    beat = Heartbeat(T0 + 9, {}, 1, 0, 0.0, 0, 0.0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, [*done, beat]), T0 + 10)

    alive, stale, gone = (ranks_json(model, T0 + 10 + age)[0] for age in (0, STALE_S + 1, GONE_S + 1))

    assert (alive["state"], alive["gbps"], alive["inflight"]) == ("alive", 0.01, 1)
    assert (stale["state"], stale["gbps"], stale["inflight"]) == ("stale", 0.0, 1)
    assert (gone["state"], gone["gbps"], gone["inflight"]) == ("gone", 0.0, None)


def test_status_says_when_its_rates_divide_by_less_than_its_window():
    """Transfers heard for 10 s of a 60 s window (a recording, a collector that just started): the rates are per
    second of those 10 s, and status says so (it said `finished in 60s, 1.0/s` of rooms that finished in 10 s)."""
    model = ClusterModel()
    done: list[Event] = [TransferDone(T0 + i, 100 + i, 1e9, 0.01, "prefill-0") for i in range(10)]
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, done), T0 + 10)

    rates = model.rates(T0 + 10, window_s=60)
    rooms = next(line for line in status_text(model, T0 + 10, 60).splitlines() if line.startswith("rooms"))

    assert (rates.span_s, rates.per_s_over) == (60, 10)
    assert rooms.endswith("(transfers per second over the 10s heard)")


def test_rooms_per_second_divides_by_the_seconds_its_finished_rooms_cover_and_status_says_one_window_for_both():
    """Rooms finished over 30 s (a snapshot's rooms) but transfers heard for the last 10 s: rooms/s is the finished
    rooms over their 30 s, not over the transfers' 10 s (it read 3.0/s, and `30 finished in 60s` beside
    `per second over the 10s heard`); the line names each count's window once."""
    model = ClusterModel()
    for room in range(30):
        for label, peer in (("prefill-0/TP0", "decode-0"), ("decode-0/TP0", "prefill-0")):
            model.apply(label, batch(label, room + 1, room_events(room, T0 + room, KVPoll.Success, peer)), T0 + room)
    done: list[Event] = [TransferDone(T0 + i, i, 1e9, 0.01, "prefill-0") for i in range(20, 30)]
    model.apply("decode-0/TP0", batch("decode-0/TP0", 99, done), T0 + 30)

    rates = model.rates(T0 + 30, window_s=60)
    rooms = next(line for line in status_text(model, T0 + 30, 60).splitlines() if line.startswith("rooms"))

    assert (rates.finished, round(rates.rooms_over), round(rates.per_s_over)) == (30, 30, 10)
    assert round(rates.rooms_per_s, 1) == 1.0
    assert "30 finished in the 30s heard, 1.0/s, 1.00 GB/s (transfers per second over the 10s heard)" in rooms


def test_status_with_ranks_heard_and_no_room_finished_gives_no_failure_rate_not_0_percent():
    """Agents heard, nothing finished in the window: status said `failure rate 0.0% (0 failures)`, a health it
    never measured, where `check` said no failure rate; JSON `failure_rate` and `abort_rate` are null."""
    model = ClusterModel()
    for label in ("prefill-0/TP0", "decode-0/TP0"):
        model.apply(label, batch(label, 1, []), T0)

    status = status_json(model, T0 + 1, 60)
    health = next(line for line in status_text(model, T0 + 1, 60).splitlines() if line.startswith("health"))

    assert (status["rooms_finished"], status["failure_rate"], status["abort_rate"]) == (0, None, None)
    assert health == (
        "health  0 rooms failed (0 failures) in 60s, no failure rate (no room finished), 0 client aborts, 0 stuck, "
        "0 gaps"
    )


def test_failures_feed_the_fold_and_rank_counts():
    """Origins and echoes are counted per rank and folded into groups."""
    model = ClusterModel()
    origin = Failure(T0, 9, "decode-0/TP1", "bad", "checksum", "error", False, "decode-0/TP1")
    echo = Failure(T0, 9, "decode-0/TP0", "x", "propagated", "debug", True, "decode-0/TP1")
    model.apply("decode-0/TP1", batch("decode-0/TP1", 1, [origin]), T0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, [echo]), T0)

    assert [(g.origin_label, g.echo_count) for g in model.groups()] == [("decode-0/TP1", 1)]
    assert (model.ranks["decode-0/TP1"].origins, model.ranks["decode-0/TP0"].echoes) == (1, 1)


def test_ring_buffer_keeps_the_last_rows_and_answers_windows():
    """Fixed memory: old rows are overwritten; a window returns rows at or after its start."""
    ring = RingBuffer(4, 1)
    for i in range(6):
        ring.extend(np.array([[float(i), float(i * 10)]]))

    assert len(ring) == 4
    assert sorted(ring.window(4.0)[:, 1].tolist()) == [40.0, 50.0]
    assert percentiles(np.array([])) == [0.0, 0.0, 0.0]


def test_ring_buffer_extend_keeps_what_single_appends_would_keep():
    """Bulk rows wrap around and overflow like the same rows appended one at a time, in the same slots."""
    rows = np.arange(22, dtype=np.float64).reshape(11, 2)
    bulk, single = RingBuffer(4, 1), RingBuffer(4, 1)
    single.extend(rows[:1])
    bulk.extend(rows[:1])
    for row in rows[1:]:
        single.extend(row[None, :])
    bulk.extend(rows[1:3])
    bulk.extend(rows[3:])

    assert bulk.window(0.0).tolist() == single.window(0.0).tolist()
    assert len(bulk) == 4


def test_a_transfer_ring_fed_in_bulk_holds_each_row_where_single_appends_put_it():
    """Transfers wait as events and are written in bulk (every `WAITING_KEPT`, or at a read): the slots, the
    next slot and the size are those of one append per transfer, across a wrap and with rows appended between."""
    transfers = [TransferDone(T0 + i, i, 100 * i, 0.01 * i, "prefill-0") for i in range(WAITING_KEPT + 7)]
    bulk, single = TransferRing(48, seconds=True), TransferRing(48, seconds=True)
    bulk.add(transfers[:3])
    assert len(bulk._waiting) == 3  # not written yet
    bulk.extend(np.array([[T0, 1.0, 0.5]]))  # a row appended meanwhile comes after them
    bulk.add(transfers[3:])
    for event in transfers[:3]:
        single.extend(np.array([[event.ts, event.nbytes, event.seconds]]))
    single.extend(np.array([[T0, 1.0, 0.5]]))
    for event in transfers[3:]:
        single.extend(np.array([[event.ts, event.nbytes, event.seconds]]))

    data, next_slot, size = bulk.state()
    expected = single.state()
    assert (data.tolist(), next_slot, size) == (expected[0].tolist(), expected[1], expected[2])
    assert size == 48 and bulk.window(T0 + WAITING_KEPT + 6)[:, 1].tolist() == [100.0 * (WAITING_KEPT + 6)]


def test_a_rank_reporting_a_retired_room_late_does_not_count_it_twice():
    """Snapshots arrive agent by agent: a late rank updates the retired room (here: to failed), never adds one."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, room_events(8, T0, KVPoll.Success)), T0)
    model.sweep(T0 + SETTLE_S + 1)
    late = T0 + SETTLE_S + 2
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(8, T0, KVPoll.Failed, "prefill-0")), late)
    model.sweep(late + SETTLE_S + 1)

    assert model.failure_rate(late, 60) == (1.0, 1)


def test_a_state_that_is_no_kvpoll_value_is_counted_and_skipped_not_fatal():
    """An agent sending state 99 gets the event rejected and counted; the rest of its batch still applies."""
    model = ClusterModel()
    events: list[Event] = [RoomState(T0, 7, 99, 0, "", 1000), *room_events(8, T0, KVPoll.Success)]

    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, events), T0)

    assert model.rejected == 1
    assert list(model.rooms) == [8]
    assert model.rooms[8].states == {"prefill-0/TP0": KVPoll.Success}


def test_values_that_are_no_numbers_in_range_are_rejected_before_any_view_or_journal_sees_them():
    """NaN and infinite times, a previous state of 7, a negative duration, a class (its own or its origin's) or a
    level of no closed set (each a series of the exporter's, or an incident's kind), a NaN CPU: each counted, none
    kept."""
    model = ClusterModel(journal_events=100)
    nan, inf = float("nan"), float("inf")
    hostile: list[Event] = [
        RoomState(nan, 1, int(KVPoll.Transferring), 2),
        RoomState(T0, 2, int(KVPoll.Transferring), 7),
        Progress(inf, 3, 10, 100),
        TransferDone(T0, 4, 100, -1.0),
        Failure(nan, 5, "decode-0/TP0", "boom", "other", "error", False, "decode-0/TP0"),
        Failure(T0, 6, "decode-0/TP0", "boom", "made-up-20000", "error", False, "decode-0/TP0"),  # exporter series
        Failure(T0, 7, "decode-0/TP0", "boom", "other", "loud", False, "decode-0/TP0"),
        Failure(T0, 9, "decode-0/TP0", "echo", "propagated", "debug", True, "decode-0/TP1", "x", "made-up"),
        Heartbeat(T0, {}, 0, 0, nan, 0, 10.0),
    ]
    good = room_events(8, T0, KVPoll.Success)

    accepted = model.apply("decode-0/TP0", batch("decode-0/TP0", 1, [*hostile, *good]), T0)

    assert model.rejected == len(hostile)
    assert accepted == good
    assert [list(events) for _, events in model.journal] == [good]
    assert (list(model.rooms), len(model.failures), len(model.transfers.window(0.0))) == ([8], 0, 0)


def test_an_open_room_without_news_for_the_bound_is_retired_as_lost():
    """A room whose terminal state never came is open and stuck, then retired as lost once the bound passed."""
    model = ClusterModel(lost_after_s=LOST_AFTER_S)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(1, T0, KVPoll.Transferring)), T0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 2, room_events(2, T0, KVPoll.Success)), T0)
    model.sweep(T0 + SETTLE_S + 1)
    early = T0 + LOST_AFTER_S - 1
    model.apply("decode-0/TP0", batch("decode-0/TP0", 3, []), early)  # the rank is alive, silent on room 1
    model.sweep(early)
    before = (sorted(model.rooms), len(model.stuck(early, 10.0)), model.lost)
    late = T0 + LOST_AFTER_S + LOST_SWEEP_EVERY_S + 1
    model.apply("decode-0/TP0", batch("decode-0/TP0", 4, []), late)
    model.sweep(late)

    assert before == ([1], 1, 0)
    assert (model.rooms, model.lost, model.open_rooms(late)) == ({}, 1, [])
    assert [(room, f.ok) for room, f in model.finished.items()] == [(2, True)]


def test_a_room_that_still_makes_progress_is_not_lost():
    """Progress is news: a long transfer whose state has not changed for the bound stays open."""
    model = ClusterModel(lost_after_s=60.0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(1, T0, KVPoll.Transferring)), T0)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 2, [Progress(T0 + 100, 1, 10, 1000)]), T0 + 100)

    model.sweep(T0 + 120)

    assert (list(model.rooms), model.lost) == ([1], 0)


def test_the_journal_keeps_recent_deliveries_only_when_asked_and_within_its_bound():
    """Headless models keep no journal; a dashboard's keeps whole deliveries up to its event bound."""
    headless, dashboard = ClusterModel(), ClusterModel(journal_events=4)
    for seq in range(1, 4):
        for model in (headless, dashboard):
            model.apply("prefill-0/TP0", batch("prefill-0/TP0", seq, room_events(seq, T0, KVPoll.Success)), T0)

    assert (headless.journaling, list(headless.journal)) == (False, [])
    assert [len(events) for _, events in dashboard.journal] == [2, 2]
    assert dashboard.journal_total == 3


def test_a_rooms_states_are_replaced_never_changed_in_place():
    """The dict of states a frame holds stays as it was while the collector applies a new rank's state."""
    model = ClusterModel()
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 1, room_events(1, T0, KVPoll.Transferring)), T0)
    held = model.rooms[1].codes

    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(1, T0, KVPoll.Success)), T0)
    model.apply("prefill-0/TP0", batch("prefill-0/TP0", 2, room_events(1, T0 + 1, KVPoll.Success)), T0)

    assert held == {"prefill-0/TP0": int(KVPoll.Transferring)}
    assert model.rooms[1].codes == {"prefill-0/TP0": int(KVPoll.Success), "decode-0/TP0": int(KVPoll.Success)}


def test_the_rooms_json_lists_the_open_rooms_then_those_that_ended_each_oldest_first():
    """`kvtop rooms --json` interleaved open and ended rooms by age (its help and docs say open ones first)."""
    from kvtop.views.tables import rooms_json

    model = ClusterModel()
    model.apply("decode-0/TP0", batch("decode-0/TP0", 1, room_events(1, T0, KVPoll.Success)), T0 + 1)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 2, room_events(2, T0 + 1, KVPoll.Failed)), T0 + 2)
    model.apply("decode-0/TP0", batch("decode-0/TP0", 3, room_events(3, T0 + 2, KVPoll.Transferring)[:1]), T0 + 3)

    listed = [(r["room"], r["outcome"]) for r in rooms_json(model, T0 + 3)]

    assert listed == [(3, "open"), (1, "succeeded"), (2, "failed")]


def test_the_rooms_table_lists_stuck_then_failed_then_open_then_succeeded_and_counts_what_it_leaves_out():
    """`kvtop rooms` printed ~1000 rooms oldest first, its failed ones lost among them: the table lists those that
    want a look first (stuck, failed newest first, open slowest first, then succeeded newest first), up to its limit,
    and a last line counts the rest by outcome; the JSON keeps every room."""
    from kvtop.views.tables import rooms_json, rooms_text

    model, label = ClusterModel(), "decode-0/TP0"
    finals = {1: KVPoll.Transferring, 2: KVPoll.Success, 3: KVPoll.Failed, 4: KVPoll.Failed}
    finals |= {5: KVPoll.Transferring, 6: KVPoll.Transferring, 7: KVPoll.Success}
    starts = {1: 0, 2: 1, 3: 2, 4: 5, 5: 8, 6: 12, 7: 13}
    for seq, (room, final) in enumerate(finals.items(), 1):
        events = room_events(room, T0 + starts[room], final)
        model.apply(label, batch(label, seq, events if final != KVPoll.Transferring else events[:1]), T0 + starts[room])
    model.apply(label, batch(label, 8, []), T0 + 14)  # the rank beats on: room 1, open, is stuck

    rooms = rooms_json(model, T0 + 15)
    table = rooms_text(rooms, limit=4).splitlines()

    assert [int(line.split()[0]) for line in table[1:-1]] == [1, 4, 3, 5]
    assert table[1].split()[1:3] == ["open", "STUCK"]
    assert table[-1] == "... and 3 more rooms (1 open, 2 succeeded): --limit 0 lists all 7, --json too"
    assert [int(line.split()[0]) for line in rooms_text(rooms, limit=0).splitlines()[1:]] == [1, 4, 3, 5, 6, 7, 2]
    assert len(rooms) == 7


def test_status_lists_the_links_with_the_most_failed_rooms_and_counts_the_rest():
    """Logs naming an address per room made up to 1024 links, and `status` printed a line for each: it lists the 16
    with the most failed rooms and one line counting the rest; the JSON keeps every link."""
    model = ClusterModel()
    for peer in range(40):
        model.links["prefill-0", f"10.0.0.{peer}:15004"] = LinkView(failed_rooms=peer)

    lines = [line for line in status_text(model, T0, 60).splitlines() if line.startswith("link")]

    assert len(status_json(model, T0, 60)["links"]) == 40
    assert lines[0] == "link    prefill-0 -> 10.0.0.39:15004: 0 transfers, 0 B, 39 failed"
    assert len(lines) == 17 and lines[15].endswith("24 failed")
    assert lines[16] == f"link    ... and 24 more ({sum(range(24))} failed rooms, 0 B): --json lists every link"


def test_percentiles_are_numpys_bit_for_bit() -> None:
    """`percentiles` gives what `np.percentile` gives (the same float, NaN where it says NaN) for any size, ties,
    infinities and NaN (it no longer calls it: tests/kvtop/test_start_imports.py, a status loads no `numpy.ma`)."""
    generator = np.random.default_rng(7)
    samples = [generator.exponential(0.2, size) for size in (1, 2, 3, 10, 99, 100, 101, 512, 4096)]
    samples += [generator.integers(0, 4, size).astype(np.float64) for size in (2, 5, 50)]  # ties
    samples += [np.array([0.1, np.inf, 0.3]), np.array([-np.inf, np.inf]), np.array([0.2, np.nan, 0.1])]
    points = (0, 1, 25, 50, 75, 90, 95, 99, 99.9, 100)
    different = []
    for values in samples:
        with np.errstate(invalid="ignore"):  # inf - inf, where numpy says NaN
            theirs = [float(value) for value in np.percentile(values, points)]
        ours = percentiles(values, points)
        if [f"{value!r}" for value in ours] != [f"{value!r}" for value in theirs]:
            different.append((values.size, ours, theirs))

    assert different == []
