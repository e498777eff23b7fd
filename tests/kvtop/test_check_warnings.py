"""A check's warnings are said as warnings: a rate over half its limit names the limit, and beside CRITICAL
problems each warning is marked, after them."""

from __future__ import annotations

import time

import pytest

from kvtop.model.cluster import SETTLE_S, ClusterModel
from kvtop.views.check import Thresholds, Verdict, evaluate, source_failing
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, Failure, RoomState

FAILED = (10, 50)
"""2 rooms failed of 79: a failure rate of 2.53%, over half the 5% limit."""


@pytest.fixture
def judged_at() -> tuple[ClusterModel, float]:
    """A decode rank's 79 rooms of the last 30 s, two of them failed (corrupt KV): the model, and when to judge."""
    now = time.time()
    events: list[Event] = []
    for room in range(1, 80):
        ts, end = now - 30 + room * 0.1, KVPoll.Failed if room in FAILED else KVPoll.Success
        events += [RoomState(ts, room, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "prefill-0", 1000),
                   RoomState(ts + 0.01, room, int(end), int(KVPoll.Transferring), "prefill-0", 1000)]  # fmt: skip
        if room in FAILED:
            events.append(Failure(ts + 0.01, room, "decode-0/TP0", "bad", "checksum", "error", False, "decode-0/TP0"))
    model = ClusterModel()
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, now, events), now)
    later = now + SETTLE_S + 0.5
    model.sweep(later)
    return model, later


def test_a_rate_over_half_its_limit_is_a_warning_marked_as_one_beside_critical_problems(judged_at):
    """`failure rate 2.53% > 2.50%` stood among the CRITICAL problems, though the limit is 5%."""
    result = evaluate(judged_at[0], Thresholds(), judged_at[1])

    assert result.verdict is Verdict.CRITICAL
    assert result.problems[0].startswith("incident: ")
    assert result.problems[1:] == ["warning: failure rate 2.53% > 2.50% (half of the 5.00% limit)"]
    assert result.summary.startswith("; ".join(result.problems) + "; 1/1 ranks alive")


def test_a_warning_alone_is_said_without_the_mark(judged_at):
    """An incident of a class that is never CRITICAL: a WARNING, its problems unmarked; the line says the limit."""
    result = evaluate(judged_at[0], Thresholds(incident_classes=(("checksum", None),)), judged_at[1])

    assert result.verdict is Verdict.WARNING
    assert result.problems[1:] == ["failure rate 2.53% > 2.50% (half of the 5.00% limit)"]


def test_a_source_failing_makes_a_warning_s_problems_warnings_beside_it(judged_at):
    """A dashboard's source that stopped answering is CRITICAL: the WARNING's problems after it are marked."""
    result = evaluate(judged_at[0], Thresholds(incident_classes=(("checksum", None),)), judged_at[1])

    failing = source_failing(result, "the dashboard's source: no answer")

    assert failing.verdict is Verdict.CRITICAL
    assert failing.problems[0] == "the dashboard's source: no answer"
    assert all(problem.startswith("warning: ") for problem in failing.problems[1:])
    assert failing.summary == "; ".join([*failing.problems, result.facts])
    assert "facts" not in failing.as_dict()
