"""The fold from event sequences: origins once, echoes under them, whatever the arrival order."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtop.model.fold import ROOM_REUSE_S, SAME_FAILURE_S, FailureGroup, Observed, fold, shown_level

ROOM = 42


def failure(
    ts: float,
    rank: str,
    origin: str,
    reason_class: str = "checksum",
    room: int = ROOM,
    from_another_rank: bool = False,
    inferred: bool = False,
) -> Observed:
    role = "prefill" if rank.startswith("prefill") else "decode"
    return Observed(ts, room, rank, role, f"reason at {rank}", reason_class, origin, "", from_another_rank, inferred)


def shape(groups: list[FailureGroup]) -> list[tuple[int, str, str | None, list[str]]]:
    """Groups as comparable plain data: room, origin label, origin rank, sorted echo ranks."""
    return [
        (g.room, g.origin_label, g.origin.rank if g.origin else None, sorted(e.rank for e in g.echoes)) for g in groups
    ]


def test_a_group_whose_origin_is_not_seen_is_titled_with_the_class_its_echoes_tell():
    """`check` listed `origins in 60s: ..., decode-0/TP1` (read as a line cut short) and status counted it apart from
    the same origin's other rooms: an agent's echo carries its origin's class, and the title now says it."""
    echo = msgspec.structs.replace(
        failure(1.1, "prefill-0/TP1", "decode-0/TP1", "propagated"), origin_class="timeout_transfer"
    )
    unseen = FailureGroup(ROOM, "decode-0/TP1", None, [echo])
    from_logs = FailureGroup(ROOM, "decode-0/TP1", None, [failure(1.1, "prefill-0/TP1", "decode-0/TP1", "propagated")])

    assert (unseen.title, from_logs.title) == ("decode-0/TP1 timeout_transfer", "decode-0/TP1")


def test_one_origin_and_its_echoes_make_one_group():
    """An origin and the echoes that name it are one group with the right echo count."""
    events = [
        failure(1.0, "decode-0/TP1", "decode-0/TP1"),
        failure(1.1, "prefill-0/TP1", "decode-0/TP1", "propagated"),
        failure(1.1, "decode-0/TP0", "decode-0/TP1", "propagated"),
        failure(1.2, "prefill-0/TP0", "decode-0/TP1", "propagated"),
    ]

    groups = fold(events)

    assert shape(groups) == [(ROOM, "decode-0/TP1", "decode-0/TP1", ["decode-0/TP0", "prefill-0/TP0", "prefill-0/TP1"])]
    assert groups[0].echo_count == 3


def test_an_echo_that_arrives_before_its_origin_still_hangs_under_it():
    """Arrival order does not matter: an echo seen first is folded under the origin seen later."""
    origin = failure(1.0, "prefill-0/TP0", "prefill-0/TP0", "refused")
    echo = failure(1.05, "decode-0/TP0", "prefill-0/TP0", "propagated")

    assert (
        shape(fold([echo, origin]))
        == shape(fold([origin, echo]))
        == [(ROOM, "prefill-0/TP0", "prefill-0/TP0", ["decode-0/TP0"])]
    )


def test_two_origins_in_one_room_are_two_groups():
    """Independent origins in one room (different instances or classes) stay separate, each with its echoes."""
    events = [
        failure(1.0, "prefill-0/TP1", "prefill-0/TP1", "send_failed"),
        failure(1.3, "decode-0/TP0", "decode-0/TP0", "peer_lost"),
        failure(1.4, "prefill-0/TP0", "prefill-0/TP1", "propagated"),
        failure(1.5, "decode-0/TP1", "decode-0/TP0", "propagated"),
    ]

    assert shape(fold(events)) == [
        (ROOM, "prefill-0/TP1", "prefill-0/TP1", ["prefill-0/TP0"]),
        (ROOM, "decode-0/TP0", "decode-0/TP0", ["decode-0/TP1"]),
    ]


def test_ranks_of_one_instance_seeing_the_same_failure_together_are_one_group():
    """Same instance, same class, about the same time: the earliest is the origin, the rest its echoes."""
    events = [
        failure(5.0, "decode-0/TP1", "decode-0/TP1", "timeout_waiting"),
        failure(5.0 + SAME_FAILURE_S / 2, "decode-0/TP0", "decode-0/TP0", "timeout_waiting"),
        failure(5.0 + SAME_FAILURE_S * 3, "decode-0/TP0", "decode-0/TP0", "timeout_waiting", room=ROOM + 1),
    ]

    assert shape(fold(events)) == [
        (ROOM, "decode-0/TP1", "decode-0/TP1", ["decode-0/TP0"]),
        (ROOM + 1, "decode-0/TP0", "decode-0/TP0", []),
    ]


def test_echoes_of_unknown_origin_hang_under_the_other_side_or_an_unknown_root():
    """A bare echo goes under the other side's origin; with no origin at all, under "origin unknown"."""
    explained = [
        failure(1.0, "prefill-0/TP0", "prefill-0/TP0", "send_failed"),
        failure(1.2, "decode-0/TP0", "", "propagated"),
    ]
    unexplained = [
        failure(2.0, "decode-0/TP1", "", "propagated", room=7),
        failure(2.1, "decode-0/TP0", "", "propagated", room=7),
    ]

    assert shape(fold(explained)) == [(ROOM, "prefill-0/TP0", "prefill-0/TP0", ["decode-0/TP0"])]
    assert shape(fold(unexplained)) == [(7, "", None, ["decode-0/TP0", "decode-0/TP1"])]


def test_an_origin_that_was_never_seen_keeps_its_name():
    """Echoes naming a rank whose own event is missing (it died) group under that name, origin None."""
    events = [failure(1.0, "decode-0/TP0", "prefill-0/TP1", "propagated")]

    assert shape(fold(events)) == [(ROOM, "prefill-0/TP1", None, ["decode-0/TP0"])]


def test_a_reused_room_id_starts_a_new_room():
    """The same room id failing again long after is a separate failure, not an echo of the first."""
    events = [
        failure(1.0, "decode-0/TP0", "decode-0/TP0", "checksum"),
        failure(1.0 + ROOM_REUSE_S + 1, "decode-0/TP0", "decode-0/TP0", "checksum"),
    ]

    assert [g.echo_count for g in fold(events)] == [0, 0]


def test_an_echo_from_another_rank_hangs_under_its_own_instance():
    """SGLang's bare "unknown reason from another rank" belongs to its instance's origin, not the other side's."""
    events = [
        failure(1.0, "prefill-0/TP1", "prefill-0/TP1", "send_failed", inferred=True),
        failure(1.1, "decode-0/TP0", "decode-0/TP0", "checksum", inferred=True),
        failure(1.2, "decode-0/TP1", "", "propagated", from_another_rank=True),
        failure(1.2, "prefill-0/TP0", "", "propagated", from_another_rank=True),
    ]

    assert shape(fold(events)) == [
        (ROOM, "prefill-0/TP1", "prefill-0/TP1", ["prefill-0/TP0"]),
        (ROOM, "decode-0/TP0", "decode-0/TP0", ["decode-0/TP1"]),
    ]


def test_an_echo_from_another_rank_follows_its_instance_to_a_cross_instance_origin():
    """With no origin in its instance, it joins the group its instance's other echo joined."""
    events = [
        failure(1.0, "decode-0/TP1", "decode-0/TP1", "checksum", inferred=True),
        failure(1.1, "prefill-0/TP1", "", "propagated"),
        failure(1.2, "prefill-0/TP0", "", "propagated", from_another_rank=True),
    ]

    assert shape(fold(events)) == [(ROOM, "decode-0/TP1", "decode-0/TP1", ["prefill-0/TP0", "prefill-0/TP1"])]


def test_an_inferred_prefill_origin_after_a_decode_timeout_is_its_echo():
    """The decode gave up (timeout or abort) and told the prefill: the prefill's later failure is its echo."""
    after = [
        failure(1.0, "decode-0/TP0", "decode-0/TP0", "timeout_waiting", inferred=True),
        failure(2.0, "prefill-0/TP0", "prefill-0/TP0", "send_failed", inferred=True),
    ]
    before = [
        failure(1.0, "prefill-0/TP0", "prefill-0/TP0", "send_failed", inferred=True),
        failure(2.0, "decode-0/TP0", "decode-0/TP0", "timeout_waiting", inferred=True),
    ]
    named = [
        failure(1.0, "decode-0/TP0", "decode-0/TP0", "timeout_waiting"),
        failure(2.0, "prefill-0/TP0", "prefill-0/TP0", "send_failed"),
    ]

    assert shape(fold(after)) == [(ROOM, "decode-0/TP0", "decode-0/TP0", ["prefill-0/TP0"])]
    assert [g.origin_label for g in fold(before)] == ["prefill-0/TP0", "decode-0/TP0"]
    assert [g.origin_label for g in fold(named)] == ["decode-0/TP0", "prefill-0/TP0"], "agents' own origins stand"


def test_an_inferred_decode_origin_that_records_the_prefills_reason_word_for_word_is_its_echo():
    """SGLang 0.5.23's NIXL and MoRI backends send the prefill's reason with its Failed status; the decode records it
    as its own (`NIXL_ERR_REMOTE_DISCONNECT` on both sides): one failure, the prefill's (two incidents before). The
    same words on a decode before the prefill said them, or other words, are the decode's own."""
    code = "NIXL_ERR_REMOTE_DISCONNECT"
    prefill = Observed(1.0, ROOM, "prefill-0/TP1", "prefill", code, "peer_lost", "prefill-0/TP1", inferred=True)
    told = Observed(1.0, ROOM, "decode-0/TP1", "decode", code, "peer_lost", "decode-0/TP1", inferred=True)
    other_words = msgspec.structs.replace(told, reason="KVSender failed to create transfer: x", reason_class="other")
    earlier = msgspec.structs.replace(told, ts=0.0 - SAME_FAILURE_S)

    assert shape(fold([told, prefill])) == [(ROOM, "prefill-0/TP1", "prefill-0/TP1", ["decode-0/TP1"])]
    assert sorted(g.origin_label for g in fold([prefill, other_words])) == ["decode-0/TP1", "prefill-0/TP1"]
    assert [g.origin_label for g in fold([prefill, earlier])] == ["decode-0/TP1", "prefill-0/TP1"]


ranks = st.sampled_from(["prefill-0/TP0", "prefill-0/TP1", "decode-0/TP0", "decode-0/TP1", "decode-1/TP0"])
observed = st.builds(
    lambda ts, room, rank, origin_kind, origin_rank, reason_class, another, inferred: failure(
        ts, rank, {"self": rank, "other": origin_rank, "none": ""}[origin_kind], reason_class, room, another, inferred
    ),
    st.floats(0, 200, allow_nan=False).map(lambda t: round(t, 2)),
    st.integers(1, 3),
    ranks,
    st.sampled_from(["self", "other", "none"]),
    ranks,
    st.sampled_from(["checksum", "timeout_transfer", "aborted", "propagated"]),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(observed, max_size=25), st.randoms())
def test_the_fold_does_not_depend_on_arrival_order(events, rng: random.Random):
    """Any permutation of the same failures folds to the same groups, and every failure lands in one group."""
    shuffled = list(events)
    rng.shuffle(shuffled)

    groups = fold(events)

    assert shape(fold(shuffled)) == shape(groups)
    placed = [g.origin for g in groups if g.origin] + [e for g in groups for e in g.echoes]
    assert sorted(placed) == sorted(set(events))


def test_a_client_abort_printed_on_both_sides_is_one_failure_with_the_earliest_rank_as_origin():
    """Prefill prints `Aborted by AbortReq.` first, decode later, another prefill rank later still: one group."""
    events = [
        failure(3.0, "decode-0/TP0", "decode-0/TP0", "aborted", inferred=True),
        failure(1.0, "prefill-0/TP1", "prefill-0/TP1", "aborted", inferred=True),
        failure(4.5, "prefill-0/TP0", "prefill-0/TP0", "aborted", inferred=True),
    ]

    groups = fold(events)

    assert shape(groups) == [(ROOM, "prefill-0/TP1", "prefill-0/TP1", ["decode-0/TP0", "prefill-0/TP0"])]
    assert groups[0].aborted


def waited_out(ts: float, rank: str, waited_s: float = 300.0) -> Observed:
    """A decode rank's own record that the room timed out in WaitingForInput after `waited_s`, read from its log."""
    reason = f"Request {ROOM} timed out after {waited_s:.1f}s in KVPoll.WaitingForInput"
    return Observed(ts, ROOM, rank, "decode", reason, "timeout_waiting", rank, "", False, True)


def test_a_decode_that_waited_out_a_room_the_client_aborted_on_prefill_echoes_the_abort():
    """sglang PR #28651: the prefill stops a room the client aborted without telling the decode, whose ranks wait out
    their 300 s; their timeouts are the abort's echoes, the room one client abort (not a new room 300 s later)."""
    events = [
        failure(10.0, "prefill-0/TP0", "prefill-0/TP0", "aborted", inferred=True),
        failure(10.0, "prefill-0/TP1", "prefill-0/TP1", "aborted", inferred=True),
        waited_out(310.0, "decode-0/TP0"),
        waited_out(310.0, "decode-0/TP1"),
    ]

    groups = fold(events)

    assert shape(groups) == [
        (ROOM, "prefill-0/TP0", "prefill-0/TP0", ["decode-0/TP0", "decode-0/TP1", "prefill-0/TP1"])
    ]
    assert groups[0].aborted


def test_a_decode_that_waited_out_a_room_its_prefill_failed_without_telling_it_echoes_that_failure():
    """NIXL's sender tells the decode nothing of its failures before sglang PR #36108 (issue #36033), and a Mooncake
    Failed status may never reach the decode it could not write to: the decode's timeout, 300 s after, is the
    prefill's failure seen late; a prefill failure before the wait the timeout names began is not."""
    send = failure(10.0, "prefill-0/TP0", "prefill-0/TP0", "send_failed", inferred=True)

    during = fold([send, waited_out(309.0, "decode-0/TP0"), waited_out(309.0, "decode-0/TP1")])
    before = fold([send, waited_out(40.0 + SAME_FAILURE_S + 1, "decode-0/TP0", waited_s=30.0)])

    assert shape(during) == [(ROOM, "prefill-0/TP0", "prefill-0/TP0", ["decode-0/TP0", "decode-0/TP1"])]
    assert [g.origin_label for g in before] == ["prefill-0/TP0", "decode-0/TP0"]


def test_a_decode_timeout_before_the_client_aborted_or_too_long_after_is_its_own_failure():
    """The abort explains only a wait it ended: a decode that timed out before it, or a room id failing again longer
    after than its timeout says it waited (a reused id), is a failure of its own, the origin of its group."""
    abort = failure(100.0, "prefill-0/TP0", "prefill-0/TP0", "aborted", inferred=True)

    before = fold([abort, waited_out(99.0, "decode-0/TP0")])
    reused = fold([abort, waited_out(100.0 + 30.0 + ROOM_REUSE_S + SAME_FAILURE_S + 1, "decode-0/TP0", waited_s=30.0)])

    assert [g.origin_label for g in before] == ["decode-0/TP0"]  # the abort after it: its echo (rule 6)
    assert [g.origin_label for g in reused] == ["prefill-0/TP0", "decode-0/TP0"]
    assert [g.echo_count for g in reused] == [0, 0]


def timed_out_bootstrapping(ts: float, rank: str, waited_s: float = 300.0) -> Observed:
    """A prefill rank's own record that the room timed out in Bootstrapping after `waited_s`, read from its log."""
    reason = f"Request {ROOM} timed out after {waited_s:.1f}s in KVPoll.Bootstrapping"
    return Observed(ts, ROOM, rank, "prefill", reason, "timeout_bootstrap", rank, "", False, True)


def test_a_prefill_that_waited_out_the_request_of_a_decode_that_failed_first_echoes_that_failure():
    """A decode whose `send_metadata to prefill H:P failed` records its failure and tells the prefill nothing (it could
    not reach it): the prefill's Bootstrapping timeout 300 s after is that failure seen late, one failure of the room
    (it was two, and two incidents); a decode failure before the wait the timeout names began is not."""
    send = failure(10.0, "decode-0/TP0", "decode-0/TP0", "send_failed", inferred=True)

    during = fold(
        [send, timed_out_bootstrapping(310.0, "prefill-0/TP0"), timed_out_bootstrapping(310.0, "prefill-0/TP1")]
    )
    before = fold([send, timed_out_bootstrapping(40.0 + SAME_FAILURE_S + 1, "prefill-0/TP0", waited_s=30.0)])

    assert shape(during) == [(ROOM, "decode-0/TP0", "decode-0/TP0", ["prefill-0/TP0", "prefill-0/TP1"])]
    assert [g.origin_label for g in before] == ["decode-0/TP0", "prefill-0/TP0"]


def named(ts: float, rank: str, reason_class: str, suspect: str) -> Observed:
    """An agent's origin of the room, naming what it suspects."""
    role = "prefill" if rank.startswith("prefill") else "decode"
    return Observed(ts, ROOM, rank, role, f"reason at {rank}", reason_class, rank, suspect=suspect)


def test_agents_origins_on_both_sides_that_name_one_suspect_are_one_failure():
    """A decode rank killed mid-transfer: its prefill peer's send fails and its own instance loses it, each before
    the other's word arrives; the room was listed twice, under two origins (a hostile walkthrough's cluster)."""
    send = named(5.0, "prefill-0/TP1", "send_failed", "decode-0/TP1")
    lost = named(6.5, "decode-0/TP0", "peer_lost", "decode-0/TP1")

    assert shape(fold([lost, send])) == [(ROOM, "prefill-0/TP1", "prefill-0/TP1", ["decode-0/TP0"])]


def test_agents_origins_that_name_different_suspects_stay_apart():
    corrupt = named(5.0, "decode-0/TP0", "checksum", "prefill-0/TP0")
    lost = named(5.5, "prefill-0/TP1", "peer_lost", "decode-0/TP1")

    assert [g.origin_label for g in fold([corrupt, lost])] == ["decode-0/TP0", "prefill-0/TP1"]


def test_a_group_whose_origin_was_never_seen_is_led_by_its_earliest_echo_at_its_side_s_level():
    """No origin: the earliest echo leads the group, shown at decode's origin level (error), not debug."""
    echoes = [failure(2.0, "decode-0/TP1", "", "propagated"), failure(1.5, "decode-0/TP0", "", "propagated")]

    (group,) = fold(echoes)

    assert (group.origin_label, group.lead.rank, shown_level(group.lead), group.aborted) == (
        "", "decode-0/TP0", "error", False,
    )  # fmt: skip
