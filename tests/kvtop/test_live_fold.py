"""The incremental fold the dashboard uses gives what `fold()` gives, as failures arrive and age out."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtop.model.fold import FailureGroup, Observed, fold, shown_level
from kvtop.model.live_fold import LiveFold, lead_key

_RANKS = [f"{role}-{i}/TP{r}" for role in ("prefill", "decode") for i in range(2) for r in range(2)]

_failure = st.builds(
    lambda ts, room, rank, origin, reason_class: Observed(
        ts, room, rank, rank.partition("-")[0], "why", reason_class, rank if origin == "self" else origin
    ),
    st.floats(0, 200, allow_nan=False).map(lambda x: round(x, 2)),
    st.integers(0, 6),
    st.sampled_from(_RANKS),
    st.sampled_from(["self", "", *_RANKS]),
    st.sampled_from(["checksum", "timeout_transfer", "aborted", "propagated"]),
)


def _shape(groups: list[FailureGroup]) -> list[tuple[object, ...]]:
    return [(g.room, g.origin_label, g.origin, sorted(g.echoes)) for g in groups]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_failure, max_size=8), max_size=25), st.integers(5, 40), st.floats(0, 200))
def test_live_fold_matches_fold_after_every_delivery(deliveries, kept, since):
    """After each delivery into a bounded deque: the same groups in the same order, `since` the same cut, and
    the same group leads at the same levels."""
    window: deque[Observed] = deque(maxlen=kept)
    live, total = LiveFold(), 0
    for delivery in deliveries:
        window.extend(delivery)
        total += len(delivery)
        expected = fold(window)
        assert _shape(live.sync(window, total)) == _shape(expected)
        assert _shape(live.since(since)) == _shape([g for g in expected if g.first_ts >= since])
        assert live.leads == {lead_key(g.lead): shown_level(g.lead) for g in expected}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_failure, max_size=8), max_size=25), st.integers(5, 40))
def test_the_moves_it_tells_keep_counts_of_the_held_failures_as_the_fold_has_them(deliveries, kept):
    """A failure is counted where it arrives (an origin when it names its own rank); applying the moves
    `take_moved()` tells after each delivery, every failure still held is counted as the fold holds it."""
    window: deque[Observed] = deque(maxlen=kept)
    live, total = LiveFold(), 0
    counted_origin: dict[Observed, bool] = {}
    for delivery in deliveries:
        for failure in delivery:
            counted_origin.setdefault(failure, failure.is_origin)
        window.extend(delivery)
        total += len(delivery)
        groups = live.sync(window, total)
        for failure, to_echo in live.take_moved():
            assert counted_origin[failure] is to_echo  # a move starts from what it was counted as
            counted_origin[failure] = not to_echo
        origins = {g.origin for g in groups if g.origin is not None}
        assert {f: counted_origin[f] for f in window} == {f: f in origins for f in window}


def test_only_rooms_with_new_failures_are_folded_again(monkeypatch):
    """A delivery touching room 8 folds room 8 alone; one with nothing new folds nothing."""
    window = deque(
        [Observed(1.0, room, "decode-0/TP0", "decode", "why", "checksum", "decode-0/TP0") for room in (7, 8)]
    )
    live = LiveFold()
    live.sync(window, 2)
    folded: list[set[int]] = []
    monkeypatch.setattr(
        "kvtop.model.live_fold.fold", lambda failures: folded.append({f.room for f in failures}) or fold(failures)
    )

    window.append(Observed(1.5, 8, "decode-0/TP1", "decode", "why", "propagated", "decode-0/TP0"))
    groups = live.sync(window, 3)
    live.sync(window, 3)

    assert folded == [{8}]
    assert [(g.room, g.echo_count) for g in groups] == [(7, 0), (8, 1)]
