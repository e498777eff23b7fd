"""`kvtop status` names each registration the bootstrap service refused with how long ago it was: a refusal an
hour old read as one of a second ago (the lines said nothing of when), so an operator could not tell a fault fixed
from one going on. JSON gives the same per refusal (`bootstrap.refusals`)."""

from __future__ import annotations

import time

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Refused
from kvtop.views.check import Thresholds, evaluate
from kvtop.views.tables import status_json, status_text
from transport.plane.events import EVENT_SCHEMA, EventBatch

TAKEN = "prefill-0/TP0: registered from 10.0.0.9, but incarnation 7 from 10.0.0.3 holds it live (from 10.0.0.9)"
OLD = "decode-0/TP0: 'tcp://10.77.0.2:5000' is not the registering client's address 10.77.0.1 (from 10.77.0.1)"
RELAYED = "decode-1/TP0: a line a service too old to give its time said (from 10.0.0.8)"


def model_with_refusals(now: float) -> ClusterModel:
    """A live rank, and three refusals the service listed: 42 s and 3,700 s old, and one whose time it did not say."""
    model = ClusterModel()
    model.apply("prefill-1/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-1", 0, 1, 1, now, []), now)
    model.intake.bootstrap_counters = {"refused_takeover": 1, "rejected_invalid": 2}
    model.intake.bootstrap_refused = [TAKEN, OLD, RELAYED]
    model.intake.bootstrap_refusals = [Refused(TAKEN, "prefill", now - 42.0), Refused(OLD, "decode", now - 3700.0)]
    return model


def test_status_says_how_long_ago_each_refusal_was() -> None:
    now = time.time()
    lines = status_text(model_with_refusals(now), now, 60.0).splitlines()

    assert f"  refused {TAKEN}, 42s ago" in lines
    assert f"  refused {OLD}, 1h01m ago" in lines
    assert f"  refused {RELAYED}" in lines  # no time given: none made up


def test_status_json_gives_each_refusal_its_role_and_age() -> None:
    now = time.time()
    bootstrap = status_json(model_with_refusals(now), now, 60.0)["bootstrap"]

    assert bootstrap["refused"] == [TAKEN, OLD, RELAYED]
    assert bootstrap["refusals"] == [
        {"line": TAKEN, "role": "prefill", "age_s": 42.0},
        {"line": OLD, "role": "decode", "age_s": 3700.0},
    ]


def test_check_says_a_refusals_age_in_the_words_status_does() -> None:
    """`status` said `refused LINE, 42s ago`; `check` named the same refusal without its age (`; the bootstrap
    service refused LINE`), so a check could not tell a refusal going on from one long fixed."""
    now = time.time()
    model = model_with_refusals(now)

    result = evaluate(model, Thresholds(min_ranks=2), now, whole_cluster=True)

    assert f"  refused {TAKEN}, 42s ago" in status_text(model, now, 60.0).splitlines()
    assert result.problems[0] == f"1 ranks alive, need 2; the bootstrap service refused {TAKEN}, 42s ago"
