"""A rank whose clock is an hour off: its offset is estimated from its envelopes, shown, and its times corrected.

The real test runs that rank under libfaketime (Debian's `faketime`, which `.ci/run` installs): its events and
envelopes carry a clock an hour ahead, as a host whose NTP stopped does. Without correction every room it
echoed split in two groups (one "origin never seen") and the windows misplaced its rooms.
"""

from __future__ import annotations

import glob
import re
from dataclasses import replace
from pathlib import Path

import pytest
from kvtop_cli import kvtop

from kvtop.model.clock import SAMPLES, SKEWED_S, ClockEstimate
from kvtop.model.cluster import ClusterModel
from kvtop.sources.live import Collector
from kvtop.views.check import Thresholds, Verdict, evaluate
from tests.conftest import wait_for
from tests.transport.test_cluster_faults import EVERY_RANK, clients_of, cluster_spec, results_of, submit
from transport import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, Snapshot

FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "")
HOUR = 3600.0
SKEWED = "prefill-0/TP1"
ROOMS = (0x5EED_0000_0000_0001, 0x5EED_0000_0000_0002, 0x5EED_0000_0000_0003)


def test_the_estimate_is_the_largest_difference_of_recent_envelopes_and_corrects_only_past_the_bound():
    clock = ClockEstimate()
    assert (clock.offset_s, clock.correction_s) == (0.0, 0.0)
    for delay in (0.3, 0.01, 2.5):  # a clock 1 h ahead, envelopes that took 10 ms to 2.5 s
        clock.sample(1000.0 + HOUR, 1000.0 + delay)
    assert clock.offset_s == pytest.approx(HOUR - 0.01)
    assert clock.correction_s == clock.offset_s

    close = ClockEstimate()
    close.sample(1000.5, 1000.0)  # half a second: NTP's business, left alone
    assert (close.offset_s, close.correction_s) == (0.5, 0.0)

    for _ in range(SAMPLES):  # the clock was stepped back: the window forgets the old offset
        clock.sample(2000.0, 2000.0 + 0.02)
    assert abs(clock.offset_s) < SKEWED_S and clock.correction_s == 0.0


def test_a_skewed_ranks_echo_joins_its_rooms_origin_in_the_model():
    """Envelopes and events on a clock an hour ahead are moved onto the collector's before the fold."""
    model = ClusterModel()
    model.correct_clocks = True  # as the live collector's
    now = 1_800_000_000.0
    origin = Failure(now - 1, 7, "decode-0/TP0", "checksum", "checksum", "error", False, "decode-0/TP0", SKEWED)
    echo = Failure(now - 1 + HOUR, 7, SKEWED, "from another rank", "other", "debug", True, "decode-0/TP0")
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, now - 0.01, [origin]), now)
    model.apply(SKEWED, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 1, 1, 1, now + HOUR - 0.01, [echo]), now)

    groups = model.groups(now, 60)
    assert [(g.room, g.title, g.echo_count) for g in groups] == [(7, "decode-0/TP0 checksum", 1)]
    assert model.skewed_clocks() == {SKEWED: pytest.approx(HOUR - 0.01)}
    assert model.ranks["decode-0/TP0"].clock.correction_s == 0.0


@pytest.mark.skipif(not FAKETIME, reason="libfaketime is not installed (Debian's faketime; .ci/run installs it)")
def test_a_rank_an_hour_ahead_is_shown_warned_of_and_its_echoes_fold_under_their_origins(
    make_cluster, control, tmp_path: Path
):
    environment = {SKEWED: {"LD_PRELOAD": FAKETIME, "FAKETIME": f"+{HOUR:.0f}", "DONT_FAKE_MONOTONIC": "1"}}
    cluster = make_cluster(replace(cluster_spec(tmp_path, {SKEWED: "corrupt:1"}), environment=environment))
    cluster.wait_registered(len(EVERY_RANK), 20)
    clients = clients_of(cluster, control, EVERY_RANK)
    for room in ROOMS:
        submit(clients, room)
        assert {result.state for result in results_of(clients, room).values()} == {KVPoll.Failed}

    collector = Collector(cluster.endpoint).start()
    try:

        def folded() -> list[tuple[int, str, int]] | None:
            """Each room's group, once every rank's failure of it arrived (its origin and 3 echoes)."""
            with collector.lock:
                groups = sorted((g.room, g.title, g.echo_count) for g in collector.model.groups())
            echoes = sum(count + 1 for _, _, count in groups)
            return groups if echoes == len(ROOMS) * len(EVERY_RANK) else None

        groups = wait_for(folded, 20, "every rank's failure of every room")
        with collector.lock:
            skewed = collector.model.skewed_clocks()
            result = evaluate(collector.model, Thresholds())
        assert [room for room, _, _ in groups] == sorted(ROOMS)  # one group a room: no "origin never seen" half
        assert all(title.startswith("decode-0/") and count == 3 for _, title, count in groups)
        assert list(skewed) == [SKEWED] and abs(skewed[SKEWED] - HOUR) < 5
        assert result.verdict is Verdict.CRITICAL
        said = re.search(rf"clocks off \(times corrected\): {SKEWED} \+(\d+\.\d)s", result.summary)
        assert said and abs(float(said[1]) - HOUR) < 5, result.summary  # +3599.8s where delivery lagged
    finally:
        collector.close()
    ranks = kvtop("ranks", "--bootstrap", cluster.endpoint)
    assert f"clock   {SKEWED} is 3" in ranks.stdout and "s ahead of this collector's" in ranks.stdout


def test_a_snapshot_asked_again_of_a_skewed_rank_adds_nothing_the_model_holds():
    """After a gap the snapshot's records are put on the collector's clock before they are matched with what the
    model holds: the failure it already took is not counted twice."""
    model = ClusterModel()
    model.correct_clocks = True
    now = 1_800_000_000.0
    echo = Failure(now - 1 + HOUR, 7, SKEWED, "from another rank", "other", "debug", True, "decode-0/TP0")
    model.apply(SKEWED, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 1, 1, 1, now + HOUR - 0.01, [echo]), now)
    again = Snapshot(1, EVENT_SCHEMA, 1, 5, None, None, [], [], [echo], sent_at=now + HOUR + 0.99)
    model.apply(SKEWED, again, now + 1)

    assert [(f.rank, f.ts) for f in model.failures] == [(SKEWED, pytest.approx(now - 1, abs=0.05))]
