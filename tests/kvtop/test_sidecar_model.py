"""A log sidecar's ranks in the model: failures folded as inferred, rooms made from failures, liveness."""

from __future__ import annotations

import pytest

from kvtop.model.cluster import CONTEXT_KEPT, ClusterModel
from kvtop.model.shapes import Liveness
from kvtop.sidecar.ranks import sidecar_info
from kvtop.sources.sglang.context import published_errors
from kvtop.views.check import Thresholds, evaluate
from kvtop.views.tables import ranks_json, ranks_text, status_json, status_text
from transport.kvpoll import KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    LogContext,
    LogFollowed,
    RoomState,
)
from transport.wire import rank_label

T = 1_800_000_000.0


def _batch(label: str, seq: int, events: list[Event]) -> EventBatch:
    instance, _, rank = label.rpartition("/TP")
    role = "prefill" if instance.startswith("prefill") else "decode"
    return EventBatch(EVENT_SCHEMA, role, instance, int(rank), 7, seq, T, events)


def _log(idle: bool = False, metrics_error: str = "") -> LogFollowed:
    return LogFollowed("/var/log/d.log", True, 10, 10, 1, 0, 0, 0.5, idle, metrics_error=metrics_error)


def _heartbeat(log: LogFollowed) -> Heartbeat:
    return Heartbeat(T, {"queue_transfer": 2}, 2, 0, 1.0, 1, 1.0, log=log)


def test_a_sidecars_failure_makes_a_failed_room_outside_the_failure_rate_and_its_room_state_opens_none():
    """The failure is the rank's state in the room, as for a log file: no open room, no failure rate."""
    model = ClusterModel()
    info = sidecar_info("decode", "decode-0", 0, 1, 7)
    failure = Failure(T, 42, "decode-0/TP0", "Request 42 timed out after 300.0s in KVPoll.WaitingForInput",
                      "timeout_waiting", "error", False, "decode-0/TP0")  # fmt: skip
    events: list[Event] = [AgentHello(T, info, "0", "", ""), RoomState(T, 42, int(KVPoll.Failed), 2), failure]
    model.apply("decode-0/TP0", _batch("decode-0/TP0", 1, events), T)
    model.sweep(T + 5)

    assert (model.rooms, model.finished[42].from_log, model.finished[42].ok) == ({}, True, False)
    assert model.failures[0].inferred
    assert status_json(model, T + 5, 60)["failure_rate"] is None


def test_sidecars_alone_time_no_transfer_and_their_silent_ranks_are_counted():
    """Status on sidecars said `0.0/s, 0 B/s` and `latency transfer p50 0 ms` (no transfer is in a log: no rate, not
    a rate of 0), and `0/2 alive, 0 stale, 0 gone` with the idle rank unnamed; now as on log files, the idle counted."""
    model = ClusterModel()
    for seq, (label, idle) in enumerate((("decode-0/TP0", False), ("prefill-0/TP0", True)), 1):
        role, instance = label.split("-")[0], label.partition("/")[0]
        hello = AgentHello(T, sidecar_info(role, instance, 0, 1, 7), "0", "", "")
        model.apply(label, _batch(label, seq, [hello, _heartbeat(_log(idle=idle))]), T)

    status = status_json(model, T + 1, 60)
    text = status_text(model, T + 1, 60).splitlines()

    assert (status["rooms_per_s"], status["gbps"], set(status["latency_s"].values())) == (None, None, {None})
    assert text[1:4] == [
        "ranks   1/2 alive, 0 stale, 0 gone, 1 idle (their log silent: the server idle, or dead)",
        "rooms   0 open (logs name a room where it failed; no transfers, no rate)",
        "latency - (logs time no transfer)",
    ]


def test_check_on_sidecars_counts_their_failed_rooms_not_rooms_that_finished():
    """Check said `1/1 ranks alive, 0 rooms in 60s, no failure rate (no room finished)` beside an incident of a
    failed room: as on log files, it counts the failed rooms and says why there is no rate."""
    model = ClusterModel()
    failure = Failure(T, 42, "decode-0/TP0", "Request 42 timed out after 300.0s in KVPoll.WaitingForInput",
                      "timeout_waiting", "error", False, "decode-0/TP0")  # fmt: skip
    hello = AgentHello(T, sidecar_info("decode", "decode-0", 0, 1, 7), "0", "", "")
    model.apply("decode-0/TP0", _batch("decode-0/TP0", 1, [hello, _heartbeat(_log()), failure]), T)

    result = evaluate(model, Thresholds(window_s=60), T + 1)

    assert "1/1 ranks alive, 1 room failed in 60s, no failure rate (logs name no room that succeeded)" in (
        result.summary
    )


def test_check_names_the_origins_of_the_most_rooms_first():
    """Check named the first three origins in alphabetical order: the one of most rooms, `timeout_waiting` here, was
    left out of the line. The three of the most rooms now, the most first."""
    model = ClusterModel()
    classes = ["checksum", "peer_lost", "send_failed", "timeout_waiting", "timeout_waiting", "timeout_waiting"]
    failures: list[Event] = [
        Failure(T, room, "decode-0/TP0", f"{kind} in room {room}", kind, "error", False, "decode-0/TP0")
        for room, kind in enumerate(classes, 1)
    ]
    hello = AgentHello(T, sidecar_info("decode", "decode-0", 0, 1, 7), "0", "", "")
    model.apply("decode-0/TP0", _batch("decode-0/TP0", 1, [hello, _heartbeat(_log()), *failures]), T)

    result = evaluate(model, Thresholds(window_s=60), T + 1)

    origins = "origins in 60s: decode-0/TP0 timeout_waiting, decode-0/TP0 checksum, decode-0/TP0 peer_lost"
    assert result.summary.endswith(origins), result.summary


def test_a_sidecar_rank_is_idle_when_its_log_is_silent_and_down_when_its_metrics_stop_answering_too():
    """Alive while the log grows, idle when silent, down when its metrics fail too, gone once it stops beating."""
    model = ClusterModel()
    states = []
    for seq, log in enumerate((_log(), _log(idle=True), _log(idle=True, metrics_error="refused")), 1):
        model.apply("decode-0/TP0", _batch("decode-0/TP0", seq, [_heartbeat(log)]), T)
        states.append(model.ranks["decode-0/TP0"].liveness(T))
    states.append(model.ranks["decode-0/TP0"].liveness(T + 60))

    assert states == [Liveness.ALIVE, Liveness.IDLE, Liveness.DOWN, Liveness.GONE]
    log = ranks_json(model, T)[0]["log"]
    assert (log["path"], log["position"], log["metrics"]) == ("/var/log/d.log", 10, {})


def test_the_transport_errors_sidecars_published_are_a_check_s_finding():
    """A glog error and a failed session in the window count, however many other lines came after them; a glog
    info line and one from before the window do not."""
    model = ClusterModel()
    glog = "E0603 20:16:59.104586 27322 worker_pool.cpp:271] Worker: Process failed for slice (...): retry exceeded"
    events: list[Event] = [
        LogContext(T - 120, "glog", None, glog),
        LogContext(T - 5, "glog", None, glog),
        LogContext(T - 4, "glog", None, "I0603 20:16:59.1 27322 transfer_engine.cpp:120] uses rdma"),
        LogContext(T - 3, "session", None, "Session 10.0.0.7:15292 failed.", 0),
    ]
    model.apply("prefill-0/TP0", _batch("prefill-0/TP0", 1, events), T)
    others: list[Event] = [LogContext(T - 2, "traceback", None, "KeyError: 1")] * (CONTEXT_KEPT + 1)
    model.apply("prefill-0/TP0", _batch("prefill-0/TP0", 2, others), T)  # the context kept is full of others

    errors = published_errors(model, T - 60, T)
    result = evaluate(model, Thresholds(window_s=60), T, transport_errors=errors)

    assert [(line.ts, line.kind) for line in errors] == [(T - 5, "glog"), (T - 3, "session")]
    assert result.transport_errors == 2
    assert "2 transport errors in the logs, the last at" in result.summary


def test_ranks_of_sidecars_show_no_rate_a_log_times_no_transfer():
    """`kvtop ranks` said RATE `0 B/s` (JSON gbps 0.0) for a sidecar's rank: a log tells no bytes moved, so no rate
    (`-`, null), as for a rank read from a log file; its pid is the sidecar's, still shown."""
    model = ClusterModel()
    info = sidecar_info("decode", "decode-0", 0, 1, 7)
    model.apply("decode-0/TP0", _batch("decode-0/TP0", 1, [AgentHello(T, info, "0", "", ""), _heartbeat(_log())]), T)

    [rank] = ranks_json(model, T + 1)
    header, row = ranks_text(model, T + 1).splitlines()[:2]

    assert (rank["source"], rank["gbps"], rank["pid"]) == ("log", None, info.pid)
    assert row[header.index("RATE") - 6 : header.index("RATE") + 4].split() == ["-"], row


@pytest.mark.parametrize("label", ["decode-0/DP1-TP0", "decode-0/DP1-TP0~taken"])
def test_a_context_line_a_dp_replica_s_rank_published_is_shown_as_that_replica_s(label: str):
    """A sidecar of a server whose DP ranks are replicas publishes each replica's rank apart (`decode-0/DP1-TP0`):
    the line its rank published was shown as `decode-0/TP0`'s, the first replica's rank, its stage kept and its
    replica lost (a rank heard as taken lost its stage too). It is the replica's."""
    model = ClusterModel()
    glog = "E0603 20:16:59.104586 27322 worker_pool.cpp:271] Worker: Process failed for slice (...): retry exceeded"
    events: list[Event] = [LogContext(T - 5, "glog", None, glog, 0)]
    model.apply(label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 7, 1, T, events, None, 1), T)

    [line] = published_errors(model, T - 60, T)

    assert (line.source, line.tp, line.pp, line.dp) == ("decode-0", 0, None, 1)
    assert rank_label(line.source, line.tp, line.pp, line.dp) == "decode-0/DP1-TP0"  # as `kvtop failures` names it
