"""Line shapes of SGLang 0.5.9 and later, and of launchers around it, that kvtop read as nothing.

Found in public reports (sglang #20252, #13912, #11016, PR #25172; a slurm deployment's repository): the lines
below are written in their shapes (times, rooms and addresses of my own). Before, `check` said UNKNOWN beside
each of them, or dated a log by its file's time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import ContextLine, classify
from kvtop.sources.sglang.prefix import parse_prefix, stamp_seconds

SERVICE_TAGGED = (
    "[qwen3-prefill][2026-03-12 14:27:49][prefill.py:290][ERROR]: Prefill bootstrap failed for request rank=0 "
    "req.rid='32dfaf43' req.bootstrap_room=8383451044827823303 with exception "
    "KVTransferError(bootstrap_room=8383451044827823303): Request 8383451044827823303 timed out after 300.0s in "
    "KVPoll.Bootstrapping\n"
    "[qwen3-prefill][2026-03-12 14:27:53][prefill.py:290][ERROR]: Prefill bootstrap failed for request rank=0 "
    "req.rid='5c1d0e2a' req.bootstrap_room=2647732071407238990 with exception "
    "KVTransferError(bootstrap_room=2647732071407238990): Request 2647732071407238990 timed out after 300.0s in "
    "KVPoll.Bootstrapping\n"
)
SERVER_INFO_UNREACHABLE = (
    "[2026-03-11 21:03:04][conn.py:179][INFO]: Prefill server info not available from 10.0.0.7:8998, retrying "
    "(2/20)...\n"
    "[2026-03-11 21:03:05][conn.py:225][ERROR]: Error fetching prefill server info from bootstrap: "
    "HTTPConnectionPool(host='10.0.0.7', port=8998): Max retries exceeded with url: /route?engine_rank=-1 (Caused by "
    "NewConnectionError(\"HTTPConnection(host='10.0.0.7', port=8998): Failed to establish a new connection: "
    '[Errno 111] Connection refused"))\n'
)
ROOM_LOST_TO_BOOTSTRAP = (
    "[2026-02-19 16:32:42 TP0] Error fetching prefill parallel info from bootstrap: HTTPConnectionPool("
    "host='10.0.0.9', port=8998): Max retries exceeded with url: /route?engine_rank=-1 (Caused by "
    'NewConnectionError("Failed to establish a new connection: [Errno 111] Connection refused"))\n'
    "[2026-02-19 16:32:42 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='c7287ad8' "
    "decode_req.req.bootstrap_room=4751139391711345681 with exception KVTransferError("
    "bootstrap_room=4751139391711345681): Could not fetch prefill parallel info from bootstrap_addr: 10.0.0.9:8998\n"
)
LAUNCHER_WRAPPED_CRASH = (
    "[2025-11-25 16:01:47] [/bin/sh@<0,0>]: [2025-11-25 08:01:47] Scheduler hit an exception: Traceback (most "
    "recent call last):\n"
    '[2025-11-25 16:01:47] [/bin/sh@<0,0>]:   File "/sgl/python/sglang/srt/managers/scheduler.py", line 2741, in '
    "run_scheduler_process\n"
    "[2025-11-25 16:01:47] [/bin/sh@<0,0>]:     scheduler.event_loop_overlap_disagg_prefill()\n"
    "[2025-11-25 16:01:47] [/bin/sh@<0,0>]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
)
WATCHDOG = (
    "!!!!!!! Segfault encountered !!!!!!!\n"
    '  File "<unknown>", line 0, in mooncake::WorkerPool::transferWorker(int)\n'
    "[2026-05-14 16:49:46] Subprocess scheduler_1 (pid=922727) crashed with exit code -11. Triggering cleanup...\n"
)
WORKER_THREAD_CRASH = (
    "[2025-09-28 08:33:56 TP1] TpModelWorkerClient hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl/python/sglang/srt/managers/tp_worker_overlap_thread.py", line 132, in forward_thread_func\n'
    "    self.forward_thread_func_()\n"
    "RuntimeError: NCCL error\n"
)


def _log(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_service_name_before_the_time_is_a_wrapper_and_the_lines_keep_their_times(tmp_path: Path):
    log = _log(tmp_path, "prefill.log", SERVICE_TAGGED)

    groups = json.loads(kvtop_here("failures", "--sglang-log", log, "--json").stdout)["groups"]

    assert parse_prefix(SERVICE_TAGGED.splitlines()[0]).ts == stamp_seconds("2026-03-12 14:27:49")
    assert sorted(g["origin"]["ts"] for g in groups) == [
        stamp_seconds("2026-03-12 14:27:49"),
        stamp_seconds("2026-03-12 14:27:53"),
    ]


def test_a_logging_configurations_source_and_level_after_the_time_leave_the_message_as_sglang_wrote_it(tmp_path: Path):
    """`[svc][time][scheduler_metrics_mixin.py:242][INFO]: Prefill batch, ...` (sglang #20252): the batch lines were
    not read (their queue depths, `#inflight-req` among them, lost), and only the first of each file was looked at."""
    batches = "".join(
        f"[qwen3-prefill][2026-03-12 14:27:{second}][scheduler_metrics_mixin.py:242][INFO]: Prefill batch, #new-seq: "
        "1, #new-token: 1, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 109, "
        "#inflight-req: 3, \n"
        for second in (50, 51)
    )
    log = _log(tmp_path, "prefill.log", batches + SERVICE_TAGGED)

    status = json.loads(kvtop_here("status", "--json", "--sglang-log", log).stdout)
    [rank] = json.loads(kvtop_here("ranks", "--json", "--sglang-log", log).stdout)

    events = [json.loads(line) for line in kvtop_here("events", "--jsonl", "--sglang-log", log).stdout.splitlines()]

    assert (status["logs"]["batches"], status["logs"]["failures"], rank["inflight"]) == (2, 2, 3)
    assert {event["raw_level"] for event in events if event["kind"] == "failure"} == {"error"}  # as the lines say


def test_a_room_failed_for_want_of_the_bootstrap_joins_that_bootstrap_s_incident(tmp_path: Path):
    log = _log(tmp_path, "decode.log", ROOM_LOST_TO_BOOTSTRAP)

    incidents = json.loads(kvtop_here("incidents", "--sglang-log", log, "--json").stdout)["incidents"]

    assert [(i["suspect_text"], i["rooms"], i["roomless"]) for i in incidents] == [
        ("prefill at 10.0.0.9:8998", [4751139391711345681], 0)  # the error is the room's: no failure of its own
    ]


def test_sglang_s_watchdog_names_the_scheduler_that_died_and_the_signal():
    line = classify(parse_prefix(WATCHDOG.splitlines()[2]), 2026)

    assert line == ContextLine(
        stamp_seconds("2026-05-14 16:49:46"), 1, "crash", None, "its scheduler_1 process killed by SIGSEGV"
    )


@pytest.mark.parametrize(
    ("server", "text", "said"),
    [
        pytest.param("decode", SERVER_INFO_UNREACHABLE, "prefill at 10.0.0.7:8998 stopped answering (bootstrap_error)",
                     id="sglang-0.5.9-unreachable-bootstrap"),
        pytest.param("prefill", LAUNCHER_WRAPPED_CRASH,
                     "prefill-0/TP0 crashed at 08:01:47 (Scheduler hit an exception: RuntimeError: CUDA error",
                     id="crash-under-a-launcher-wrapper"),
        pytest.param("decode", WATCHDOG, "decode-0/TP1 crashed at 16:49:46 (its scheduler_1 process killed by SIGSEGV)",
                     id="watchdog-after-a-segfault-dump"),
        pytest.param("decode", WORKER_THREAD_CRASH,
                     "decode-0/TP1 crashed at 08:33:56 (TpModelWorkerClient hit an exception: RuntimeError: NCCL error",
                     id="overlap-thread-exception"),
    ],
)  # fmt: skip
def test_check_is_critical_naming_what_broke(tmp_path: Path, server: str, text: str, said: str):
    """Each was UNKNOWN (`no rank named`) before: the bootstrap a dead prefill left unanswered is an incident of
    its address; a scheduler's crash is the rank's, at SGLang's own time, whatever wraps or follows it."""
    check = kvtop_here("check", "--sglang-log", _log(tmp_path, f"{server}.log", text))

    assert check.returncode == 2, check.stdout
    assert said in check.stdout


def test_a_glog_line_pasted_without_its_thread_id_is_a_transport_library_s_line():
    """`E0713 23:29:03.494601 nixl_agent.cpp:631] ...` (sglang #31295: NIXL's line with the thread id left out)
    was read as nothing: `check` said UNKNOWN beside it."""
    line = classify(parse_prefix("E0713 23:29:03.494601 nixl_agent.cpp:631] prepXferDlist: failed to prepare"), 2026)

    assert isinstance(line, ContextLine)
    assert (line.kind, line.ts) == ("glog", stamp_seconds("2026-07-13 23:29:03") + 0.494601)


NIXL_REMOTE_DISCONNECT = "".join(
    f"[2026-07-21 08:04:41 TP{tp} EP{tp}] NIXL transport error for room 6555093254675405189: "
    f"NIXL_ERR_REMOTE_DISCONNECT\n"
    for tp in (1, 2)
) + "".join(
    f"[2026-07-21 08:04:41 TP{tp} EP{tp}] Prefill transfer failed for request rank={tp} req.rid='a04107cc' "
    f"req.bootstrap_room=6555093254675405189 with exception NIXL_ERR_REMOTE_DISCONNECT\n"
    for tp in (2, 1)
)
"""nixl #1983 (SGLang's NIXL backend, 2026-07): every prefill rank's transfer to a room's decode peer ended with
NIXL's `NIXL_ERR_REMOTE_DISCONNECT`, "remote agent disconnected": it was `unknown (noticed by prefill-0)`."""
DECODE_SIDE_ABORT = (
    "[2026-07-22 10:00:05 TP0] Prefill transfer failed for request rank=0 req.rid='b1' req.bootstrap_room=4242 "
    "with exception KVTransferError(bootstrap_room=4242): Aborted by decode-side abort notification.\n"
    "[2026-07-22 10:00:05 TP1] Prefill transfer failed for request rank=1 req.rid='b1' req.bootstrap_room=4242 "
    "with exception KVTransferError(bootstrap_room=4242): Aborted by decode-side abort notification.\n"
)
"""SGLang 0.5.23's NIXL backend records a room its decode peer aborted with this reason (`nixl/conn.py`,
`_handle_abort_notification`): the decode side's failure reaching prefill (DOMAIN.md, "Decode to prefill")."""


@pytest.mark.parametrize(
    ("text", "suspect", "what", "origins_echoes"),
    [
        (NIXL_REMOTE_DISCONNECT, "the decode side of prefill-0", "unresponsive", (1, 1)),
        (DECODE_SIDE_ABORT, "the decode side of prefill-0", "failing", (1, 2)),
    ],
    ids=["nixl-remote-disconnect", "decode-side-abort"],
)
def test_a_prefill_log_alone_names_the_decode_side_for_what_decode_did(
    tmp_path: Path, text: str, suspect: str, what: str, origins_echoes: tuple[int, int]
):
    log = tmp_path / "prefill.log"
    log.write_text(text)

    [incident] = json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]

    assert (incident["suspect_text"], incident["kind"]) == (suspect, what)
    assert (incident["origins"], incident["echoes"]) == origins_echoes
