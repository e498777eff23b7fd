"""The model's failure and throughput timeline: fixed buckets, origins apart from echoes, bounded memory."""

from __future__ import annotations

import numpy as np

from kvtop.model.cluster import ClusterModel
from kvtop.model.timeline import BUCKET_S, BUCKETS, BYTES, ECHOES, ORIGINS, Timeline
from kvtop.record import keyframes
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.tables import ranks_json
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure

START = 1_780_000_000.0


def test_values_land_in_their_bucket_and_the_series_ends_at_now():
    timeline = Timeline()
    timeline.add_one(START + 1.0, ORIGINS)
    timeline.add_one(START + 2.0, ECHOES, 3)
    timeline.add(np.array([START + 7.0, START + 8.0]), np.array([100.0, 50.0]), BYTES)
    series = timeline.series(START + 9.0)
    assert series.shape == (BUCKETS, 3)
    assert series[-1].tolist() == [0.0, 0.0, 150.0]  # START + 5 .. START + 10: the bucket of now
    assert series[-2].tolist() == [1.0, 3.0, 0.0]
    assert series[:-2].sum() == 0


def test_a_bucket_is_reused_once_its_time_left_the_window():
    timeline = Timeline()
    timeline.add_one(START, ORIGINS)
    later = START + BUCKETS * BUCKET_S  # the same slot, a window later
    timeline.add_one(later, ECHOES)
    series = timeline.series(later)
    assert series[:, ORIGINS].sum() == 0
    assert series[-1, ECHOES] == 1
    timeline.add_one(START, ORIGINS)  # older than the window: dropped, the newer bucket kept
    assert timeline.series(later)[:, ORIGINS].sum() == 0
    assert len(timeline.ids) == BUCKETS


def test_the_model_counts_origins_and_echoes_apart_and_the_bytes_of_decode_transfers():
    cluster = SyntheticCluster(prefill=1, decode=1, tp=2, start=START, failure_rate=0.5, open_rate=0.0, seed=3)
    model = ClusterModel()
    for label, batch in cluster.hello() + cluster.rooms(200):
        model.apply(label, batch, START + 3.0)
    series = model.timeline.series(START + 3.0)
    origins = sum(view.origins for view in model.ranks.values())
    echoes = sum(view.echoes for view in model.ranks.values())
    assert origins and echoes
    assert series[:, ORIGINS].sum() == origins
    assert series[:, ECHOES].sum() == echoes
    model.transfers.flush()  # bytes reach the timeline as the ring writes its rows
    after = model.timeline.series(START + 3.0)
    assert after[:, BYTES].sum() == model.transfers.window(0.0)[:, 1].sum() > 0
    for view in model.ranks.values():
        rank = view.timeline.series(START + 3.0)
        assert rank[:, ORIGINS].sum() == view.origins
        assert rank[:, ECHOES].sum() == view.echoes


def test_a_keyframe_keeps_the_timelines():
    cluster = SyntheticCluster(prefill=1, decode=1, tp=2, start=START, failure_rate=0.3, seed=4)
    model = ClusterModel()
    for label, batch in cluster.hello() + cluster.rooms(100):
        model.apply(label, batch, START + 2.0)
    restored = keyframes.restore(keyframes.capture(model))
    assert np.array_equal(restored.timeline.series(START + 2.0), model.timeline.series(START + 2.0))
    for label, view in model.ranks.items():
        assert np.array_equal(restored.ranks[label].timeline.series(START + 2.0), view.timeline.series(START + 2.0))
    more = cluster.rooms(50, first=100)
    for label, batch in more:  # the restored ring still feeds the restored timeline
        model.apply(label, batch, START + 3.0)
        restored.apply(label, batch, START + 3.0)
    model.transfers.flush()
    restored.transfers.flush()
    assert np.array_equal(restored.timeline.series(START + 3.0), model.timeline.series(START + 3.0))


def test_values_over_several_buckets_at_once_land_each_in_its_own():
    one_bucket, spread = Timeline(), Timeline()
    ts = np.array([START + 1.0, START + 2.0, START + 6.0, START + 12.0])
    amounts = np.array([1.0, 2.0, 4.0, 8.0])
    spread.add(ts, amounts, BYTES)
    for at, amount in zip(ts, amounts, strict=True):
        one_bucket.add(np.array([at]), np.array([amount]), BYTES)
    assert spread.series(START + 12.0)[-3:, BYTES].tolist() == [3.0, 4.0, 8.0]
    assert np.array_equal(spread.series(START + 12.0), one_bucket.series(START + 12.0))


def test_a_failure_the_fold_makes_an_echo_is_counted_as_one_by_its_rank_and_the_timelines():
    """Two ranks of one decode instance time out on one room half a second apart, each naming itself: one
    failure (the fold's rule 2). The ranks' counts, the table and the charts say one origin, as the failures
    view does; a keyframe keeps that, and the restored model does not move the count twice."""
    model = ClusterModel()
    for seq, (label, ts) in enumerate((("decode-0/TP0", START), ("decode-0/TP1", START + 0.5)), start=1):
        failure = Failure(ts, 9, label, "timed out", "timeout_transfer", "error", False, label)
        model.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", seq - 1, 1, 1, START, [failure]), START + 1)

    assert [(g.origin_label, g.echo_count) for g in model.groups()] == [("decode-0/TP0", 1)]
    for counted in (model, keyframes.restore(keyframes.capture(model))):
        counted.refold()
        rows = {row["label"]: (row["origins"], row["echoes"]) for row in ranks_json(counted, START + 1)}
        assert rows == {"decode-0/TP0": (1, 0), "decode-0/TP1": (0, 1)}
        series = counted.timeline.series(START + 1)
        assert (series[:, ORIGINS].sum(), series[:, ECHOES].sum()) == (1, 1)
        tp1 = counted.ranks["decode-0/TP1"].timeline.series(START + 1)
        assert (tp1[:, ORIGINS].sum(), tp1[:, ECHOES].sum()) == (0, 1)
