"""Frames built from the model: what each view lists for a filter, faults only, an order or an event level."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_support import CLUSTER, FIXED_NOW, ROOMS_LIVE, ROOMS_OLD, ROOMS_RETIRED, build_model

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, STUCK_AFTER_S, ClusterModel
from kvtop.model.fold import shown_level
from kvtop.model.shapes import STALE_S, RoomView
from kvtop.sources.sglang import load
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.tui.frame import WINDOW_S, FrameBuilder, IncidentRow, Options, RoomSort, group_text
from kvtop.tui.views.failures import group_key
from kvtop.views.event_lines import LEVELS, level_of, shown, to_line
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, AbortEvent, EventBatch, LogContext, RoomState


@pytest.fixture
def model() -> ClusterModel:
    return build_model()


def every_room(model: ClusterModel) -> list[RoomView]:
    """Retired rooms that kept their view, then live ones."""
    return [f.view for f in model.finished.values() if f.view is not None] + list(model.rooms.values())


def failed_rooms(model: ClusterModel) -> set[int]:
    return {group.room for group in model.groups()}


def stuck_rooms(model: ClusterModel) -> set[int]:
    return {room.room for room in model.stuck(FIXED_NOW, STUCK_AFTER_S)}


def listed(model: ClusterModel, **options: object) -> list[int]:
    frame = FrameBuilder(model).build(Options(**options), FIXED_NOW)  # type: ignore[arg-type]
    return [room.room for room in frame.rooms]


def test_the_fixture_cluster_has_failed_stuck_open_and_retired_rooms(model: ClusterModel):
    """The other tests need every kind of room: a few failed, a few stuck, most retired."""
    assert len(every_room(model)) == ROOMS_RETIRED + ROOMS_LIVE + ROOMS_OLD
    assert 0 < len(stuck_rooms(model)) < len(model.open_rooms(FIXED_NOW)) < len(model.rooms) < len(model.finished)
    assert len(failed_rooms(model)) > 10
    assert sum(len(events) for _, events in model.journal) > 1000


def test_a_filter_on_a_room_id_lists_that_room(model: ClusterModel):
    """The whole id matches its room only."""
    room = every_room(model)[123].room

    assert listed(model, filter=str(room)) == [room]


def test_a_filter_on_a_rank_label_lists_the_rooms_that_rank_reported(model: ClusterModel):
    """`decode-1/TP0` (any case) lists exactly the rooms in which that rank has a state."""
    expected = {room.room for room in every_room(model) if "decode-1/TP0" in room.states}

    assert set(listed(model, filter="DECODE-1/tp0")) == expected
    assert 0 < len(expected) < len(every_room(model))


def test_a_filter_on_an_instance_lists_the_rooms_of_its_links(model: ClusterModel):
    """`prefill-1` lists the rooms whose link starts at that prefill instance."""
    expected = {room.room for room in every_room(model) if room.link[0] == "prefill-1"}

    assert set(listed(model, filter="prefill-1")) == expected


def test_a_filter_on_a_state_lists_the_rooms_in_that_state(model: ClusterModel):
    """`stuck`, `failed` and `transferring` each list the rooms in that state."""
    transferring = {room.room for room in every_room(model) if KVPoll.Transferring in room.states.values()}

    assert set(listed(model, filter="stuck")) == stuck_rooms(model)
    assert set(listed(model, filter="failed")) == failed_rooms(model)
    assert set(listed(model, filter="transferring")) == transferring


def test_a_filter_on_a_failure_class_follows_new_failures_as_a_fresh_build_does(model: ClusterModel):
    """The rooms filter scans only the failures new since the last frame: built again after new batches (and
    with another filter), the rooms are what a fresh builder lists, the new failed rooms among them."""
    builder = FrameBuilder(model)
    batches = CLUSTER.rooms(400, first=ROOMS_RETIRED + ROOMS_LIVE)
    new_rooms = {event.room for _, batch in batches for event in batch.events}
    for label, batch in batches:
        model.apply(label, batch, FIXED_NOW - 0.5)
    classes = {f.reason_class for f in model.failures if f.room in new_rooms}
    assert classes, "the new batches failed no room: the test would not see the filter follow them"
    needle = sorted(classes)[0]
    seen_before = len(model.failures)
    builder.build(Options(filter=needle), FIXED_NOW)
    for label, batch in CLUSTER.rooms(400, first=ROOMS_RETIRED + ROOMS_LIVE + 400):
        model.apply(label, batch, FIXED_NOW - 0.4)
    assert len(model.failures) > seen_before

    for options in (Options(filter=needle), Options(filter=needle.upper()), Options(filter="prefill")):
        rooms = [room.room for room in builder.build(options, FIXED_NOW).rooms]
        assert rooms == [room.room for room in FrameBuilder(model).build(options, FIXED_NOW).rooms]
        newly_failed = {f.room for f in list(model.failures)[seen_before:] if needle in f.reason_class}
        if options.filter.lower() == needle:
            assert newly_failed & set(rooms)


def test_faults_only_lists_the_failed_and_the_stuck_rooms(model: ClusterModel):
    """Failed rooms (retired or not) and stuck ones, nothing else; combined with a filter both apply."""
    faults = failed_rooms(model) | stuck_rooms(model)
    on_decode_0 = {room.room for room in every_room(model) if room.link[1] == "decode-0"}

    assert sorted(listed(model, faults_only=True)) == sorted(faults)
    assert set(listed(model, faults_only=True, filter="decode-0")) == faults & on_decode_0


def mixed_model() -> ClusterModel:
    """Rooms of three sizes, so the bytes order has something to sort."""
    model = ClusterModel()
    for index, size in enumerate((1 << 20, 8 << 20, 64 << 10)):
        cluster = SyntheticCluster(room_bytes=size, seed=index, start=CLUSTER.start + index * 0.003)
        for label, batch in (cluster.hello() if index == 0 else []) + cluster.rooms(40):
            model.apply(label, batch, FIXED_NOW - 1.0)
    return model


def test_each_order_sorts_the_rooms_by_its_key():
    """idle: open rooms longest without progress first, then finished ones; bytes: biggest first; room: by id;
    age: newest first."""
    model = mixed_model()
    rooms = {room.room: room for room in every_room(model)}

    def keys(sort: RoomSort, key) -> list[object]:
        return [key(rooms[room]) for room in listed(model, sort=sort)]

    idle = keys(RoomSort.IDLE, lambda room: (room.outcome is not None or room.finished(), room.last_progress))
    size = keys(RoomSort.BYTES, lambda room: room.bytes_total)
    ids = keys(RoomSort.ROOM, lambda room: room.room)
    assert (sorted(idle), sorted(size, reverse=True), sorted(ids)) == (idle, size, ids)
    assert len(set(size)) == 3
    assert listed(model, sort=RoomSort.AGE)[0] == max(rooms.values(), key=lambda room: room.first_seen).room


def folded_leads(model: ClusterModel) -> dict[tuple[float, int, str, str], str]:
    """Each group's lead with its shown level, from a fresh full fold (the reference for levels)."""
    return {(g.lead.ts, g.lead.room, g.lead.rank, g.lead.reason): shown_level(g.lead) for g in model.groups()}


@pytest.mark.parametrize("level", LEVELS)
def test_the_event_tail_holds_every_event_at_or_above_the_level_in_time_order(model: ClusterModel, level: str):
    """The frame's events are the journal's, oldest first (by their time: the fixture's old rooms arrive last, as a
    restarted collector's first snapshot brings them), minus those below the level, at the folded level."""
    leads = folded_leads(model)
    expected = [
        (label, event, level_of(event, leads))
        for label, events in model.journal
        for event in events
        if shown(event, level, leads)
    ]
    expected.sort(key=lambda item: item[1].ts)

    assert expected
    assert FrameBuilder(model).build(Options(level=level), FIXED_NOW).events == expected


def test_the_event_tail_follows_new_batches_and_a_changed_level_or_filter(model: ClusterModel):
    """Built again after new batches, or with another level or filter, the tail is what a fresh builder builds (at
    debug it holds the new rooms' traffic; at info only what an operator acts on, the same as a fresh build)."""
    builder = FrameBuilder(model)
    builder.build(Options(), FIXED_NOW)
    batches = CLUSTER.rooms(50, first=ROOMS_RETIRED + ROOMS_LIVE)
    for label, batch in batches:
        model.apply(label, batch, FIXED_NOW - 0.5)
    new_rooms = {event.room for _, batch in batches for event in batch.events}

    for options in (Options(), Options(level="debug"), Options(level="debug", filter="decode-0/TP1"), Options()):
        events = builder.build(options, FIXED_NOW).events
        assert events == FrameBuilder(model).build(options, FIXED_NOW).events
        if options.level == "debug":
            assert any(getattr(event, "room", None) in new_rooms for _, event, _ in events)


def test_a_filter_narrows_the_event_tail_to_matching_lines(model: ClusterModel):
    """Only lines that contain the filter text (any case) are kept."""
    events = FrameBuilder(model).build(Options(filter="CHECKSUM"), FIXED_NOW).events

    assert len(events) == sum(group.origin is not None for group in model.groups()) > 0
    assert all("checksum" in to_line(label, event, level) for label, event, level in events)


def test_the_fold_is_reused_until_a_failure_arrives(model: ClusterModel):
    """Two frames of an unchanged model share their failure groups; new failures are folded like a full fold."""
    builder = FrameBuilder(model)
    first, second = builder.build(Options(), FIXED_NOW), builder.build(Options(), FIXED_NOW)
    for label, batch in CLUSTER.rooms(200, first=ROOMS_RETIRED + ROOMS_LIVE):
        model.apply(label, batch, FIXED_NOW - 0.5)
    third = builder.build(Options(), FIXED_NOW)

    assert [id(group) for group in first.groups] == [id(group) for group in second.groups]
    assert len(first.groups) < len(third.groups)
    assert model.groups() == third.groups


def test_the_failures_filter_keeps_the_groups_an_origin_or_echo_names(model: ClusterModel):
    """A rank label as filter keeps every group it is the origin or an echo of."""
    groups = FrameBuilder(model).build(Options(filter="decode-0/TP0"), FIXED_NOW).groups

    named = [g for g in model.groups() if "decode-0/TP0" in {g.origin_label, *(echo.rank for echo in g.echoes)}]
    assert named and set(map(group_key, named)) <= set(map(group_key, groups))


def test_a_filter_on_the_rank_that_broke_finds_its_incident_and_every_group_of_it(model: ClusterModel):
    """The sender of the corrupt chunks is named by no group's origin: the filter finds it as a suspect."""
    suspect = next(i.suspect.name for i in model.incidents.incidents.values() if i.kind == "corrupt")
    frame = FrameBuilder(model).build(Options(filter=suspect), FIXED_NOW)

    mine = {i.id for i in model.incidents.incidents.values() if i.suspect.name == suspect}
    assert mine <= {row.id for row in frame.incidents}
    expected = [g for g in model.groups() if model.incidents.incident_of(g).id in mine]
    assert expected and set(map(group_key, expected)) <= set(map(group_key, frame.groups))
    assert all(model.incidents.incident_of(g).id in mine or suspect.lower() in group_text(g) for g in frame.groups)


def test_health_counts_ranks_origins_open_and_stuck_rooms(model: ClusterModel):
    """The health line's counts are the model's, as of the frame's time."""
    health = FrameBuilder(model).build(Options(), FIXED_NOW).health

    assert (health.ranks_alive, health.ranks_total) == (8, 8)
    assert health.failures == len(model.groups(FIXED_NOW, WINDOW_S))
    assert health.rooms_open == len(model.open_rooms(FIXED_NOW))
    assert health.stuck == len(stuck_rooms(model))
    assert health.gaps == model.gaps


def test_ranks_turn_stale_when_their_batches_stop(model: ClusterModel):
    """Seconds later without a batch, no rank counts as alive."""
    health = FrameBuilder(model).build(Options(), FIXED_NOW + STALE_S).health

    assert (health.ranks_alive, health.ranks_total) == (0, 8)


def test_a_frame_carries_the_models_incidents_in_the_views_order_and_each_groups_incident(model: ClusterModel):
    """Every incident the model keeps, as rows (no room lists), in `in_order` (the CLI's), and the incident id of
    each group shown."""
    frame = FrameBuilder(model).build(Options(), FIXED_NOW)

    gap = model.incidents.quiet_gap_s
    assert frame.incidents == [IncidentRow.of(i, FIXED_NOW, gap) for i in model.incidents.in_order(FIXED_NOW)]
    assert frame.group_incidents == [model.incidents.incident_of(g).id for g in frame.groups]
    assert frame.health.incidents_ongoing == sum(row.ongoing and not row.client for row in frame.incidents) > 0


def test_rejected_events_reach_the_health_line_data(model: ClusterModel):
    """A state that is no KVPoll value is skipped by the model and counted in the frame's health."""
    nonsense = [RoomState(FIXED_NOW, 12345, 99, 0) for _ in range(3)]
    model.apply(
        "decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 999, FIXED_NOW, nonsense), FIXED_NOW
    )

    assert FrameBuilder(model).build(Options(), FIXED_NOW).health.rejected == 3


def test_the_event_tail_of_logs_shows_one_line_per_failure_group(utc):
    """Seven prefill ranks losing one decode peer (room 104) are one line at info; at debug all seven show; the
    health line counts the three client aborts apart from the two failures."""
    aborts = Path(__file__).parent.parent / "fixtures" / "sglang" / "aborts"
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    logs = load([aborts / "prefill.log", aborts / "decode.log"], model)
    builder = FrameBuilder(model)

    def room_104(level: str) -> list[str]:
        events = builder.build(Options(level=level), logs.now).events
        return [shown for _, event, shown in events if getattr(event, "room", None) == 104]

    assert room_104("info") == ["warning"]
    assert room_104("debug") == ["warning"] + ["debug"] * 6
    health = builder.build(Options(), logs.now).health
    assert (health.failures, health.aborted) == (2, 3)


def test_a_crash_in_the_event_tail_shows_at_error_as_kvtop_events_prints_it():
    """A rank's crash (a log's context line) was filtered out of the dashboard's events at info, and shown at debug
    when asked; `kvtop events` prints it at error."""
    model = ClusterModel(journal_events=JOURNAL_EVENTS_KEPT)
    crash = LogContext(FIXED_NOW - 5, "crash", None, "Fatal Python error: Segmentation fault", 0)
    model.apply(
        "decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, FIXED_NOW - 5, [crash]), FIXED_NOW
    )

    events = FrameBuilder(model).build(Options(level="error"), FIXED_NOW).events

    assert events == [("decode-0/TP0", crash, "error")]


def test_the_aborts_a_failure_travels_by_are_debug_detail_not_info():
    """Each failure brought about four `abort ... ABORT sent/received` lines at info: errors were 1 line in 5."""
    model = ClusterModel(journal_events=JOURNAL_EVENTS_KEPT)
    sent = AbortEvent(FIXED_NOW - 5, 7, "sent", "prefill-0/TP0", "decode-0/TP0")
    model.apply(
        "decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, FIXED_NOW - 5, [sent]), FIXED_NOW
    )
    builder = FrameBuilder(model)

    assert builder.build(Options(level="info"), FIXED_NOW).events == []
    assert builder.build(Options(level="debug"), FIXED_NOW).events == [("decode-0/TP0", sent, "debug")]
