"""The exporter's metric contract on a fixed model, and counters that never go down while the model forgets.

Like dcgm-exporter's metric contract tests: /metrics is parsed by prometheus_client's own parsers (the
Prometheus text format and OpenMetrics, which Prometheus asks for), and every family's type, label names
and values are checked against the table below. A family added or renamed must be added here (and to the
docs/export.md's table).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
from collections import deque
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from kvtop.export import GRAFANA_DASHBOARD
from kvtop.export.carry import Carried
from kvtop.export.metrics import ModelMetrics
from kvtop.export.tally import FailureTally
from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import Observed
from kvtop.model.histogram import HELD_KEPT, DurationHistogram
from kvtop.model.intake import Refused
from kvtop.model.shapes import Liveness
from kvtop.sources.sglang import load
from kvtop.sources.synthetic import SyntheticCluster
from transport.kvpoll import KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    LogContext,
    RoomState,
)
from transport.wire import LOG_SIDECAR, AgentInfo

RANK = {"engine_type", "pd_instance", "tp_rank", "pp_rank", "dp_rank"}
LINK = {"prefill_instance", "decode_instance"}
FAILURE = {"engine_type", "pd_instance", "reason_class"}
CONTRACT: dict[str, tuple[str, set[str]]] = {
    "kvtop_exporter_info": ("gauge", {"version", "source"}),
    "kvtop_source_up": ("gauge", set()),
    "kvtop_failure_origins": ("counter", FAILURE),
    "kvtop_failure_echoes": ("counter", FAILURE),
    "kvtop_client_aborts": ("counter", {"engine_type", "pd_instance"}),
    "kvtop_client_abort_echoes": ("counter", {"engine_type", "pd_instance"}),
    "kvtop_failures_unfolded": ("counter", set()),
    "kvtop_incidents_ongoing": ("gauge", {"reason_class", "suspect_kind"}),
    "kvtop_incidents_started": ("counter", {"kind", "suspect_kind"}),
    "kvtop_rooms_finished": ("counter", {"outcome"}),
    "kvtop_rooms_open": ("gauge", set()),
    "kvtop_rooms_stuck": ("gauge", set()),
    "kvtop_link_transferred_bytes": ("counter", LINK),
    "kvtop_link_transfers": ("counter", LINK),
    "kvtop_link_failed_rooms": ("counter", LINK),
    "kvtop_transfer_duration_seconds": ("histogram", LINK),
    "kvtop_ranks": ("gauge", {"state"}),
    "kvtop_rank_info": ("gauge", RANK | {"host", "pid", "incarnation"}),
    "kvtop_rank_state": ("gauge", RANK | {"state"}),
    "kvtop_rank_last_seen_timestamp_seconds": ("gauge", RANK),
    "kvtop_rank_inflight_rooms": ("gauge", RANK),
    "kvtop_rank_crash_timestamp_seconds": ("gauge", RANK),
    "kvtop_rank_frames_rejected": ("counter", RANK | {"socket", "reason"}),
    "kvtop_ranks_unlisted": ("gauge", set()),
    "kvtop_rank_unlisted": ("gauge", RANK),
    "kvtop_bootstrap_refusals": ("gauge", {"engine_type"}),
    "kvtop_event_gaps": ("counter", set()),
    "kvtop_events_rejected": ("counter", set()),
    "kvtop_frames_rejected": ("counter", {"reason"}),
    "kvtop_deliveries_failed": ("counter", set()),
    "kvtop_scrape_duration_seconds": ("gauge", set()),
    "kvtop_scrape_lock_seconds": ("gauge", set()),
}
MAY_BE_EMPTY = {"kvtop_frames_rejected"}
"""Families with no series on the fixed model (the collector refused no frame: it never ran)."""

ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts"
CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2, failure_rate=0.1)
ROOMS = 400
NOW = CLUSTER.start + ROOMS * CLUSTER.spacing_s + 2.0
CRASHED_AT = NOW - 2.5


def _abort(ts: float, room: int, rank: str) -> Failure:
    return Failure(ts, room, rank, "Aborted by AbortReq.", "aborted", "warning", False, rank)


def fixed_model() -> ClusterModel:
    """400 synthetic rooms (some failed, some open and stalled, most retired), a client's abort seen by two
    ranks, a rank whose sockets rejected frames, and one whose log said its scheduler crashed."""
    model = ClusterModel()
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, CLUSTER.start)
    for first in range(0, ROOMS, 100):
        for label, batch in CLUSTER.rooms(100, first):
            model.apply(label, batch, CLUSTER.start + (first + 100) * CLUSTER.spacing_s)
    ts = NOW - 3.0
    heartbeat = Heartbeat(ts, {}, 2, 0, 1.0, 1 << 20, 10.0, rejected={"control": {"malformed": 3, "oversize": 1}})
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 50, ts, [heartbeat]), ts)
    for label in ("prefill-1/TP0", "prefill-1/TP1"):
        instance, _, rank = label.rpartition("/TP")
        batch = EventBatch(EVENT_SCHEMA, "prefill", instance, int(rank), 1, 51, ts, [_abort(ts, 77, label)])
        model.apply(label, batch, ts)
    crash = LogContext(CRASHED_AT, "crash", None, "Scheduler hit an exception: KeyError: 77, in x.py:1 f", 1)
    model.apply("decode-1/TP1", EventBatch(EVENT_SCHEMA, "decode", "decode-1", 1, 1, 52, ts, [crash]), ts)
    model.sweep(NOW)
    return model


def scrape(metrics: ModelMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def exposition() -> str:
    return scrape(ModelMetrics(fixed_model(), threading.Lock(), lambda: NOW, source="bootstrap"))


def test_every_family_has_its_contracted_type_and_label_names(exposition):
    """Each family /metrics serves is in the contract, with its type, and each of its samples has its label names."""
    families = {family.name: family for family in text_string_to_metric_families(exposition)}

    assert set(families) == set(CONTRACT)
    for name, family in families.items():
        kind, labels = CONTRACT[name]
        assert (name, family.type) == (name, kind)
        assert family.samples or name in MAY_BE_EMPTY, f"{name} has no series on the fixed model"
        for sample in family.samples:
            extra = {"le"} if sample.name.endswith("_bucket") else set()
            assert (sample.name, set(sample.labels)) == (sample.name, labels | extra)


def test_every_value_is_a_finite_non_negative_number_and_names_follow_prometheus_rules(exposition):
    """kvtop_ prefix, _total on every counter sample, _info on identities, ratios 0-1; no room, no `instance`."""
    for family in text_string_to_metric_families(exposition):
        assert family.name.startswith("kvtop_")
        for sample in family.samples:
            assert math.isfinite(sample.value) and sample.value >= 0, sample
            assert not {"room", "instance", "job"} & set(sample.labels), sample
            if family.type == "counter":
                assert sample.name == f"{family.name}_total"
            if family.name.endswith("_info"):
                assert sample.value == 1
            if family.name.endswith("_ratio"):
                assert sample.value <= 1


def test_incidents_ongoing_and_started_are_the_models_by_class_and_suspect_kind(exposition):
    """The synthetic cluster's corrupting senders, every rank of each prefill instance, are ongoing incidents of class
    checksum and suspect kind instance (one an instance: what broke); the client's abort one of kind client; every
    incident kept was started."""
    model = fixed_model()
    families = {family.name: family for family in text_string_to_metric_families(exposition)}

    ongoing = {
        (s.labels["reason_class"], s.labels["suspect_kind"]): s.value
        for s in families["kvtop_incidents_ongoing"].samples
    }
    started = {
        (s.labels["kind"], s.labels["suspect_kind"]): s.value for s in families["kvtop_incidents_started"].samples
    }
    kept = [i for i in model.incidents.incidents.values() if i.ongoing(NOW)]
    assert ongoing == {
        ("checksum", "instance"): sum(i.reason_class == "checksum" for i in kept),
        ("aborted", "client"): 1,
    }
    assert ongoing[("checksum", "instance")] == 2
    assert started == {key: float(n) for key, n in model.incidents.started.items()}  # a rank's start taken back: 0


def test_the_exposition_is_valid_openmetrics(exposition):
    """What Prometheus asks for (OpenMetrics) parses with the strict parser, into the same families."""
    metrics = ModelMetrics(fixed_model(), threading.Lock(), lambda: NOW)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)

    parsed = {family.name: family.type for family in parse_openmetrics(generate_openmetrics(registry).decode())}

    assert parsed == {
        name.removesuffix("_info"): "info" if name.endswith("_info") else kind for name, (kind, _) in CONTRACT.items()
    }


def samples(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    }


def test_origins_echoes_and_aborts_count_each_failure_once_as_the_fold_does(exposition):
    """Origins are the fold's non-abort groups, echoes their members; the abort seen by two ranks is one abort."""
    model = fixed_model()
    groups = model.groups()
    faults = [group for group in groups if not group.aborted]

    assert sum(samples(exposition, "kvtop_failure_origins_total").values()) == len(faults)
    assert sum(samples(exposition, "kvtop_failure_echoes_total").values()) == sum(g.echo_count for g in faults)
    aborts = samples(exposition, "kvtop_client_aborts_total")
    assert aborts == {(("engine_type", "prefill"), ("pd_instance", "prefill-1")): 1.0}
    assert sum(samples(exposition, "kvtop_client_abort_echoes_total").values()) == 1
    assert len(faults) > 10 and all(g.origin and g.origin.reason_class == "checksum" for g in faults)


def test_rooms_ranks_links_and_the_histogram_read_what_the_model_holds(exposition):
    """Retired rooms by outcome, one state per rank, link bytes, and cumulative buckets ending at the count."""
    model = fixed_model()
    finished = samples(exposition, "kvtop_rooms_finished_total")
    outcomes = {dict(labels)["outcome"]: value for labels, value in finished.items()}
    assert outcomes == {**model.retired_outcomes, "lost": 0}
    assert outcomes["succeeded"] > 0 and outcomes["failed"] > 0
    assert samples(exposition, "kvtop_rooms_stuck")[()] == len(model.stuck(NOW, 10.0)) > 0
    assert samples(exposition, "kvtop_rooms_open")[()] == len(model.open_rooms(NOW)) > 0

    states = samples(exposition, "kvtop_rank_state")
    per_rank: dict[tuple[str, str, str], float] = {}
    for labels, value in states.items():
        rank = dict(labels)
        key = (rank["engine_type"], rank["pd_instance"], rank["tp_rank"])
        per_rank[key] = per_rank.get(key, 0.0) + value
    assert per_rank == {key: 1.0 for key in per_rank} and len(per_rank) == 8

    link_bytes = samples(exposition, "kvtop_link_transferred_bytes_total")
    assert sum(link_bytes.values()) == sum(link.nbytes for link in model.links.values()) > 0
    for labels, count in samples(exposition, "kvtop_transfer_duration_seconds_count").items():
        buckets = sorted(
            (float(dict(b)["le"]), v)
            for b, v in samples(exposition, "kvtop_transfer_duration_seconds_bucket").items()
            if {k: v for k, v in b if k != "le"} == dict(labels)
        )
        assert [v for _, v in buckets] == sorted(v for _, v in buckets) and buckets[-1] == (math.inf, count)

    rejected = samples(exposition, "kvtop_rank_frames_rejected_total")
    assert sorted(rejected.values()) == [1.0, 3.0]


def test_open_and_stuck_rooms_are_judged_as_the_views_judge_them_when_ranks_are_gone():
    """Six of eight ranks silent past GONE_S: open and stuck rooms are counted as `kvtop status` counts them."""
    model = fixed_model()
    later = NOW + 30.0
    decode = [label for label in model.ranks if label.startswith("decode-0")]
    ts = later - 1.0
    for label in decode:  # decode-0 is alive again; every other rank is gone
        instance, _, rank = label.rpartition("/TP")
        beat = Heartbeat(ts, {}, 0, 0, 1.0, 1 << 20, 10.0)
        model.apply(label, EventBatch(EVENT_SCHEMA, "decode", instance, int(rank), 1, 60, ts, [beat]), ts)
    served = scrape(ModelMetrics(model, threading.Lock(), lambda: later))

    assert samples(served, "kvtop_rooms_open")[()] == len(model.open_rooms(later)) > 0
    assert samples(served, "kvtop_rooms_stuck")[()] == len(model.stuck(later, 10.0))
    assert sum(v for k, v in samples(served, "kvtop_rank_state").items() if ("state", "gone") in k) == 6


def test_counters_never_go_down_while_the_model_forgets_failures_and_rooms():
    """With a 20-failure window, every counter of every scrape is at least the last one, and the origins
    counted are every failed room ever fed (the model itself remembers 20 failures)."""
    cluster = SyntheticCluster(prefill=1, decode=1, tp=2, failure_rate=0.5, open_rate=0.0)
    model = ClusterModel()
    model.failures = deque(maxlen=20)
    metrics = ModelMetrics(model, threading.Lock(), lambda: now)
    now = cluster.start
    for label, batch in cluster.hello():
        model.apply(label, batch, now)
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    origins_fed = 0
    for first in range(0, 200, 4):
        now = cluster.start + (first + 4) * cluster.spacing_s
        for label, batch in cluster.rooms(4, first):
            model.apply(label, batch, now)
            origins_fed += sum(isinstance(e, Failure) and e.origin == e.rank for e in batch.events)
        model.sweep(now + 2.0)
        exposition = scrape(metrics)
        for family in text_string_to_metric_families(exposition):
            if family.type not in ("counter", "histogram"):
                continue
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                assert sample.value >= last.get(key, 0.0), key
                last[key] = sample.value

    assert model.failures_total > 10 * len(model.failures)
    assert sum(samples(exposition, "kvtop_failure_origins_total").values()) == origins_fed
    assert samples(exposition, "kvtop_failures_unfolded_total")[()] == 0


def test_an_incident_taken_in_by_its_ranks_incident_is_one_start_before_and_after():
    """A scrape counts decode-0's incident (prefill timed out its room); then decode-0/TP1 loses decode-0/TP0, whose
    incident takes that one in: still one incident started, the same series, never two and never down."""
    model = ClusterModel()
    now = 100.0
    metrics = ModelMetrics(model, threading.Lock(), lambda: now)

    def deliver(label: str, events: list[Event], ts: float) -> None:
        instance, _, rank = label.rpartition("/TP")
        model.apply(label, EventBatch(EVENT_SCHEMA, label.split("-")[0], instance, int(rank), 1, ts, ts, events), ts)

    deliver("decode-0/TP0", [RoomState(now, 1, int(KVPoll.WaitingForInput), 1, "prefill-0")], now)
    deliver("prefill-0/TP0", [Heartbeat(now, {}, 0, 0, 0.0, 0, 0.0)], now)
    timeout = Failure(now + 2, 1, "prefill-0/TP0", "Request 1 timed out after 10.0s in KVPoll.Bootstrapping",
                      "timeout_bootstrap", "warning", False, "prefill-0/TP0")  # fmt: skip
    deliver("prefill-0/TP0", [timeout], now + 2)
    model.sweep(now + 2.5)
    before = samples(scrape(metrics), "kvtop_incidents_started_total")
    lost = Failure(now + 5, 2, "decode-0/TP1", "Lost connection with rank decode-0/TP0 of this instance", "peer_lost",
                   "error", False, "decode-0/TP1", "decode-0/TP0")  # fmt: skip
    deliver("decode-0/TP1", [lost], now + 5)
    deliver("prefill-0/TP0", [Heartbeat(now + 5, {}, 0, 0, 0.0, 0, 0.0)], now + 5)
    now += 6
    model.sweep(now)
    after = samples(scrape(metrics), "kvtop_incidents_started_total")

    assert [i.suspect.text for i in model.incidents.incidents.values()] == ["decode-0/TP0"]
    assert before == {(("kind", "unresponsive"), ("suspect_kind", "instance")): 1.0}
    assert {labels: n for labels, n in after.items() if n} == before


def _failure(ts: float, room: int, rank: str, origin: str, reason_class: str = "checksum") -> Observed:
    role = rank.split("-")[0]
    return Observed(ts, room, rank, role, "KV chunk 3 failed its checksum", reason_class, origin, "error")


def test_an_origin_refolded_as_an_echo_of_an_earlier_one_stays_counted():
    """Two ranks of one instance, same class, arriving latest first: the second arrival becomes the origin and
    the first its echo; the origin count stays 1 (never 2, never down) and the echo is counted."""
    tally = FailureTally()
    tally.add([_failure(10.5, 1, "decode-0/TP1", "decode-0/TP1")])
    before = tally.totals()
    tally.add([_failure(10.0, 1, "decode-0/TP0", "decode-0/TP0")])
    after = tally.totals()

    assert before == {("origins", "decode", "decode-0", "checksum"): 1}
    assert after == {("origins", "decode", "decode-0", "checksum"): 1, ("echoes", "decode", "decode-0", "checksum"): 1}


def test_a_quiet_room_is_closed_and_its_counts_kept():
    """A room quiet for the reuse window leaves the tally's memory, its counts stay; past the bound too."""
    tally = FailureTally(failures_kept=2)
    tally.add([_failure(float(i), i, "decode-0/TP0", "decode-0/TP0") for i in range(5)])
    tally.add([_failure(500.0, 99, "decode-0/TP0", "decode-0/TP0")])

    assert tally.open_rooms == 1
    assert tally.totals() == {("origins", "decode", "decode-0", "checksum"): 6}


def test_a_room_that_fails_without_end_is_not_held_without_bound():
    """A room with more failures than the tally holds is closed (counted), not kept growing."""
    tally = FailureTally(failures_kept=10)
    tally.add([_failure(float(i), 7, f"decode-0/TP{i}", f"decode-0/TP{i}", "other") for i in range(25)])

    assert tally.open_rooms == 0
    assert sum(tally.totals().values()) == 25


def test_failures_forgotten_before_a_scrape_are_counted_as_unfolded():
    """More failures between two reads than the model keeps: the ones it forgot are named, not silently lost."""
    tally = FailureTally()

    assert tally.unread(total=100, kept=20) == 20
    assert (tally.missed, tally.unread(total=105, kept=20)) == (80, 5)


def test_a_rank_counter_that_restarts_with_a_new_incarnation_is_carried():
    """5 rejections in one incarnation and 2 in the next are 7; a key the new one has not reported keeps its count."""
    carried: Carried[str] = Carried()
    carried.update("malformed", 1, 5)
    carried.update("oversize", 1, 4)
    carried.update("malformed", 2, 2)

    assert carried.totals() == {"malformed": 7, "oversize": 4}


def served_names(family: str, kind: str) -> set[str]:
    """The sample names a family of the contract serves."""
    if kind == "counter":
        return {f"{family}_total"}
    if kind == "histogram":
        return {f"{family}_{part}" for part in ("bucket", "sum", "count")}
    return {family}


def test_the_grafana_dashboard_is_importable_json_built_on_the_contracted_names():
    """Valid JSON with uniquely numbered panels on a datasource variable; every metric its queries name is served."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    names = set().union(*(served_names(family, kind) for family, (kind, _) in CONTRACT.items()))
    panels = dashboard["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"kvtop_\w+", expr)}

    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    assert len({panel["id"] for panel in panels}) == len(panels) >= 6
    assert {"datasource", "job"} <= {variable["name"] for variable in dashboard["templating"]["list"]}
    assert all(panel["datasource"]["uid"] == "${datasource}" and panel["targets"] for panel in panels)
    assert queried <= names, queried - names
    assert {"kvtop_failure_origins_total", "kvtop_failure_echoes_total", "kvtop_rooms_stuck",
            "kvtop_link_transferred_bytes_total", "kvtop_transfer_duration_seconds_bucket",
            "kvtop_rank_state", "kvtop_incidents_ongoing", "kvtop_incidents_started_total"} <= queried  # fmt: skip


def test_the_duration_histogram_counts_each_value_in_the_first_bucket_at_or_above_it():
    """Prometheus's `le`: a value on a bound is in that bound's bucket; above every bound, only in +Inf;
    values held aside are counted by the next read, however many arrived."""
    histogram = DurationHistogram((0.001, 0.01))
    histogram.observe([0.001, 0.002])
    for _ in range(HELD_KEPT + 3):
        histogram.observe([100.0])

    buckets, total_s = histogram.read()

    assert buckets == [("0.001", 1), ("0.01", 2), ("+Inf", HELD_KEPT + 5)]
    assert total_s == pytest.approx(0.003 + 100.0 * (HELD_KEPT + 3))


def test_the_two_stages_of_a_tp_rank_are_two_series():
    """A server log's PP0 TP3 and PP1 TP3 had the same labels: two samples of one series, which a scrape refuses."""
    model = ClusterModel()
    for label, stage in (("prefill-0/TP3", None), ("prefill-0/PP1-TP3", 1)):
        model.log_rank(label, "prefill", "prefill-0", 3)
        batch = EventBatch(
            EVENT_SCHEMA, "prefill", "prefill-0", 3, 0, 1, NOW, [Heartbeat(NOW, {}, 2 + (stage or 0), 0, 0.0, 0, 0.0)]
        )
        model.apply(label, batch, NOW)

    inflight = samples(scrape(ModelMetrics(model, threading.Lock(), lambda: NOW)), "kvtop_rank_inflight_rooms")

    assert {(dict(labels)["pp_rank"], dict(labels)["tp_rank"]): value for labels, value in inflight.items()} == {
        ("0", "3"): 2.0,
        ("1", "3"): 3.0,
    }


def test_two_dp_replicas_tp0_are_two_series_and_a_rank_of_no_replica_has_an_empty_dp_rank():
    """Plain `--dp-size 2`: DP0 TP0 and DP1 TP0 (`prefill-0/DP1-TP0`) had the same labels, two samples of one series
    that a scrape refuses; a rank of no replica keeps the series it had (an empty label is none to Prometheus)."""
    model = ClusterModel()
    for label, inflight in (("prefill-0/DP0-TP0", 2), ("prefill-0/DP1-TP0", 3), ("decode-0/TP0", 4)):
        instance = label.partition("/")[0]
        model.log_rank(label, instance.partition("-")[0], instance, 0)
        batch = EventBatch(
            EVENT_SCHEMA, "prefill", instance, 0, 0, 1, NOW, [Heartbeat(NOW, {}, inflight, 0, 0.0, 0, 0.0)]
        )
        model.apply(label, batch, NOW)

    inflight = samples(scrape(ModelMetrics(model, threading.Lock(), lambda: NOW)), "kvtop_rank_inflight_rooms")

    assert {(dict(labels)["pd_instance"], dict(labels)["dp_rank"]): value for labels, value in inflight.items()} == {
        ("prefill-0", "0"): 2.0,
        ("prefill-0", "1"): 3.0,
        ("decode-0", ""): 4.0,
    }


def test_a_crashed_rank_has_the_time_of_its_crash_and_the_others_no_series(exposition):
    """`time() - kvtop_rank_crash_timestamp_seconds < 600` alerts on a scheduler that crashed in the last 10 min."""
    [family] = [f for f in text_string_to_metric_families(exposition) if f.name == "kvtop_rank_crash_timestamp_seconds"]

    assert [(sample.labels["pd_instance"], sample.labels["tp_rank"], sample.value) for sample in family.samples] == [
        ("decode-1", "1", CRASHED_AT)
    ]


def outcomes_of(exposition: str) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value for labels, value in samples(exposition, "kvtop_rooms_finished_total").items()
    }


def test_rooms_failed_and_aborted_in_logs_are_counted_and_succeeded_has_no_series():
    """On logs the failed rooms were 0 while `kvtop status` listed them; now they count as the views count them,
    and `succeeded` has no series (logs name no room that succeeded), so a failure rate is no data, not 100 %."""
    model = ClusterModel()
    load([ABORTS / "prefill.log", ABORTS / "decode.log"], model)
    now = max(failure.ts for failure in model.failures) + 1.0
    aborted_rooms = {group.room for group in model.groups() if group.aborted}

    served = outcomes_of(scrape(ModelMetrics(model, threading.Lock(), lambda: now, source="sglang-log")))

    assert served == {"failed": model.rooms_failed(now, 3600.0), "aborted": len(aborted_rooms), "lost": 0}
    assert served["failed"] > 0 and served["aborted"] > 0


def test_a_logged_room_a_client_aborted_and_a_fault_then_failed_counts_failed_too():
    """A log rank's abort of a room, then a fault in it: counted aborted, then failed too (a counter never goes
    down); a fault then an abort stays failed alone."""
    model = ClusterModel()
    model.log_rank("decode-0/TP0", "decode", "decode-0", 0)
    fault = Failure(NOW, 0, "decode-0/TP0", "KV transfer failed", "other", "error", False, "decode-0/TP0")
    events = [_abort(NOW, 1, "decode-0/TP0"), msgspec.structs.replace(fault, room=1, ts=NOW + 1), fault,
              msgspec.structs.replace(_abort(NOW, 0, "decode-0/TP0"), ts=NOW + 1)]  # fmt: skip
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 0, 1, NOW, events), NOW)

    assert outcomes_of(scrape(ModelMetrics(model, threading.Lock(), lambda: NOW + 2))) == {
        "failed": 2,
        "aborted": 1,
        "lost": 0,
    }


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="no `promtool` (Debian's prometheus package, as .ci/run installs)")
@pytest.mark.processes
def test_grafana_s_failure_rate_counts_the_targets_that_see_successes_and_is_no_data_on_logs_alone(tmp_path):
    """The panel's query, run by promtool on a live target (9 rooms succeed for each that fails) beside a logs
    target (failed rooms, no succeeded series): the live target's 10 %, and no data for the logs target alone."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    [expr] = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"] if "failed / finished" in str(t)]
    rate = expr.replace("$__rate_interval", "5m")
    series = [("live", "succeeded", 90), ("live", "failed", 10), ("logs", "failed", 50)]
    test = {
        "rule_files": [],
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'kvtop_rooms_finished_total{{job="{job}",instance="{job}:9464",outcome="{outcome}"}}',
                 "values": f"0+{per_minute}x10"}
                for job, outcome, per_minute in series
            ],
            "promql_expr_test": [
                {"expr": rate.replace("$job", ".*"), "eval_time": "10m", "exp_samples": [{"labels": "{}",
                                                                                          "value": 0.1}]},
                {"expr": rate.replace("$job", "logs"), "eval_time": "10m", "exp_samples": []},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(json.dumps(test))  # JSON is YAML

    done = subprocess.run([PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)

    assert done.returncode == 0, done.stdout + done.stderr


def test_a_model_with_no_rank_serves_kvtop_ranks_0_in_every_state_not_nothing():
    """No rank known (a bootstrap that lists none): every per-rank family is empty, so `kvtop_ranks` is what an alert
    tells that by; the fixed model's ranks are counted by state."""
    empty = scrape(ModelMetrics(ClusterModel(), threading.Lock(), lambda: NOW, source="bootstrap"))
    model = fixed_model()
    served = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))

    assert samples(empty, "kvtop_ranks") == {(("state", str(state)),): 0.0 for state in Liveness}
    assert "kvtop_rank_state{" not in empty
    by_state = {dict(key)["state"]: value for key, value in samples(served, "kvtop_ranks").items()}
    assert sum(by_state.values()) == len(model.ranks) > 0


def test_an_unlisted_rank_and_the_bootstrap_s_recent_refusals_are_served_for_an_alert():
    """decode-0/TP0's heartbeat says the service refuses its refresh, and the service lists three refusals, one an
    hour old: `kvtop_ranks_unlisted` counts the rank (`kvtop_rank_unlisted` names it), `kvtop_bootstrap_refusals`
    counts the last minute's by role, prefill and decode always served (0 an alert can compare)."""
    model = fixed_model()
    before = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))
    why = "bootstrap tcp://10.0.0.1:7000 refused: registration of decode-0/TP0 refused: 10.0.0.3 holds it live"
    beat = Heartbeat(NOW - 1.0, {}, 0, 0, 1.0, 1 << 20, 10.0, registration=why)
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 60, NOW - 1.0, [beat]), NOW)
    model.intake.bootstrap_refusals = [
        Refused("decode-0/TP0: ... (from 10.0.0.9)", "decode", NOW - 5.0),
        Refused("decode-1/TP0: ... (from 10.0.0.8)", "decode", NOW - 3600.0),
        Refused("flood-9/TP0: ... (from 10.0.0.7)", "", NOW - 2.0),
    ]
    after = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))

    assert samples(before, "kvtop_ranks_unlisted") == {(): 0.0}
    assert samples(before, "kvtop_bootstrap_refusals") == {
        (("engine_type", "decode"),): 0.0,
        (("engine_type", "prefill"),): 0.0,
    }
    assert samples(after, "kvtop_ranks_unlisted") == {(): 1.0}
    unlisted = {dict(key)["pd_instance"] + "/" + dict(key)["tp_rank"]: value
                for key, value in samples(after, "kvtop_rank_unlisted").items()}  # fmt: skip
    assert {rank for rank, value in unlisted.items() if value} == {"decode-0/0"} and len(unlisted) == len(model.ranks)
    assert samples(after, "kvtop_bootstrap_refusals") == {
        (("engine_type", "decode"),): 1.0,
        (("engine_type", "prefill"),): 0.0,
        (("engine_type", "unknown"),): 1.0,
    }


def test_an_unlisted_rank_keeps_its_host_and_pid_after_the_listing_named_the_entry_that_took_its_label():
    """A rank heard (its hello: host, pid) whose entry another client took once it expired: the next listing named
    the taker's entry under its label (the view made anew as the taker's), then the rank's own heartbeat made it anew
    once more, with no hello: `kvtop_rank_info` said host="" pid="0" for a rank alive and heard."""
    own = AgentInfo("decode", "decode-9", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    taker = msgspec.structs.replace(own, data_endpoint="tcp://10.0.0.9:1", pid=1, host="elsewhere", incarnation=5)
    model = ClusterModel()
    hello = AgentHello(NOW - 9.0, own, "1.0", "tcp://10.0.0.3:3", "tcp://10.0.0.3:4")
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "decode", "decode-9", 0, 77, 1, NOW - 9.0, [hello]), NOW - 9.0)
    model.register(taker)
    why = "bootstrap tcp://10.0.0.1:7000 refused: registration of decode-9/TP0 refused: 10.0.0.9 holds it live"
    beat = Heartbeat(NOW - 1.0, {}, 0, 0, 1.0, 1 << 20, 10.0, registration=why)
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "decode", "decode-9", 0, 77, 2, NOW - 1.0, [beat]), NOW - 1.0)

    exposition = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))

    (info,) = [dict(key) for key in samples(exposition, "kvtop_rank_info") if ("pd_instance", "decode-9") in key]
    assert (info["host"], info["pid"], info["incarnation"]) == ("node-3", "4321", "77")
    assert samples(exposition, "kvtop_ranks_unlisted") == {(): 1.0}


def _beside_agents(model: ClusterModel, room: int, logged_at: float, agents_end: float) -> None:
    """Room `room` held by two agents (prefill-0/TP0, decode-0/TP0) that fail it at `agents_end`, and a log sidecar
    (`sglang-decode/TP0`, the SGLang server of a cluster that also runs our agents) whose line fails it at
    `logged_at`."""
    model.register(AgentInfo("decode", "sglang-decode", 0, 1, 0, "", "", 42, "node-1", 7, kind=LOG_SIDECAR))
    fault = Failure(agents_end, room, "decode-0/TP0", "KV transfer failed", "other", "error", False, "decode-0/TP0")
    logged = Failure(logged_at, room, "sglang-decode/TP0", "Decode transfer failed", "other", "error", False,
                     "sglang-decode/TP0")  # fmt: skip
    batches = [
        (NOW, "prefill-0/TP0", [RoomState(NOW, room, KVPoll.Transferring, KVPoll.WaitingForInput)]),
        (NOW, "decode-0/TP0", [RoomState(NOW, room, KVPoll.Transferring, KVPoll.WaitingForInput, "prefill-0")]),
        (logged_at, "sglang-decode/TP0", [logged]),
        (agents_end, "prefill-0/TP0", [RoomState(agents_end, room, KVPoll.Failed, KVPoll.Transferring)]),
        (agents_end, "decode-0/TP0", [fault, RoomState(agents_end, room, KVPoll.Failed, KVPoll.Transferring)]),
    ]
    for at, label, events in sorted(batches, key=lambda batch: batch[0]):
        instance, _, rank = label.rpartition("/TP")
        role = "prefill" if instance.startswith("prefill") else "decode"
        incarnation = 7 if label.startswith("sglang") else 1
        model.sweep(at)  # the collector sweeps every 0.5 s: a room the agents ended 5 s before is retired
        model.apply(label, EventBatch(EVENT_SCHEMA, role, instance, int(rank), incarnation, 1, at, events), at)


@pytest.mark.parametrize("logged_after_s", [-1.0, 5.0])
def test_a_room_an_agent_and_a_sidecar_both_fail_is_one_finished_room(logged_after_s: float):
    """A sidecar's line failing a room our agents hold counted it failed on arrival, and the agents' end counted it
    again: 2 failed rooms for one. Now the log's failure is one more rank's state in the agents' room, whether it
    comes while they hold it open or after they retired it (it moved the room off the agents' link to one the log's
    instance made): one room, one finish, in the counter, in status and on its link."""
    model = ClusterModel()
    agents_end = NOW + 2.0
    _beside_agents(model, 9, agents_end + logged_after_s, agents_end)
    model.sweep(agents_end + 10.0)
    now = agents_end + 10.0

    assert model.ranks["sglang-decode/TP0"].inferred
    assert outcomes_of(scrape(ModelMetrics(model, threading.Lock(), lambda: now))) == {
        "succeeded": 0,
        "failed": 1,
        "aborted": 0,
        "lost": 0,
    }
    assert (model.rooms_failed(now, 60.0), list(model.finished)) == (1, [9])
    assert model.failed_rooms_by_link() == {("prefill-0", "decode-0"): 1}  # the agents' link, not one the log made
    assert model.finished[9].view is not None and model.finished[9].view.codes["sglang-decode/TP0"] == KVPoll.Failed


def test_control_characters_in_label_values_are_written_as_their_escapes():
    """A log's instance name and the source holding ESC and BEL reached `curl /metrics` raw: a terminal showing the
    scrape ran them (a window title set, the screen cleared). They are escaped as the views escape them."""
    model = ClusterModel()
    instance = "evil\x1b]0;owned\x07\u202e"
    model.log_rank(f"{instance}/TP0", "prefill", instance, 0)
    batch = EventBatch(EVENT_SCHEMA, "prefill", instance, 0, 0, 1, NOW, [Heartbeat(NOW, {}, 2, 0, 0.0, 0, 0.0)])
    model.apply(f"{instance}/TP0", batch, NOW)

    text = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="logs\x1b[2J"))

    assert text.isascii() and not re.search("[\x00-\x09\x0b-\x1f\x7f]", text)
    assert 'pd_instance="evil\\\\x1b]0;owned\\\\x07\\\\u202e"' in text
    assert 'source="logs\\\\x1b[2J"' in text


def test_a_rank_heard_as_taken_is_served_apart_from_the_taker_under_its_label():
    """The taker and the rank it took the entry from publish under one label: the rank, heard as `~taken`, is
    served with `pd_instance` `decode-0~taken` (the same label set twice is one series a scrape refuses)."""
    model = fixed_model()
    beat = Heartbeat(NOW - 1.0, {}, 0, 0, 1.0, 1 << 20, 10.0, registration="refused: ... holds it live")
    model.apply("decode-0/TP0~taken", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 9, 1, NOW - 1.0, [beat]), NOW)

    served = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))

    states = samples(served, "kvtop_rank_state")
    assert len(states) == len(model.ranks) * len(Liveness)
    instances = {dict(key)["pd_instance"] for key in samples(served, "kvtop_rank_unlisted")}
    assert {"decode-0", "decode-0~taken"} <= instances


def test_ranks_of_a_stage_and_a_replica_heard_as_taken_keep_their_stage_and_replica():
    """A sidecar's whole server claimed twice: its ranks of stage 1 and of replica 1 heard as taken were read from a
    label its suffix kept from parsing, served as stage 0 of no replica: `decode-0/PP1-TP0~taken` and
    `decode-0/DP1-TP0~taken` were the label set of `decode-0/TP0~taken`, one series a scrape refuses."""
    model = fixed_model()
    beat = Heartbeat(NOW - 1.0, {}, 0, 0, 1.0, 1 << 20, 10.0, registration="refused: ... holds it live")
    for label, pp, dp in (("decode-0/TP0~taken", None, None), ("decode-0/PP1-TP0~taken", 1, None),
                          ("decode-0/DP1-TP0~taken", None, 1)):  # fmt: skip
        model.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 9, 1, NOW - 1.0, [beat], pp, dp), NOW)

    served = scrape(ModelMetrics(model, threading.Lock(), lambda: NOW, source="bootstrap"))

    taken = [dict(key) for key in samples(served, "kvtop_rank_unlisted") if dict(key)["pd_instance"].endswith("~taken")]
    assert sorted((rank["pp_rank"], rank["dp_rank"]) for rank in taken) == [("0", ""), ("0", "1"), ("1", "")]


@pytest.mark.parametrize("scraped_between", [False, True], ids=["one-scrape", "a-scrape-between"])
def test_an_instance_whose_ranks_stopped_answering_is_counted_started_as_the_instance(scraped_between: bool):
    """prefill-1's two ranks stop answering seconds apart: one incident, `prefill-1 stopped answering`. It was counted
    under `rank` (its first rank's incident, taken in), so `increase(...{suspect_kind="instance"})` never saw a whole
    instance stop; it counts under `instance` now. A scrape that read the first rank's incident before the instance's
    formed keeps that count (a counter never goes down)."""
    model = ClusterModel()
    now = 100.0
    metrics = ModelMetrics(model, threading.Lock(), lambda: now)

    def stalled(ts: float, room: int, decode: str, prefill: str) -> None:
        timeout = Failure(ts, room, decode, f"Request {room} timed out after 3.0s in KVPoll.Transferring",
                          "timeout_transfer", "error", False, decode, prefill)  # fmt: skip
        for label in ("prefill-1/TP0", "prefill-1/TP1", "decode-0/TP0", "decode-0/TP1"):
            instance, _, rank = label.rpartition("/TP")
            events: list[Event] = [Heartbeat(ts, {}, 0, 0, 0.0, 0, 0.0)] + [timeout] * (label == decode)
            batch = EventBatch(EVENT_SCHEMA, label.split("-")[0], instance, int(rank), 1, ts, ts, events)
            model.apply(label, batch, ts)

    stalled(now + 1, 1, "decode-0/TP0", "prefill-1/TP0")
    model.sweep(now + 1.5)
    if scraped_between:
        scrape(metrics)
    stalled(now + 2, 2, "decode-0/TP1", "prefill-1/TP1")
    now += 3
    model.sweep(now)
    after = samples(scrape(metrics), "kvtop_incidents_started_total")

    assert [i.headline() for i in model.incidents.incidents.values()] == [
        "prefill-1 stopped answering (timeout_transfer)"
    ]
    assert {labels[1][1]: n for labels, n in after.items() if n} == (
        {"rank": 1.0, "instance": 1.0} if scraped_between else {"instance": 1.0}
    )
