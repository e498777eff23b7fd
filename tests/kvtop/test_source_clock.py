"""A source has a clock: windows anchored at the logs' own time, the rooms a log names, dates across days, and
windows that name the span the agents' snapshots really cover."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kvtop_cli import kvtop

from kvtop.model.cluster import FINISHED_ROOMS_KEPT, ClusterModel
from kvtop.model.fold import ROOM_REUSE_S
from kvtop.sources.sglang import load
from kvtop.views.failures import render_groups
from kvtop.views.tables import rooms_json, status_json
from transport import TransferConfig
from transport.errors import FrameRejected
from transport.harness.cluster import ClusterSpec
from transport.harness.workload import Router, WorkloadSpec
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, RoomState, Snapshot
from transport.plane.publisher import FINISHED_KEPT, StateMirror
from transport.wire import FrameDecoder, encode

FIXTURES = Path(__file__).parent / "fixtures" / "sglang" / "new-era"
LOGS = ("--sglang-log", f"prefill={FIXTURES / 'prefill.log'}", "--sglang-log", f"decode={FIXTURES / 'decode.log'}")
T0 = 1_000_000.0


def failure_line(stamp: str, tp: int, room: int) -> str:
    return (
        f"[{stamp} TP{tp}] Prefill transfer failed for request rank={tp} req.rid='r{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): Failed to send kv chunk of {room} to 10.0.0.7:15004\n"
    )


@pytest.mark.processes
@pytest.mark.usefixtures("utc")
def test_kvtop_rooms_on_logs_lists_each_failed_room_with_the_state_each_rank_logged():
    """Room 1111 failed on prefill-0/TP1 and both decode ranks: Failed on those three, nothing invented elsewhere."""
    result = kvtop("rooms", "--json", *LOGS)

    assert result.returncode == 0, result.stderr
    rooms = {room["room"]: room for room in json.loads(result.stdout)}
    assert rooms[1111]["states"] == {"decode-0/TP0": "Failed", "decode-0/TP1": "Failed", "prefill-0/TP1": "Failed"}
    assert (rooms[1111]["prefill"], rooms[1111]["decode"]) == ("prefill-0", "decode-0")
    assert rooms[4444]["states"] == {"prefill-0/TP0": "Failed"}
    assert {state for room in rooms.values() for state in room["states"].values()} == {"Failed"}


@pytest.mark.usefixtures("utc")
def test_status_on_logs_counts_the_failed_rooms_of_the_logs_last_minute_and_gives_no_rate():
    """Logs name no room that succeeded: status shows the rooms failed by a fault as of the logs' last line, no rate."""
    model = ClusterModel()
    logs = load([f"prefill={FIXTURES / 'prefill.log'}", f"decode={FIXTURES / 'decode.log'}"], model)
    status = status_json(model, logs.now, 60.0)
    in_window = [room for room in rooms_json(model, logs.now, ended=True) if room["age_s"] <= 60.0]

    assert (status["failure_rate"], status["rooms_finished"]) == (None, 0)
    assert status["rooms_failed"] == len(in_window) - status["aborted"] > 0  # a client's abort is no cluster fault
    assert status["failures"] + status["aborted"] == len(model.groups(logs.now, 60.0)) > 0


@pytest.mark.processes
@pytest.mark.usefixtures("utc")
def test_kvtop_failures_shows_dates_when_the_logs_span_days_and_times_alone_otherwise(tmp_path: Path):
    """Two days apart, every time carries its date; the one-day fixture shows the time of day alone."""
    log = tmp_path / "prefill.log"
    log.write_text(failure_line("2026-01-01 10:00:00", 0, 101) + failure_line("2026-01-03 09:00:00", 0, 202))

    two_days = kvtop("failures", "--sglang-log", f"prefill={log}")
    one_day = kvtop("failures", *LOGS)

    assert two_days.returncode == one_day.returncode == 0, two_days.stderr + one_day.stderr
    table = two_days.stdout.split("\nROOM ", 1)[1]  # the groups, under the incidents
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "2026-01-01 10:00:00.000" in rows["101"] and "2026-01-03 09:00:00.000" in rows["202"]
    row = next(line for line in one_day.stdout.splitlines() if line.startswith("1111 "))
    assert " 03:04:05.250 " in row and "2026-01-02" not in row


def test_failures_text_groups_on_one_day_carry_no_date():
    """No groups, no dates: the header still names the TIME column."""
    assert render_groups([], debug=False).split()[:2] == ["ROOM", "TIME"]


def test_the_state_mirror_says_from_when_its_bounded_history_is_complete():
    """Until its finished rooms overflow, the history is whole (0); after, it starts at the oldest room kept."""
    mirror = StateMirror()
    for index in range(FINISHED_KEPT - 1):
        mirror.apply(RoomState(T0 + index, index, int(KVPoll.Success), int(KVPoll.Transferring)))
    whole = mirror.history_since
    for index in range(FINISHED_KEPT - 1, FINISHED_KEPT + 99):
        mirror.apply(RoomState(T0 + index, index, int(KVPoll.Success), int(KVPoll.Transferring)))

    assert whole == 0.0
    assert mirror.history_since == mirror.finished[0].ts == T0 + 99  # 611 rooms, the last 512 kept


def test_a_snapshot_whose_history_starts_late_cuts_the_window_and_the_counts_to_it():
    """Rooms before the snapshot's history start are left out of the count, and the window says why it is short."""
    model = ClusterModel()
    done = [RoomState(T0 + second, second, int(KVPoll.Success), int(KVPoll.Transferring)) for second in range(60)]
    snapshot = Snapshot(1, EVENT_SCHEMA, 1, 1, None, None, [], done[30:], [], history_since=T0 + 30)
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, T0, []), T0 + 60)
    model.apply("decode-0/TP0", snapshot, T0 + 60)
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 1, T0, done[:30]), T0 + 60)

    coverage = model.coverage(T0 + 60, 60.0)
    assert (coverage.since, coverage.span_s, coverage.limit) == (T0 + 30, 30.0, "snapshot history")
    assert model.failure_rate(T0 + 60, 60.0) == (0.0, 30)
    status = status_json(model, T0 + 60, 60.0)
    assert (status["span_s"], status["span_limit"], status["rooms_finished"]) == (30.0, "snapshot history", 30)


def test_a_one_shot_status_of_a_live_cluster_names_the_span_its_snapshots_cover(make_cluster):
    """Past 512 rooms per rank, an agent's snapshot no longer holds the whole window: status says how much it does."""
    spec = ClusterSpec(num_pages=512, page_bytes=4096, transfer=TransferConfig(chunk_bytes=16384))
    cluster = make_cluster(spec)
    router = Router(cluster.endpoint, WorkloadSpec(rate=200.0, median_pages=2, max_pages=4, seed=7))
    deadline = time.monotonic() + 120.0
    try:
        while router.stats.succeeded < FINISHED_KEPT + 100:
            assert time.monotonic() < deadline, f"only {router.stats.succeeded} rooms succeeded in 120 s"
            router.step()
            time.sleep(0.002)
    finally:
        router.close()

    text = kvtop("status", "--bootstrap", cluster.endpoint, "--window", "3600")
    data = json.loads(kvtop("status", "--bootstrap", cluster.endpoint, "--window", "3600", "--json").stdout)

    assert text.returncode == 0, text.stderr
    assert (data["window_s"], data["span_limit"]) == (3600.0, "snapshot history")
    assert 0 < data["span_s"] < 3600 and 0 < data["rooms_finished"] <= FINISHED_KEPT
    line = next(line for line in text.stdout.splitlines() if line.startswith("rooms"))
    assert "finished in the last " in line and "s (snapshot history), " in line


def test_a_log_of_pasted_lines_is_as_of_the_time_its_lines_take_not_the_wall_clock(tmp_path: Path):
    """Lines without a prefix take the file's time (its mtime before any prefix): "now" is that, not today."""
    log = tmp_path / "prefill.log"
    log.write_text(failure_line("2026-01-01 10:00:00", 0, 101).split("] ", 1)[1])
    os.utime(log, (T0, T0))
    model = ClusterModel()

    logs = load([f"prefill={log}"], model)

    assert (logs.now, [group.first_ts for group in model.groups(logs.now, 60.0)]) == (T0, [T0])


def log_failure(model: ClusterModel, label: str, room: int, ts: float) -> None:
    """What the log source applies for one failure line of `label` (a log rank of incarnation 0)."""
    instance, _, tp = label.rpartition("/TP")
    role = instance.partition("-")[0]
    model.log_rank(label, role, instance, int(tp))
    failure = Failure(ts, room, label, "Failed to send kv chunk", "send_failed", "warning", False, label)
    model.apply(label, EventBatch(EVENT_SCHEMA, role, instance, int(tp), 0, 1, ts, [failure]), ts)


def test_rooms_named_by_logs_join_across_ranks_count_once_per_link_and_stay_bounded():
    """Both sides of room 7 join one room (one failed room on the link); 60 s later the id is a new room;
    however many rooms a log names, the model keeps its bounded window of them."""
    model = ClusterModel()
    log_failure(model, "prefill-0/TP0", 7, T0)
    log_failure(model, "decode-0/TP0", 7, T0 + 1)
    log_failure(model, "decode-0/TP1", 7, T0 + 2)
    joined = model.finished[7].view
    assert joined is not None
    assert (sorted(joined.states.values()), joined.link) == ([KVPoll.Failed] * 3, ("prefill-0", "decode-0"))
    assert model.links[("prefill-0", "decode-0")].failed_rooms == 1

    log_failure(model, "decode-0/TP0", 7, T0 + 2 + ROOM_REUSE_S + 1)
    again = model.finished[7].view
    assert again is not None and list(again.codes) == ["decode-0/TP0"]

    for room in range(FINISHED_ROOMS_KEPT + 10):
        log_failure(model, "prefill-0/TP0", 1000 + room, T0 + 100 + room / 1000)
    assert (len(model.finished), len(model.rooms)) == (FINISHED_ROOMS_KEPT, 0)
    assert model.failure_rate(T0 + 200, 1e6) == (0.0, 0)


@pytest.mark.parametrize("since", [float("nan"), float("inf"), -1.0])
def test_a_snapshot_whose_history_start_is_no_time_is_rejected_at_the_border(since: float):
    """NaN, infinity or a negative history start never reaches the model: the frame is rejected as malformed."""
    frame = encode(Snapshot(1, EVENT_SCHEMA, 1, 1, None, None, [], [], [], history_since=since))

    with pytest.raises(FrameRejected) as rejected:
        FrameDecoder(Snapshot).decode(frame)
    assert rejected.value.reason == "malformed"


def test_a_snapshot_whose_history_starts_after_its_oldest_entry_cuts_no_window():
    """One snapshot saying its history starts a day on made every window 0 s long: 0 rooms, failure rate 0.0%."""
    model = ClusterModel()
    done = [RoomState(T0 + second, second, int(KVPoll.Success), int(KVPoll.Transferring)) for second in range(60)]
    model.apply("prefill-0/TP0", EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 1, 1, T0, done), T0 + 60)
    hostile = Snapshot(1, EVENT_SCHEMA, 1, 1, None, None, [], [], [], history_since=T0 + 86_400)

    model.apply("decode-0/TP0", hostile, T0 + 60)

    coverage = model.coverage(T0 + 60, 60.0)
    assert (coverage.since, coverage.span_s, coverage.limit) == (T0, 60.0, "")  # it holds no entry: none dropped
