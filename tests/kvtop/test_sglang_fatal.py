"""A rank that died without `Scheduler hit an exception`: a KV transfer thread's death, a fatal signal.

The shapes are public reports': sglang #23444 (2026-04: a prefill rank's Mooncake `transfer_worker` thread died
on a ValueError; the scheduler went on, the rooms that thread served never finished), sglang #6694 (2025-05:
the prefill process died in UCX's TCP transport, `Caught signal 11 (Segmentation fault ...)`) and a NIXL
deployment's `Fatal Python error: Segmentation fault`. Each had `check --sglang-log` say "no ranks listed or
discovered" (or OK beside other logs) before: none of the lines was one kvtop read, and none had a time of its
own. The fixtures are made up in the same shapes (the reports' excerpts were cut).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import load
from kvtop.sources.sglang.lines import ContextLine, classify
from kvtop.sources.sglang.prefix import parse_prefix, stamp_seconds
from kvtop.views.times import seconds

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
THREAD = FIXTURES / "thread-death"
"""prefill-0: TP1's `transfer_worker` thread dies at 14:31:38 (the line before its death is TP1's), its batch lines
go on; decode-0: two rooms time out in WaitingForInput 300 s later."""
THREAD_LOGS = ("--sglang-log", str(THREAD / "prefill.log"), "--sglang-log", str(THREAD / "decode.log"))
THREAD_SAID = (
    "thread Thread-5 (transfer_worker) died: ValueError: operands could not be broadcast together with shapes "
    "(0,) (390,), in sglang/srt/disaggregation/common/utils.py:85 group_concurrent_contiguous"
)
SIGNAL = FIXTURES / "fatal-signal"
"""prefill-0 dies of SIGSEGV in UCX at 09:43:43 (its bootstrap server's access line before it dates it), and
decode-0 loses it 10 s later; decode-1 dies of `Fatal Python error: Segmentation fault` after its batch line of
09:43:41."""
SIGNAL_LOGS = tuple(arg for log in sorted(SIGNAL.glob("*.log")) for arg in ("--sglang-log", str(log)))
TRACE = (
    'Traceback (most recent call last):\n  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner\n'
    '    self.run()\n  File "{path}", line 12, in {function}\n    raise ValueError("x")\nValueError: x'
)


@pytest.mark.parametrize(
    ("first", "path", "function", "kind", "said"),
    [
        (
            "Exception in thread Thread-5 (transfer_worker):",
            "/sgl/python/sglang/srt/disaggregation/mooncake/conn.py",
            "transfer_worker",
            "thread_died",
            "thread Thread-5 (transfer_worker) died: ValueError: x, in sglang/srt/disaggregation/mooncake/conn.py:12 "
            "transfer_worker",
        ),
        (  # before Python 3.10 no target is named: its frames say it is the KV transfer's
            "Exception in thread Thread-3:",
            "/sgl/python/sglang/srt/disaggregation/nixl/conn.py",
            "bootstrap_thread",
            "thread_died",
            "thread Thread-3 died: ValueError: x, in sglang/srt/disaggregation/nixl/conn.py:12 bootstrap_thread",
        ),
        (  # another thread's death is a traceback like any other: context, no crash
            "Exception in thread Thread-2 (_watchdog):",
            "/sgl/python/sglang/srt/utils/watchdog.py",
            "_watchdog",
            "traceback",
            "",
        ),
    ],
)
def test_a_thread_s_death_is_a_crash_only_when_the_thread_is_the_kv_transfer_s(
    first: str, path: str, function: str, kind: str, said: str
):
    record = f"{first}\n{TRACE.format(path=path, function=function)}"

    line = classify(parse_prefix(record), 2026)

    assert isinstance(line, ContextLine)
    assert line.kind == kind
    assert line.text == (said or record)


@pytest.mark.parametrize(
    "text",
    [
        "[gpu-7:12796:1:13303] Caught signal 11 (Segmentation fault: invalid permissions for mapped object at 0x7f)",
        "Fatal Python error: Segmentation fault",
        "Fatal Python error: Aborted",
    ],
)
def test_a_fatal_signal_is_a_crash_said_from_its_words_on(text: str):
    line = classify(parse_prefix(text), 2026)

    assert isinstance(line, ContextLine)
    assert (line.kind, line.text) == ("crash", text[text.find("C") if text.startswith("[") else 0 :])


INTERLEAVED = '  File "/opt/sglang/srt/disaggregation/common/utils.pyFatal Python error: "Segmentation fault'
"""Two processes' `faulthandler` dumps written into one stream (Mooncake issue #842, 2025-09: a decode that died in
`poll_and_all_reduce`): another thread's `File "` lands between Python's words and the signal's name."""


def test_a_fatal_signal_inside_another_dump_s_frame_is_a_crash_said_without_the_stray_quote():
    line = classify(parse_prefix(INTERLEAVED), 2026)

    assert isinstance(line, ContextLine)
    assert (line.kind, line.text) == ("crash", "Fatal Python error: Segmentation fault")


def test_a_check_of_a_log_whose_dumps_interleaved_is_critical(tmp_path: Path):
    """It said OK before: the stray quote hid the signal."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-03-04 05:06:07 TP1] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, pre-allocated "
        "usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, cuda graph: True\n"
        f"{INTERLEAVED}\n\n, line 61Thread 0x in 00007f2c11ffe640poll_and_all_reduce (most recent call first):\n"
    )

    result = kvtop_here("check", "--sglang-log", str(log))

    assert result.returncode == 2
    said = "KVTOP CRITICAL - decode-0/TP1 crashed at 05:06:07 (Fatal Python error: Segmentation fault); "
    assert result.stdout.startswith(said)


GLUED_GLOG = (
    '  File "/opt/sglang/srt/disaggregation/common/utils.pyE0914 07:12:40.331902  5120 transfer_engine.cpp:398] '
    "Failed to complete transfers after 60 seconds for batch 81"
)
"""A Mooncake glog error written into another process's dump in one stream: it starts mid-line, glued to a frame."""
GLUED_SAID = (
    "E0914 07:12:40.331902  5120 transfer_engine.cpp:398] Failed to complete transfers after 60 seconds for batch 81"
)


@pytest.mark.parametrize(
    "quoted",
    [
        "RuntimeError: the engine said E0914 07:12:40.331902 5120 transfer_engine.cpp:398] Failed to complete",
        "    raise RuntimeError('E0914 07:12:40.331902 5120 transfer_engine.cpp:398] Failed to complete')",
    ],
)
def test_a_glog_error_glued_mid_line_is_read_and_one_a_line_quotes_is_not(quoted: str):
    line = classify(parse_prefix(GLUED_GLOG), 2026)

    assert isinstance(line, ContextLine)
    assert (line.kind, line.text, line.ts) == ("glog", GLUED_SAID, stamp_seconds("2026-09-14 07:12:40") + 0.331902)
    assert classify(parse_prefix(quoted), 2026) is None


def test_a_check_of_a_log_with_a_glog_error_glued_into_a_dump_warns_of_it(tmp_path: Path):
    """It said OK before: the glog error began mid-line, so no line was one."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-09-14 07:12:39 TP0] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, pre-allocated "
        "usage: 0.00, #prealloc-req: 0, #transfer-req: 1, #retracted-req: 0, cuda graph: True\n"
        "Thread 0x00007f2c11ffe640 (most recent call first):\n"
        f"{GLUED_GLOG}\n, line 85 in group_concurrent_contiguous\n"
    )

    result = kvtop_here("check", "--sglang-log", str(log))

    assert result.returncode == 1
    assert result.stdout.startswith(
        f"KVTOP WARNING - 1 transport error in the logs, the last at 07:12:40: {GLUED_SAID}"
    )


BATCH_0912 = (
    "[2026-09-14 07:12:39 TP0] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, pre-allocated "
    "usage: 0.00, #prealloc-req: 0, #transfer-req: 1, #retracted-req: 0, cuda graph: True"
)


@pytest.mark.parametrize(
    "record",
    [
        "[2026-09-14 07:12:39 TP0] Unexpected transfer worker error for room 123\nTraceback (most recent call last):\n"
        f"{GLUED_GLOG}\n, line 85 in group_concurrent_contiguous\nRuntimeError: transfer of room 123 failed\n",
        f"[2026-09-14 07:12:39 TP0] Load weight end. elapsed=3.06 s, mem usage=1.39 GB. utils.py{GLUED_SAID}\n",
    ],
    ids=["inside-a-traceback", "after-a-dated-line"],
)
def test_a_glog_error_glued_into_a_traceback_or_a_dated_line_is_read_beside_it(tmp_path: Path, record: str):
    """It said nothing of the transport's error before: the glog line was part of a traceback's record, or of a
    dated line's message, and only a line of its own was looked at."""
    log = tmp_path / "decode.log"
    log.write_text(f"{BATCH_0912}\n{record}")

    result = kvtop_here("check", "--sglang-log", str(log))

    assert f"1 transport error in the logs, the last at 07:12:40: {GLUED_SAID}" in result.stdout
    failed = json.loads(kvtop_here("check", "--sglang-log", str(log), "--json").stdout)["rooms_failed"]
    assert failed == ("room 123" in record)  # the record it was glued into is read as before


def test_a_thread_death_names_the_rank_and_time_of_the_line_before_it_and_check_is_critical():
    result = kvtop_here("check", *THREAD_LOGS, "--json")

    assert result.returncode == 2
    assert json.loads(result.stdout)["ranks_crashed"] == {"prefill-0/TP1": THREAD_SAID}
    assert kvtop_here("check", *THREAD_LOGS).stdout.startswith(
        f"KVTOP CRITICAL - prefill-0/TP1 crashed at 14:31:38 ({THREAD_SAID})"
    )


def test_a_rank_whose_transfer_thread_died_stays_crashed_while_its_scheduler_logs_on():
    """Its batch lines after the death are no restart: the thread is still dead."""
    ranks = kvtop_here("ranks", *THREAD_LOGS)

    states = {line.split()[0]: line.split()[3] for line in ranks.stdout.splitlines()[1:3]}
    assert states["prefill-0/TP1"] == "crashed"
    assert f"crashed prefill-0/TP1 at 14:31:38: {THREAD_SAID}" in ranks.stdout.splitlines()


def test_the_rooms_that_waited_on_the_dead_thread_name_its_rank_as_what_broke():
    """decode's WaitingForInput timeouts name no prefill instance (the prefill side of decode-0); the one prefill
    rank read that crashed is what broke, 300 s before (a dead thread explains them past `CRASH_EXPLAINS_S`)."""
    incidents = json.loads(kvtop_here("incidents", *THREAD_LOGS, "--json").stdout)["incidents"]

    assert [(incident["suspect_text"], incident["evidence"]) for incident in incidents] == [
        (
            "prefill-0/TP1",
            [f"the KV never came (timeout_waiting); a transfer thread of it died {s} s before" for s in (300, 302)],
        )
    ]


def test_a_process_killed_by_a_signal_is_what_broke_for_the_peer_that_lost_it():
    incidents = json.loads(kvtop_here("incidents", *SIGNAL_LOGS, "--json").stdout)["incidents"]

    assert [(incident["suspect_text"], incident["evidence"]) for incident in incidents] == [
        ("prefill-0/TP0", ["decode lost its heartbeat; its process died 10 s before"])
    ]


def test_incidents_lists_the_crashed_ranks_under_its_table():
    result = kvtop_here("incidents", *SIGNAL_LOGS)

    assert result.stdout.splitlines()[2:] == [
        "crashed decode-1/TP0 at 09:43:41: Fatal Python error: Segmentation fault",
        "crashed prefill-0/TP0 at 09:43:43: Caught signal 11 (Segmentation fault: invalid permissions for mapped "
        "object at address 0x7fbd60001400)",
    ]


def test_the_span_read_runs_from_the_first_dated_line_to_the_last_marked_or_not():
    """prefill's last dated line is its bootstrap server's access line (no line kvtop reads): the span ends there,
    and `now` is never the wall clock for logs with a dated line."""
    model = ClusterModel()
    logs = load([SIGNAL / "prefill.log"], model)
    logs.close()

    assert (logs.start, logs.now) == (_at("2025-05-28 09:43:00"), _at("2025-05-28 09:43:43"))
    assert (
        kvtop_here("incidents", *THREAD_LOGS).stderr.splitlines()[-1].startswith("1 incident from 14:30:00 to 14:36:41")
    )


def _at(stamp: str) -> float:
    return parse_prefix(f"[{stamp}] x").ts or 0.0


def test_status_of_logs_that_name_no_rank_gives_no_failure_rate(tmp_path: Path):
    """sglang #6854's paste: the transfer engine's glog errors alone. No rank, so no rate, as `check` says (it said
    `failure rate 0.0%`)."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "E0603 20:16:59.104586 27322 worker_pool.cpp:271] Worker: Process failed for slice (opcode: 1, "
        "peer_nic: 10.93.81.13:15729@mlx5_0, retry_cnt: 0): transport retry counter exceeded\n"
    )

    status = kvtop_here("status", "--sglang-log", str(log))
    as_json = json.loads(kvtop_here("status", "--sglang-log", str(log), "--json").stdout)

    assert "no failure rate (no rank)" in status.stdout
    assert (as_json["failure_rate"], as_json["abort_rate"]) == (None, None)


def test_a_check_says_the_span_it_judged_in_whole_seconds_or_hours():
    """A recording's 15.0311 s read `15.0311s`, and a log a year long `3.1536e+07s`."""
    result = kvtop_here("check", *SIGNAL_LOGS)

    assert "1 room failed in 53s," in result.stdout
    assert [seconds(s) for s in (2.5, 15.0311, 60.0, 3599.6, 3.1536e7)] == ["2.5s", "15s", "60s", "3600s", "8760h00m"]


MOONCAKE_QP = (  # Mooncake #691 (2025-07): the RDMA endpoint's error, then the process dies
    "E0729 05:04:30.527725 14093 rdma_endpoint.cpp:70] Failed to create QP: Cannot allocate memory [12]\n"
    "Fatal Python error: Segmentation fault\n"
    "\n"
    "Thread 0x00007f2a53fff640 (most recent call first):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/mooncake/conn.py", line 697 in heartbeat_checker\n'
)


def test_a_crash_after_a_transfer_engine_s_glog_lines_takes_their_time_not_the_file_s(tmp_path: Path):
    """Mooncake #691 and PR #535 pasted stderr: glog lines, then a fatal signal, no SGLang line. The crash took the
    file's mtime (`crashed at 01:27:23` for a 05:04:30 paste) and the span stretched to it (`in 4016h10m`); the
    RDMA error (`Failed`, capital F, from `rdma_endpoint.cpp`) was not read at all."""
    log = tmp_path / "decode.log"
    log.write_text(MOONCAKE_QP)

    result = json.loads(kvtop_here("check", "--sglang-log", f"decode={log}", "--json").stdout)

    assert result["ranks_crashed"] == {"decode-0/TP0": "Fatal Python error: Segmentation fault"}
    assert result["summary"].startswith("decode-0/TP0 crashed at 05:04:30 (Fatal Python error: Segmentation fault)")
    assert result["transport_errors"] == 1
    assert "0 rooms failed in 1s" in result["summary"]


@pytest.mark.parametrize(
    "line",
    [
        "E0620 17:20:15.656373   293 rdma_context.cpp:116] Failed to create completion queue: Cannot allocate "
        "memory [12]",
        "E0523 06:18:19.069025  2716 rdma_endpoint.cpp:408] [Handshake] Failed to modify QP to RTR, check mtu, gid, "
        "peer lid, peer qp num: Connection timed out [110]",
        "E0529 23:23:04.136060 67574 rdma_context.cpp:203] Failed to register memory 0x7b3616000000: Bad address [14]",
    ],
)
def test_a_transfer_engine_s_error_from_any_of_its_sources_makes_a_check_warn(tmp_path: Path, line: str):
    """Mooncake's RDMA lines (PR #535, sglang #6548, #6753) beside a batch line: the check said OK."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2025-06-20 17:20:14 TP0] Prefill batch. #new-seq: 1, #new-token: 4, #cached-token: 0, token usage: 0.00, "
        f"#running-req: 0, #queue-req: 0, \n{line}\n"
    )

    result = kvtop_here("check", "--sglang-log", str(log))

    assert (result.returncode, result.stdout.split(" - ")[0]) == (1, "KVTOP WARNING")
    assert "1 transport error in the logs" in result.stdout


def test_a_line_that_tells_no_time_does_not_stretch_the_span_to_its_file_s_mtime(tmp_path: Path):
    """Mooncake #1207: a bare KVTransferError line (no prefix) beside a dated log took its file's mtime, and the
    check judged `0 rooms failed in 8581h20m` for lines one second apart."""
    dated, bare = tmp_path / "prefill.log", tmp_path / "proxy.log"
    dated.write_text("[2025-12-12 12:06:32] The server is fired up and ready to roll!\n")
    bare.write_text(
        "KVTransferError(bootstrap_room=6677116944225248479): Could not fetch prefill parallel info from "
        "bootstrap_addr: sglang-prefill-svc:30000\n"
    )

    result = kvtop_here("check", "--sglang-log", str(dated), "--sglang-log", str(bare))

    assert " in 1s," in result.stdout


def test_a_line_dated_past_any_event_s_time_does_not_move_the_span(tmp_path: Path):
    """One line dated 9999-12-31 made the logs' "now" 8000 years on: status said no failure in its window. Its time
    is set aside (said), its failure read at the time of the line before it."""
    failure = (
        "[2026-01-02 03:04:{s}.250 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r' "
        "decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): Request {room} "
        "timed out after 300.0s in KVPoll.WaitingForInput\n"
    )
    log = tmp_path / "decode.log"
    log.write_text(failure.format(s=10, room=1) + failure.format(s=11, room=2).replace("2026-01-02", "9999-12-31"))

    status = json.loads(kvtop_here("status", "--sglang-log", str(log), "--json").stdout)

    assert (status["rooms_failed"], status["rejected_events"]) == (2, 0)
    assert status["logs"]["misdated"]["decode-0"]["lines"] == 1


def test_a_thread_s_death_is_said_where_its_exception_was_raised_not_at_a_frame_printed_after_it():
    """Several processes' tracebacks interleaved in one stream (sglang PR #6720, NIXL, every prefill rank's
    bootstrap thread dying at once): the frame that raised the exception is the last one above its line."""
    record = (
        "Exception in thread Thread-5 (bootstrap_thread):\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.10/threading.py", line 953, in run\n'
        "    self._target(*self._args, **self._kwargs)\n"
        '  File "/sgl/python/sglang/srt/disaggregation/nixl/conn.py", line 351, in bootstrap_thread\n'
        '    required_dst_info_num = int(waiting_req_bytes[10].decode("ascii"))\n'
        "IndexError: list index out of range\n"
        '  File "/usr/lib/python3.10/threading.py", line 953, in run'
    )

    line = classify(parse_prefix(record), 2026)

    assert isinstance(line, ContextLine)
    assert line.text == (
        "thread Thread-5 (bootstrap_thread) died: IndexError: list index out of range, in "
        "sglang/srt/disaggregation/nixl/conn.py:351 bootstrap_thread"
    )


WATCHDOG = "".join(
    f"[2025-05-08 17:44:2{5 + i // 3}] Child process unexpectedly failed with an exit code 9. pid={147 + i}\n"
    for i in range(7)
)
"""SGLang's watchdog of its child processes before early 2026, once per child as it takes the server down (sglang
#6017, verbatim but for the order of the pids)."""


def test_a_child_process_sglang_s_watchdog_saw_die_is_a_crash(tmp_path: Path):
    """The watchdog's lines alone read `UNKNOWN - no rank named`: the server died."""
    log = tmp_path / "prefill.log"
    log.write_text(WATCHDOG)

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert "crashed at 17:44:25 (its child process pid=147 exited with code 9)" in check.stdout  # the first death


def test_the_watchdog_s_lines_after_a_scheduler_s_crash_leave_its_reason_in_place(tmp_path: Path):
    """The rank whose overlap thread raised is the crash; the children the watchdog then saw die are its aftermath
    (they named the last of them instead, hiding the exception)."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2025-05-08 17:44:22 DP8 TP8] TpModelWorkerClient hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/tp_worker.py", line 181, in forward_batch_generation\n'
        "    logits_output = self.model_runner.forward(forward_batch)\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n" + WATCHDOG
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert "prefill-0/TP8 crashed at 17:44:22 (TpModelWorkerClient hit an exception: RuntimeError: CUDA" in check.stdout


@pytest.mark.parametrize(
    ("loop", "role"), [("event_loop_overlap_disagg_decode", "decode"), ("event_loop_normal_disagg_prefill", "prefill")]
)
def test_a_crash_excerpt_tells_its_server_s_role_by_its_scheduler_loop(tmp_path: Path, loop: str, role: str):
    """A crash pasted without the server's start-up lines, in a file named for neither role (sglang #30242's decode),
    was a rank of no role (`server/TP1`): its traceback's scheduler loop tells which server it is."""
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-07-06 19:49:44 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        f'  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3120, in run_scheduler_process\n'
        f"    scheduler.{loop}()\n"
        '  File "/sgl/python/sglang/srt/layers/sampler.py", line 128, in forward\n'
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert f"{role}-0/TP1 crashed at 19:49:44" in check.stdout
