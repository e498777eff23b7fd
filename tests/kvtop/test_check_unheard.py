"""A check through a relay whose upstream stopped answering says the live ranks it lacks are unheard behind that
relay, not merely missing: the count and the role rules name the relay, never the ranks one by one."""

from __future__ import annotations

import time

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Refused
from kvtop.model.shapes import GONE_S
from kvtop.views.check import Thresholds, Verdict, evaluate
from transport.plane.events import EVENT_SCHEMA, EventBatch

RELAY = "tcp://cluster-relay:7101"
STOPPED = "relay tcp://rack-2:7101 stopped answering (none within 1.0s)"


def model_behind_a_dead_rack(now: float) -> ClusterModel:
    """prefill-0/TP0 heard now; decode-0/TP0 last heard past `GONE_S` ago, kept by the relay from its dead rack."""
    model = ClusterModel()
    for role, instance, heard in (("prefill", "prefill-0", now), ("decode", "decode-0", now - GONE_S - 5)):
        model.apply(f"{instance}/TP0", EventBatch(EVENT_SCHEMA, role, instance, 0, 1, 1, heard, []), heard)
    model.intake.upstream_relay = RELAY
    model.intake.upstream_errors = [STOPPED]
    model.intake.upstream_kept = ["decode-0/TP0"]
    return model


def test_the_ranks_a_check_lacks_are_said_unheard_behind_the_relay_whose_upstream_stopped_answering() -> None:
    """`1 ranks alive, need 2` and `no decode rank alive` read as if the decode rank were dead; its silence is the
    relay's upstream's: both now say how many are unheard behind which relay. Still CRITICAL: silence is no health."""
    now = time.time()
    result = evaluate(model_behind_a_dead_rack(now), Thresholds(), now, whole_cluster=True)

    behind = f"(1 unheard behind the relay at {RELAY}, whose upstream stopped answering)"
    assert result.verdict is Verdict.CRITICAL
    assert result.problems == [
        f"upstream stopped answering the relay at {RELAY}: {STOPPED}; ranks behind it unheard: decode-0/TP0",
        f"1 ranks alive, need 2 {behind}",
        f"no decode rank alive {behind}",
    ]
    assert (result.ranks_unheard, result.ranks_gone, result.ranks_alive) == (["decode-0/TP0"], [], 1)


def test_a_rank_short_of_the_cluster_names_the_registration_the_bootstrap_service_refused() -> None:
    """A decode rank whose registration the service refused is never listed: the check said only `no decode rank
    alive`, though the service had said why (`status` showed it, `check` did not)."""
    now = time.time()
    model = ClusterModel()
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 1, now, []), now)
    why = "decode-0/TP0: 'tcp://10.77.0.2:5000' is not the registering client's address 10.77.0.1 (from 10.77.0.1)"
    model.intake.bootstrap_refused = [why]
    model.intake.bootstrap_refusals = [Refused(why, "decode", now - 1)]

    result = evaluate(model, Thresholds(), now, whole_cluster=True)

    assert result.verdict is Verdict.CRITICAL
    assert result.problems == [f"no decode rank alive; the bootstrap service refused {why}, 1s ago"]


def test_a_shortfall_names_no_refusal_that_cannot_explain_it() -> None:
    """`no decode rank alive` named the service's latest refusal whatever it was: a prefill rank's refused a second
    ago, or a decode rank's an hour ago, read as why no decode rank is alive. Only a recent one of that role is."""
    now = time.time()
    model = ClusterModel()
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 1, now, []), now)
    old = "decode-0/TP0: registered from 10.0.0.9, but incarnation 7 from 10.0.0.3 holds it live (from 10.0.0.9)"
    other = "prefill-1/TP0: registered from 10.0.0.9, but incarnation 8 from 10.0.0.4 holds it live (from 10.0.0.9)"
    model.intake.bootstrap_refused = [old, other]
    model.intake.bootstrap_refusals = [Refused(old, "decode", now - 3600), Refused(other, "prefill", now - 1)]

    result = evaluate(model, Thresholds(), now, whole_cluster=True)

    assert result.problems == ["no decode rank alive"]
    short = evaluate(model, Thresholds(min_ranks=2), now, whole_cluster=True)  # any role's refusal, but recent
    assert short.problems[0] == f"1 ranks alive, need 2; the bootstrap service refused {other}, 1s ago"
