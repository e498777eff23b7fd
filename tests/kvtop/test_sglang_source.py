"""SGLang logs into the cluster model: both log eras, every propagation path, files merged, followed, rotated."""

from __future__ import annotations

import calendar
import gzip
import json
import shutil
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.bench.sglang_log import write_failed_rooms
from kvtop.model import cluster
from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.model.incidents import ROOMS_TRACKED
from kvtop.model.shapes import Liveness
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.reader import BLOCK_BYTES
from kvtop.views.check import Thresholds, Verdict, evaluate
from tests.conftest import wait_for
from transport.plane.events import Failure

pytestmark = pytest.mark.usefixtures("utc")

SGLANG_FIXTURES = Path(__file__).parent / "fixtures" / "sglang"

OLD_ERA = [SGLANG_FIXTURES / "old-era" / "prefill.log", SGLANG_FIXTURES / "old-era" / "decode.log"]
NEW_ERA = [SGLANG_FIXTURES / "new-era" / "prefill.log", SGLANG_FIXTURES / "new-era" / "decode.log"]
DECODE_LINE = (
    "[2026-01-02 03:04:{s:02d} TP{tp}] Decode transfer failed for request rank={tp} decode_req.req.rid='r' "
    "decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}\n"
)
TIMEOUT = "Request {room} timed out after 300.0s in KVPoll.WaitingForInput"


def shape(groups: list[FailureGroup]) -> list[tuple[int, str, str, list[str]]]:
    """Groups as (room, origin label, origin class, sorted echo ranks)."""
    return [
        (g.room, g.origin_label, g.origin.reason_class if g.origin else "", sorted(e.rank for e in g.echoes))
        for g in groups
    ]


def decode_line(room: int, tp: int = 0, second: int = 5, reason: str = TIMEOUT) -> str:
    return DECODE_LINE.format(s=second, tp=tp, room=room, reason=reason.format(room=room))


OLD_ERA_GROUPS = [
    (1111, "prefill-0/TP1", "send_failed", ["decode-0/TP0", "decode-0/TP1", "prefill-0/TP0"]),
    (2222, "decode-0/TP0", "timeout_waiting", ["decode-0/TP1", "prefill-0/TP0", "prefill-0/TP1"]),
    (3333, "decode-0/TP1", "timeout_bootstrap", ["decode-0/TP0"]),
    (4444, "prefill-0/TP0", "timeout_bootstrap", ["prefill-0/TP1"]),
    (5555, "decode-0/TP0", "peer_lost", ["decode-0/TP1"]),
    (6666, "prefill-0/TP0", "peer_lost", ["decode-0/TP0"]),
    (7777, "decode-0/TP0", "aborted", ["prefill-0/TP0"]),
    (8888, "prefill-0/TP1", "peer_lost", []),  # NIXL_ERR_REMOTE_DISCONNECT
    (9999, "prefill-0/TP0", "send_failed", ["prefill-0/TP1"]),
    (1313, "", "", ["decode-0/TP1"]),
    (1616, "decode-0/TP0", "checksum", []),  # another room's metadata landed (`Context corruption detected`)
    (1212, "prefill-0/TP1", "other", []),
    (1414, "prefill-0/TP0", "send_failed", []),
]


def test_an_old_era_log_folds_every_propagation_path_under_its_origin():
    """Copies at error/warning (before PR #27534): instance echoes, both cross-instance paths, unknown origins."""
    model = ClusterModel()

    load(OLD_ERA, model)

    assert shape(model.groups()) == OLD_ERA_GROUPS


def test_a_new_era_log_without_echo_lines_gives_the_same_origins():
    """After PR #27534 the instance echoes are at debug and absent: the same origins, fewer echoes."""
    model = ClusterModel()

    load(NEW_ERA, model)

    without_instance_echoes = [
        (room, origin, name, [e for e in echoes if (room, e) not in INSTANCE_ECHOES])
        for room, origin, name, echoes in OLD_ERA_GROUPS
        if room != 1313
    ]
    assert without_instance_echoes == shape(model.groups())


INSTANCE_ECHOES = {
    (1111, "prefill-0/TP0"),
    (2222, "decode-0/TP1"),
    (2222, "prefill-0/TP0"),
    (4444, "prefill-0/TP1"),
}


def test_log_ranks_are_log_not_gone_and_check_judges_only_their_incidents():
    """Ranks from logs have no heartbeat: state `log`, left out of the rank rules, so check's problems are the
    logs' incidents alone."""
    model = ClusterModel()
    logs = load(OLD_ERA, model)

    result = evaluate(model, Thresholds(), logs.now)

    assert {Liveness.LOG} == set(model.liveness(logs.now).values())
    assert (result.verdict, result.ranks_log, result.ranks_total, result.ranks_gone) == (Verdict.CRITICAL, 4, 0, [])
    assert all(problem.startswith(("incident: ", "and ")) for problem in result.problems), result.problems


def test_batch_lines_give_each_rank_its_queue_depths():
    """The latest batch line of a rank sets its counters and its rooms in flight (inflight or transfer queue)."""
    model = ClusterModel()

    load(OLD_ERA, model)

    assert (
        model.ranks["prefill-0/TP0"].inflight,
        model.ranks["prefill-0/TP0"].counters,
    ) == (8, {"queue_running": 0, "queue_queue": 0, "queue_bootstrap": 7, "queue_inflight": 8})
    assert model.ranks["decode-0/TP0"].inflight == 5


def test_truncated_and_garbled_lines_are_counted_and_skipped():
    """A cut failure line, an impossible date and bytes that are not text: three counted, none fatal."""
    logs = load(OLD_ERA, ClusterModel())

    stats = logs.stats()

    assert (stats.garbled, stats.no_room, stats.failures, stats.batches) == (3, 0, 25, 6)


def test_transport_library_lines_and_related_lines_are_shown_with_the_groups_near_them():
    """The glog error beside room 1111's send failure is its likely cause; the NIXL line joins room 8888."""
    model = ClusterModel()
    logs = load(OLD_ERA, model)
    groups = model.groups()

    context = dict(zip([g.room for g in groups], logs.context_for(groups), strict=True))

    assert sorted((c.kind, c.likely_cause) for c in context[1111]) == [("glog", True), ("session", False)]
    assert [c.kind for c in context[8888]] == ["room"]


def test_failures_debug_lines_each_echo_and_context_line_up_under_the_headers_columns():
    """`kvtop failures --debug` began an echo's rank under TIME and its reason under CLASS: each member now puts its
    time, rank, class and words where the header says, whatever the kind's length (`lost_connection`)."""
    from kvtop.views.failures import render_groups

    model = ClusterModel()
    logs = load(OLD_ERA, model)
    groups = model.groups()
    lines = render_groups(groups, debug=True, context=logs.context_for(groups)).splitlines()
    header = lines[0]
    column = {name: header.index(name) for name in ("TIME", "ORIGIN", "CLASS", "REASON")}
    echo = next(line for line in lines if line.lstrip().startswith("echo") and "decode-0/TP1" in line)
    lost = next(line for line in lines if line.lstrip().startswith("lost_connection"))

    assert echo[column["TIME"] :].startswith("03:04:06.000 ")
    assert echo[column["ORIGIN"] :].startswith("decode-0/TP1 ")
    assert echo[column["CLASS"] :].startswith("propagated ")
    assert echo[column["REASON"] :].startswith("Failed to get kvcache from prefill instance")
    assert lost[column["ORIGIN"] :].startswith("decode-0/TP0 ")
    assert lost[column["REASON"] :].startswith("Lost connection with prefill instance")


def test_incidents_debug_lines_each_room_up_under_the_headers_columns_and_counts_its_echoes():
    """`kvtop incidents --debug` put its rooms' lines in columns of their own (`1 echoes` under WHAT): a room's line
    now names who noticed under WHAT, its class, time, origin/echoes and reason where the header says."""
    from kvtop.views.incidents import by_incident, in_span, render

    model = ClusterModel()
    logs = load(OLD_ERA, model)
    now, gap = logs.now, model.incidents.quiet_gap_s
    lines = render(in_span(model, None, now), now, gap, by_incident(model, model.groups())).splitlines()
    column = {name: lines[0].index(name) for name in ("SUSPECT", "WHAT", "CLASS", "SINCE", "EVIDENCE")}
    room = next(line for line in lines if line.split()[:2] == ["room", "5555"])
    end = column["EVIDENCE"] - 2

    assert room[column["SUSPECT"] :].startswith("5555 ")
    assert room[column["WHAT"] :].startswith("decode-0/TP0 ")
    assert room[column["CLASS"] :].startswith("peer_lost ")
    assert room[column["SINCE"] :].startswith("03:04:35 ")
    assert room[:end].endswith(" 1/1")
    assert room[column["EVIDENCE"] :].startswith("Lost connection with prefill instance")


def test_files_are_named_from_agent_file_names_else_by_role_in_argument_order(tmp_path: Path):
    """`decode-3.log` keeps its name; other files are prefill-N/decode-N in order; prefill=/decode= say the role
    where no line does."""
    for name in ("decode-3.log", "a.log", "c.log"):
        (tmp_path / name).write_text(decode_line(1))
    (tmp_path / "b.log").write_text(
        "[2026-01-02 03:04:05 TP0] Scheduler hit an exception: Traceback (most recent call last):\nKeyError: 7\n"
    )
    model = ClusterModel()

    load([tmp_path / "decode-3.log", tmp_path / "a.log", f"prefill={tmp_path / 'b.log'}", tmp_path / "c.log"], model)

    assert sorted(model.ranks) == ["decode-0/TP0", "decode-1/TP0", "decode-3/TP0", "prefill-0/TP0"]
    assert model.ranks["prefill-0/TP0"].role == "prefill"


def test_a_files_lines_win_over_its_label_and_the_summary_says_so(tmp_path: Path):
    """DOMAIN.md: which side logged a line is in its text, and the text wins over a file's label (SGLang issue
    #7338: a decode failure pasted into `prefill.log`, labelled prefill, was a prefill rank's echo)."""
    log = tmp_path / "prefill.log"
    log.write_text(decode_line(1))
    model = ClusterModel()

    logs = load([f"prefill={log}"], model)

    assert sorted(model.ranks) == ["decode-0/TP0"]
    assert f"1 read as their lines say: {log}: labelled prefill, its lines are decode's" in logs.stats().summary()


def test_several_files_are_merged_by_time(tmp_path: Path):
    """Two instances' files interleave in time order whatever the argument order."""
    (tmp_path / "decode-0.log").write_text(decode_line(1, second=1) + decode_line(3, second=3))
    (tmp_path / "decode-1.log").write_text(decode_line(2, second=2) + decode_line(4, second=4))

    logs = SGLangLogs([tmp_path / "decode-1.log", tmp_path / "decode-0.log"])
    applied = [item for polled in logs.stream(ClusterModel()) for item in polled]

    assert [(event.room, label) for label, event in applied if isinstance(event, Failure)] == [
        (1, "decode-0/TP0"),
        (2, "decode-1/TP0"),
        (3, "decode-0/TP0"),
        (4, "decode-1/TP0"),
    ]


def test_a_followed_file_gives_lines_as_they_are_completed(tmp_path: Path):
    """`tail -f`: a line shows once its newline is written, not before; nothing is read twice."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(1))
    model = ClusterModel()
    logs = SGLangLogs([path])
    logs.poll(model)
    half = decode_line(2)

    with path.open("a") as log:
        log.write(half[:40])
        log.flush()
        partial = logs.poll(model)
        log.write(half[40:])
        log.flush()
        completed = logs.poll(model)

    assert ([e.room for _, e in partial], [e.room for _, e in completed]) == ([], [2])
    assert [g.room for g in model.groups()] == [1, 2]


def test_a_rotated_file_is_drained_then_read_again_from_its_start(tmp_path: Path):
    """Rename-and-reopen rotation: the old file's last lines, then the new file from its first line."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(1))
    model = ClusterModel()
    logs = SGLangLogs([path])
    logs.poll(model)
    with path.open("a") as log:
        log.write(decode_line(2))
    path.rename(tmp_path / "decode-0.log.1")
    path.write_text(decode_line(3))

    logs.poll(model)

    assert ([g.room for g in model.groups()], logs.stats().rotations) == ([1, 2, 3], 1)


def test_a_file_truncated_in_place_is_read_again_from_its_start(tmp_path: Path):
    """Copy-and-truncate rotation: a file shorter than what was read starts over."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(1) + decode_line(2))
    model = ClusterModel()
    logs = SGLangLogs([path])
    logs.poll(model)

    path.write_text(decode_line(3))
    logs.poll(model)

    assert [g.room for g in model.groups()] == [1, 2, 3]


def test_a_file_truncated_and_written_past_the_read_position_is_read_again_from_its_start(tmp_path: Path):
    """Copy-and-truncate, then more written than was read before the next look: the file's bytes before the
    read position changed, so it starts over instead of reading on from the middle of a line."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(1))
    model = ClusterModel()
    logs = SGLangLogs([path])
    logs.poll(model)

    path.write_text(decode_line(2) + decode_line(3) + decode_line(4))
    logs.poll(model)

    assert ([g.room for g in model.groups()], logs.stats().rotations, logs.stats().garbled) == ([1, 2, 3, 4], 1, 0)


def test_gzip_files_are_read_like_plain_ones(tmp_path: Path):
    """A rotated `.gz` log gives the same groups as the plain file."""
    with (
        open(OLD_ERA[1], "rb") as plain,
        gzip.open(tmp_path / "decode.log.gz", "wb") as packed,
    ):
        shutil.copyfileobj(plain, packed)
    plain_model, packed_model = ClusterModel(), ClusterModel()

    load([OLD_ERA[0], OLD_ERA[1]], plain_model)
    load([OLD_ERA[0], tmp_path / "decode.log.gz"], packed_model)

    assert shape(plain_model.groups()) == shape(packed_model.groups())


def test_a_last_line_without_a_newline_is_not_read_when_the_file_is_read_to_its_end_but_said_cut(tmp_path: Path):
    """One-shot reading took the final unterminated line as whole; its end may be missing (a log copied while its
    server wrote it, or a server killed mid-write): it is not read, and the logs' summary says it was cut."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(1) + decode_line(2).rstrip("\n"))
    model = ClusterModel()

    logs = load([path], model)

    assert [g.room for g in model.groups()] == [1]
    assert logs.stats().cut == [str(path)]
    assert f"last line cut: not read in {path}" in logs.stats().summary()


def test_ranks_of_one_instance_failing_the_same_way_together_are_one_failure(tmp_path: Path):
    """Both decode ranks time out on the same room within a second: one origin (the earliest), one echo."""
    path = tmp_path / "decode-0.log"
    path.write_text(decode_line(7, tp=1, second=5) + decode_line(7, tp=0, second=6))
    model = ClusterModel()

    load([path], model)

    assert shape(model.groups()) == [(7, "decode-0/TP1", "timeout_waiting", ["decode-0/TP0"])]


ABORTS = [SGLANG_FIXTURES / "aborts" / "prefill.log", SGLANG_FIXTURES / "aborts" / "decode.log"]


def test_client_aborts_are_one_failure_each_with_the_earliest_rank_as_origin():
    """`Aborted by AbortReq.` on prefill ranks only, decode first, or prefill first: one aborted group per room."""
    model = ClusterModel()
    load(ABORTS, model)

    groups = model.groups()

    assert shape(groups) == [
        (101, "prefill-0/TP2", "aborted", ["prefill-0/TP0", "prefill-0/TP1", "prefill-0/TP3"]),
        (102, "decode-0/TP0", "aborted", ["prefill-0/TP0", "prefill-0/TP1"]),
        (103, "prefill-0/TP5", "aborted", ["decode-0/TP1"]),
        (104, "prefill-0/TP4", "peer_lost", [f"prefill-0/TP{tp}" for tp in (1, 2, 3, 5, 6, 7)]),
        (105, "decode-0/TP0", "timeout_waiting", ["decode-0/TP1"]),
    ]
    assert [group.aborted for group in groups] == [True, True, True, False, False]


WORKER_ERRORS = [SGLANG_FIXTURES / "worker-errors" / "prefill.log", SGLANG_FIXTURES / "worker-errors" / "decode.log"]


def test_a_worker_error_names_the_room_of_the_roomless_failure_lines_after_it():
    """Room 201: the worker error names it for TP3's RuntimeError line, the rid for the other ranks' lines."""
    model = ClusterModel()
    logs = load(WORKER_ERRORS, model)

    group = next(g for g in model.groups() if g.room == 201)

    assert shape([group]) == [
        (201, "prefill-0/TP3", "other", ["decode-0/TP3", "prefill-0/TP0", "prefill-0/TP1", "prefill-0/TP2"])
    ]
    assert group.origin is not None and group.origin.reason == "RuntimeError('post xfer failed: NIXL_ERR_BACKEND')"
    assert logs.stats().no_room == 1, "room 203's line: no worker error, no known rid"


def test_a_worker_error_no_failure_line_claims_is_the_failure_record_itself():
    """Room 202 is named only by its worker error: that line is the origin, its reason the traceback's last line."""
    model = ClusterModel()
    load(WORKER_ERRORS, model)

    group = next(g for g in model.groups() if g.room == 202)

    assert (group.origin_label, group.echo_count) == ("prefill-0/TP2", 0)
    assert group.origin is not None
    assert (
        group.origin.reason
        == "RuntimeError: Transfer worker crashed: CUDA error: an illegal memory access was encountered"
    )


def test_a_nixl_transport_error_names_the_room_of_a_bare_backend_code_and_alone_is_only_context():
    """Room 204: the NIXL error names the room of the roomless line after it; 205's alone fails nothing."""
    model = ClusterModel()
    logs = load(WORKER_ERRORS, model)

    rooms = {group.room: group for group in model.groups()}

    assert (rooms[204].origin_label, rooms[204].origin.reason if rooms[204].origin else "") == (
        "prefill-0/TP0", "NIXL_ERR_REMOTE_DISCONNECT",
    )  # fmt: skip
    assert 205 not in rooms
    assert any(line.room == 205 for line in logs.context)


def test_a_followed_worker_error_becomes_the_failure_record_once_the_file_moves_past_it(tmp_path: Path):
    """Followed: an unclaimed worker error waits while a line could still claim it, then fails its room."""
    path = tmp_path / "prefill-0.log"
    path.write_text("[2026-01-02 03:04:05 TP1] Unexpected transfer worker error for room 31\n")
    model = ClusterModel()
    logs = SGLangLogs([path])
    waiting = logs.poll(model)
    with path.open("a") as log:
        log.write("[2026-01-02 03:04:20 TP0] Session 10.0.0.7:15004 failed.\n")
    moved_on = logs.poll(model)

    failures = [(label, e.room) for label, e in moved_on if isinstance(e, Failure)]  # the session: its rank's event
    assert (waiting, failures) == ([], [("prefill-0/TP1", 31)])


def test_a_followed_worker_error_with_its_traceback_last_fails_its_room_once_the_file_is_quiet(tmp_path: Path):
    """No later line: once the file gained nothing for the quiet time the worker error is its room's failure
    record, its reason the traceback's last line; a roomless line of the room that still comes is its echo."""
    path = tmp_path / "prefill-0.log"
    path.write_text(
        "[2026-01-02 03:04:05 TP3] Unexpected transfer worker error for room 31\n"
        "Traceback (most recent call last):\n"
        '  File "/opt/sglang/python/sglang/srt/disaggregation/nixl/conn.py", line 611, in transfer_worker\n'
        "RuntimeError: post xfer failed: NIXL_ERR_BACKEND\n"
    )
    model = ClusterModel()
    logs = SGLangLogs([path])
    logs.files[0].reader.quiet_s = 0.2
    published = wait_for(lambda: logs.poll(model), 10, "the worker error published once the file was quiet")
    with path.open("a") as log:
        log.write("[2026-01-02 03:04:07 TP3] Prefill transfer failed for request rank=3 req.rid='w31' with "
                  "exception RuntimeError('post xfer failed: NIXL_ERR_BACKEND')\n")  # fmt: skip
    late = logs.poll(model)

    reason = "RuntimeError: post xfer failed: NIXL_ERR_BACKEND"
    assert [(label, e.room, e.reason) for label, e in published] == [("prefill-0/TP3", 31, reason)]
    assert [(label, e.room, e.is_from_another_rank) for label, e in late] == [("prefill-0/TP3", 31, True)]
    assert logs.stats().no_room == 0
    assert shape(model.groups()) == [(31, "prefill-0/TP3", "other", ["prefill-0/TP3"])]


@pytest.mark.slow
def test_a_log_of_many_failed_rooms_streams_into_the_model_one_block_at_a_time(tmp_path: Path, monkeypatch):
    """60,000 failed rooms, the model keeping 5,000 failures: loading holds one read's events at a time (a block
    of the file), never the file's; the model holds its bounds and counts every failure."""
    monkeypatch.setattr(cluster, "FAILURES_KEPT", 5_000)
    path = tmp_path / "decode-0.log"
    write_failed_rooms(path, 60_000)
    shortest = min(len(line) for line in path.open("rb"))
    model = ClusterModel()
    logs = SGLangLogs([path])

    held = [len(applied) for applied in logs.stream(model, max_bytes=BLOCK_BYTES)]

    assert sum(held) == 60_000 and len(held) > 3
    assert max(held) <= BLOCK_BYTES // shortest + 1
    assert (len(model.failures), model.failures_total) == (5_000, 60_000)
    assert len(model.finished) <= cluster.FINISHED_ROOMS_KEPT
    assert model.incidents.tracking <= ROOMS_TRACKED


@pytest.mark.usefixtures("utc")
def test_a_transport_line_before_any_sglang_line_takes_the_year_of_the_first_one(tmp_path: Path):
    """A glog line prints no year (sglang issue #7118's log opens with one): it took the file's modification
    year, a year off for a log copied later, and the span judged became a year long."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "E0612 14:05:26.176716 391 tcp_transport.cpp:136] Session::writeBody failed. Error: Connection reset\n"
        "[2025-06-12 14:05:27 TP0] Prefill transfer failed for request rank=0 req.rid='a' req.bootstrap_room=7 "
        "with exception KVTransferError(bootstrap_room=7): Failed to send kv chunk of 7 to 10.0.0.7:15004\n"
    )

    [group] = json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"]

    [glog] = [context for context in group["context"] if context["kind"] == "glog"]
    assert glog["ts"] == calendar.timegm((2025, 6, 12, 14, 5, 26)) + 0.176716


def test_lines_dated_only_by_their_files_time_are_counted_in_the_summary(tmp_path: Path):
    """Pasted with no prefix (SGLang issue #10110), a failure's time is the file's mtime: the summary says how many
    lines that dates, so a `since` and an order across files are not read as the logs' own."""
    log = tmp_path / "decode.log"
    log.write_text(decode_line(1).partition("] ")[2] + decode_line(2).partition("] ")[2])
    dated = tmp_path / "prefill.log"
    dated.write_text(decode_line(3).partition("] ")[2] + decode_line(4).replace("Decode", "Prefill"))

    logs = load([log, dated], ClusterModel())

    assert "2 dated by their file's time (no line before them told one)" in logs.stats().summary()
