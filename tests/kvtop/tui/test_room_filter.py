"""The rooms filter keeps each room's text between frames: what it lists follows the rooms as they change."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, build_model

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.model.shapes import RoomView
from kvtop.tui.frame import FrameBuilder, Options, is_stuck, outcome
from kvtop.tui.room_filter import FAILED, STUCK, RoomTexts, flag_words, room_text
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, RoomState

NEW_ROOM = 900_001
"""A room id the fixture cluster never uses."""


@pytest.fixture
def model() -> ClusterModel:
    return build_model()


def decode_state(model: ClusterModel, state: KVPoll, previous: KVPoll, peer: str = "prefill-0") -> None:
    """decode-0/TP0 says `NEW_ROOM` moved to `state` (its peer: `peer`)."""
    event = RoomState(FIXED_NOW - 0.5, NEW_ROOM, state, previous, peer, 4096)
    batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 10_000, FIXED_NOW, [event])
    model.apply("decode-0/TP0", batch, FIXED_NOW)


def listed(builder: FrameBuilder, needle: str) -> set[int]:
    return {room.room for room in builder.build(Options(filter=needle), FIXED_NOW).rooms}


def test_a_room_whose_state_changes_after_a_filtered_frame_is_matched_by_its_new_state(model: ClusterModel):
    """The text kept from the first frame names the old state: the next frame matches the new one, and no
    longer the old (the model replaced the room's states, so the kept text is built again)."""
    builder = FrameBuilder(model)
    decode_state(model, KVPoll.Transferring, KVPoll.WaitingForInput)
    assert NEW_ROOM in listed(builder, "decode-0/tp0 transferring")
    assert NEW_ROOM not in listed(builder, "decode-0/tp0 success")

    decode_state(model, KVPoll.Success, KVPoll.Transferring)

    assert NEW_ROOM in listed(builder, "decode-0/tp0 success")
    assert NEW_ROOM not in listed(builder, "decode-0/tp0 transferring")


def test_a_room_whose_peer_changes_after_a_filtered_frame_is_matched_by_its_new_link(model: ClusterModel):
    builder = FrameBuilder(model)
    decode_state(model, KVPoll.Transferring, KVPoll.WaitingForInput, peer="prefill-0")
    assert NEW_ROOM in listed(builder, str(NEW_ROOM))
    assert NEW_ROOM not in listed(builder, "prefill-1 decode-0")

    decode_state(model, KVPoll.Transferring, KVPoll.WaitingForInput, peer="prefill-1")

    assert NEW_ROOM in listed(builder, "prefill-1 decode-0")


def test_a_room_a_second_log_rank_fails_is_found_by_that_rank_after_a_filtered_frame():
    """A room known from logs gains a rank when another rank's log fails it: the filter then finds it by that
    rank too (the model replaces the room's states for it, as for every change; its link stays the same)."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)

    def log_failure(rank: int, ts: float) -> None:
        label = f"decode-0/TP{rank}"
        model.log_rank(label, "decode", "decode-0", rank)
        failure = Failure(ts, NEW_ROOM, label, "KVTransferError: timed out", "timeout_waiting", "error", False, label)
        model.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", rank, 0, 1, ts, [failure]), ts)

    log_failure(0, FIXED_NOW - 2.0)
    builder = FrameBuilder(model)
    assert listed(builder, "decode-0/tp0 failed") == {NEW_ROOM}
    assert listed(builder, "decode-0/tp1 failed") == set()

    log_failure(1, FIXED_NOW - 1.0)

    assert listed(builder, "decode-0/tp1 failed") == {NEW_ROOM}


def test_a_second_frame_of_an_unchanged_model_builds_no_text_again(model: ClusterModel):
    """A frame whose rooms did not change costs the matching only; a changed room's text alone is built."""
    builder = FrameBuilder(model)
    listed(builder, "prefill")
    texts = builder._texts
    built = texts.built
    assert built == len(texts) > 0

    listed(builder, "decode")
    assert texts.built == built

    decode_state(model, KVPoll.Transferring, KVPoll.WaitingForInput)
    listed(builder, "decode")
    assert texts.built == built + 1


NEEDLES = ("stuck", "failed", "0 stuck", "1 fail", "/tp1 failed", "ck", "d", " ", "1 s", "transferring")


@pytest.mark.parametrize("needle", NEEDLES)
def test_the_filter_lists_what_the_text_with_its_stuck_or_failed_word_holds(model: ClusterModel, needle: str):
    """The word judged apart from the kept text matches as if it ended the text, across the join too (`1 fail`:
    a room whose link ends in `decode-1` and that failed)."""
    builder = FrameBuilder(model)
    frame = builder.build(Options(filter="prefill"), FIXED_NOW)  # a first frame: the texts are kept
    reasons = {f.room for f in model.failures if needle in f"{f.reason} {f.reason_class}".lower()}
    rooms = [f.view for f in model.finished.values() if f.view is not None] + list(model.rooms.values())

    def word(room: RoomView) -> str:
        return STUCK if is_stuck(room, frame.gone, FIXED_NOW) else FAILED if outcome(room, frame.gone) is False else ""

    expected = {room.room for room in rooms if needle in room_text(room) + word(room) or room.room in reasons}

    assert listed(builder, needle) == expected


def test_flag_words_are_those_a_needle_lies_in_or_ends_with_the_start_of():
    assert flag_words("stuck") == (STUCK,)
    assert flag_words("0 f") == (FAILED,)
    assert flag_words("ck") == (STUCK,)
    assert flag_words(" ") == (STUCK, FAILED)
    assert flag_words("tp0") == ()
    assert flag_words("stuckx") == ()


def test_texts_of_rooms_gone_from_the_frames_are_dropped():
    rooms = [RoomView(room, 0.0, 0.0, {"decode-0/TP0": int(KVPoll.Success)}) for room in range(10_000)]
    texts = RoomTexts()
    texts.matching(rooms, "success", lambda room, words: "", set())
    assert len(texts) == 10_000

    kept = texts.matching(rooms[:100], "success", lambda room, words: "", set())

    assert len(kept) == 100
    assert len(texts) == 100
