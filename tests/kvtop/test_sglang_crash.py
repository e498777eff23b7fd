"""A scheduler that crashed (`Scheduler hit an exception: Traceback ...`): its rank is named crashed, and a check
of the logs is CRITICAL for it.

The fixture's shape is a public report's (Mooncake issue #1400, SGLang with Mooncake on 2026-01-16: a prefill
rank's `check_status` raised KeyError for a room it no longer knew, the scheduler died and SGLang took the server
down); `check --sglang-log` on it said OK before (the line was no failure and no context kvtop knew)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.keyframes import capture, restore
from kvtop.sources.sglang import load
from kvtop.sources.sglang.lines import ContextLine, classify, crash_text
from kvtop.sources.sglang.prefix import parse_prefix
from kvtop.sources.sglang.reader import LogReader
from kvtop.sources.sglang.source import SGLangLogs
from transport.plane.events import LogContext

CRASH = Path(__file__).parent / "fixtures" / "sglang" / "scheduler-crash"
"""prefill-0 (TP2's scheduler crashes at 22:03:02 with KeyError, the frame that raised it in SGLang's
`common/conn.py`) and decode-0, which loses the prefill instance 10 s later and fails two rooms."""
LOGS = ("--sglang-log", str(CRASH / "prefill.log"), "--sglang-log", str(CRASH / "decode.log"))
SAID = (
    "Scheduler hit an exception: KeyError: 4793981895866140836, in sglang/srt/disaggregation/common/conn.py:311 "
    "check_status"
)


def test_the_crash_comes_out_of_the_reader_as_one_record_with_its_traceback():
    """A prefixed line that logs a traceback keeps its unprefixed lines (only a line that began with one did)."""
    reader = LogReader(CRASH / "prefill.log")
    records = reader.read(final=True, max_bytes=1 << 20)
    reader.close()

    [crash] = [record for record in records if "Scheduler hit an exception" in record]
    assert crash.splitlines()[-1] == "KeyError: 4793981895866140836"
    assert len(crash.splitlines()) == 21  # the whole traceback, the line that logged it first


def test_a_crash_is_said_in_a_few_words_its_exception_and_where_it_was_raised():
    record = (CRASH / "prefill.log").read_text().split("\n", 2)[2].split("\n\n")[0]

    line = classify(parse_prefix(record), 2026)

    assert isinstance(line, ContextLine)
    assert (line.kind, line.tp, line.room, line.text) == ("crash", 2, None, SAID)


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ("Scheduler hit an exception: Traceback (most recent call last):\n  File \"/x/y.py\", line 3, in f\n",
         "Scheduler hit an exception: its traceback was cut, in y.py:3 f"),
        ("Scheduler hit an exception: Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory",
         "Scheduler hit an exception: RuntimeError: CUDA error: out of memory"),
        # SGLang issue #21292: another thread's faulthandler dump interleaved after the C++ frames
        ("Scheduler hit an exception: Traceback (most recent call last):\nframe #41: _PyObject_Call_Prepend + 0xc2\n"
         " (most recent call first):\ntransfer_worker791\n\n  in Thread 0x  File transfer_worker\"\n",
         "Scheduler hit an exception: its traceback was cut"),
        ("Scheduler hit an exception: Traceback (most recent call last):\nsocket.gaierror: [Errno -2] Name unknown",
         "Scheduler hit an exception: socket.gaierror: [Errno -2] Name unknown"),
        ("Scheduler hit an exception: Traceback (most recent call last):\nNIXL_ERR_NOT_FOUND",
         "Scheduler hit an exception: NIXL_ERR_NOT_FOUND"),
    ],
    ids=["cut-before-its-exception", "no-frame", "another-threads-dump-after-it", "lower-case-module", "bare-code"],
)  # fmt: skip
def test_a_crash_whose_traceback_was_cut_or_names_no_frame_says_what_it_has(record: str, said: str):
    assert crash_text(record) == said


def test_a_check_of_the_logs_is_critical_naming_the_crash_first():
    """The crash first (it is the cause), then the incident the decode side saw."""
    line = kvtop_here("check", *LOGS)
    as_json = kvtop_here("check", *LOGS, "--json")

    assert line.returncode == as_json.returncode == 2
    assert line.stdout.startswith(f"KVTOP CRITICAL - prefill-0/TP2 crashed at 22:03:02 ({SAID}); incident: ")
    assert json.loads(as_json.stdout)["ranks_crashed"] == {"prefill-0/TP2": SAID}


def test_a_check_from_after_the_crash_does_not_judge_it():
    """--since after the crash: the span judged holds the decode side's failures, not the crash."""
    result = kvtop_here("check", *LOGS, "--since", "2026-01-16 22:03:10", "--json")

    assert json.loads(result.stdout)["ranks_crashed"] == {}


def test_ranks_status_and_events_show_the_crash():
    ranks = kvtop_here("ranks", *LOGS)
    ranks_json = kvtop_here("ranks", *LOGS, "--json")
    status = kvtop_here("status", *LOGS, "--json")
    events = kvtop_here("events", *LOGS)

    assert f"crashed prefill-0/TP2 at 22:03:02: {SAID}" in ranks.stdout.splitlines()
    states = {line.split()[0]: line.split()[3] for line in ranks.stdout.splitlines()[1:5]}
    assert states == {"decode-0/TP0": "log", "decode-0/TP1": "log", "prefill-0/TP0": "log", "prefill-0/TP2": "crashed"}
    crashed = {rank["label"]: rank["crashed"] for rank in json.loads(ranks_json.stdout)}
    assert crashed["prefill-0/TP2"]["text"] == SAID and crashed["prefill-0/TP0"] is None
    assert json.loads(status.stdout)["ranks_crashed"]["prefill-0/TP2"]["text"] == SAID
    assert any(" prefill-0/TP2    ERROR   context   crash: " in line for line in events.stdout.splitlines())


def test_a_sidecar_publishes_the_crash_once_as_its_rank_s_event():
    """Given to the rank's events (what a sidecar publishes and a live model keeps), not also as a context line."""
    logs = SGLangLogs([CRASH / "prefill.log"])
    logs.fresh_context = []
    events = logs.poll(None, final=True)
    logs.close()

    crashes = [(label, event) for label, event in events if isinstance(event, LogContext)]
    assert [(label, event.kind, event.text) for label, event in crashes] == [("prefill-0/TP2", "crash", SAID)]
    assert all(context.kind != "crash" for context in logs.fresh_context)


RESTARTED = (
    "[2026-01-16 22:10:05 TP2] Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, token usage: 0.02, "
    "#running-req: 0, #queue-req: 0, #bootstrap-req: 0, #transferring-req: 0, input throughput (token/s): 1.00\n"
)
"""A batch line of the crashed rank seven minutes on: its server was restarted."""


def restarted_log(tmp_path: Path) -> Path:
    log = tmp_path / "prefill.log"
    log.write_text((CRASH / "prefill.log").read_text() + RESTARTED)
    return log


def test_a_rank_that_logs_again_after_its_crash_is_crashed_only_in_between(tmp_path: Path):
    """The crash stays on record (check judges it in its span), but the rank is no longer in a crashed state."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    logs = load([restarted_log(tmp_path)], model)
    crash = model.crashes["prefill-0/TP2"]

    assert model.crash_of("prefill-0/TP2", crash.ts - 1) is None  # not yet
    assert model.crash_of("prefill-0/TP2", crash.ts + 60) is crash
    assert model.crash_of("prefill-0/TP2", logs.now) is None  # logged again at 22:10:05
    assert model.crash_of("prefill-0/TP0", logs.now) is None


def test_ranks_says_when_a_crashed_rank_logged_again(tmp_path: Path):
    log = str(restarted_log(tmp_path))
    ranks = kvtop_here("ranks", "--sglang-log", log).stdout.splitlines()
    crashed = json.loads(kvtop_here("ranks", "--sglang-log", log, "--json").stdout)[1]["crashed"]

    assert [line.split()[3] for line in ranks[1:3]] == ["log", "log"]  # STATE: crashed no more
    assert f"crashed prefill-0/TP2 at 22:03:02: {SAID}; logged again at 22:10:05" in ranks
    assert crashed["text"] == SAID and crashed["logged_again"] == crashed["ts"] + 423
    assert kvtop_here("check", "--sglang-log", log).returncode == 2  # the crash was in the span read


def test_a_keyframe_keeps_the_crash_and_when_the_rank_logged_again(tmp_path: Path):
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    load([restarted_log(tmp_path)], model)

    restored = restore(capture(model), JOURNAL_EVENTS_KEPT)

    assert {label: crash.text for label, crash in restored.crashes.items()} == {"prefill-0/TP2": SAID}
    assert restored.logged_after_crash == model.logged_after_crash and model.logged_after_crash


@pytest.mark.parametrize(
    "wrapper",
    [
        "2026-01-16T22:03:02.123456789+08:00 stderr F ",
        "Jan 16, 2026 @ 22:03:02.123    ",
        "Jan 16 22:03:02 gpu-node-3 python3[4242]: ",
        "2026-01-16T22:03:02.123456789Z ",
        "ERROR 2026-01-16T22:03:02.821451064Z [severity: ERROR] ",
    ],
    ids=["container-runtime", "dashboard-export", "journalctl", "kubectl-timestamps", "cloud-logging"],
)
def test_a_crash_wrapped_by_a_log_shipper_line_by_line_says_the_same(tmp_path: Path, wrapper: str):
    """A shipper wraps every line of the traceback too: the record ended only at a line that began with `[`, so
    it ran on into the next record, and its last line (the exception) was read with the wrapper on."""
    log = tmp_path / "prefill.log"
    log.write_text("".join(f"{wrapper}{line}\n" for line in (CRASH / "prefill.log").read_text().splitlines() if line))

    result = kvtop_here("check", "--sglang-log", str(log), "--json")

    assert json.loads(result.stdout)["ranks_crashed"] == {"prefill-0/TP2": SAID}


def incident_suspects(*logs: Path) -> list[tuple[str, list[str]]]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    incidents = json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]
    return [(incident["suspect_text"], incident["evidence"]) for incident in incidents]


def test_the_incident_its_peers_saw_names_the_crashed_rank_as_what_broke():
    """decode-0 lost `10.0.0.1:8998`: the prefill log read there (its bootstrap port) has a rank whose scheduler
    crashed 10 s before, so that rank is the suspect (DOMAIN.md: a rank that died -> that rank)."""
    assert incident_suspects(CRASH / "prefill.log", CRASH / "decode.log") == [
        ("prefill-0/TP2", ["decode lost its heartbeat; its scheduler crashed 10 s before"])
    ]


def shifted(log: Path, tmp_path: Path, name: str, seconds: int = 0, port: str = "8998") -> Path:
    """`log` with every stamp `seconds` later and its bootstrap port `port`, as `tmp_path / name`."""
    text = log.read_text().replace("disaggregation_bootstrap_port=8998", f"disaggregation_bootstrap_port={port}")

    def later(stamp: re.Match[str]) -> str:
        return f"[{datetime.fromisoformat(stamp[1]) + timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S}"

    out = tmp_path / name
    out.write_text(re.sub(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", later, text, flags=re.MULTILINE))
    return out


@pytest.mark.parametrize(
    ("prefill_logs", "why"),
    [
        ([("prefill.log", -400, "8998")], "the crash was 410 s before: too long to explain the loss"),
        ([("prefill.log", 0, "8999")], "the log read is another address's (its bootstrap port)"),
        ([("a.log", 0, "8998"), ("b.log", 0, "8998")], "two logs at the port had a rank crash: which one is not known"),
    ],
    ids=["crash-long-before", "another-port", "two-candidates"],
)
def test_a_crash_that_cannot_explain_the_loss_leaves_the_address_the_suspect(
    tmp_path: Path, prefill_logs: list[tuple[str, int, str]], why: str
):
    logs = [shifted(CRASH / "prefill.log", tmp_path, name, seconds, port) for name, seconds, port in prefill_logs]
    crashed = json.loads(kvtop_here("ranks", *(f"--sglang-log={log}" for log in logs), "--json").stdout)
    assert sum(rank["crashed"] is not None for rank in crashed) == len(logs)  # each log's crash read

    [(suspect, evidence)] = incident_suspects(*logs, CRASH / "decode.log")

    assert (suspect, evidence) == ("prefill at 10.0.0.1:8998", ["decode lost its heartbeat"]), why


def test_a_restarted_rank_is_not_blamed_for_a_loss_after_its_restart(tmp_path: Path):
    """The crashed rank logged again before decode lost the address: its crash no longer explains it."""
    log = tmp_path / "prefill.log"
    log.write_text((CRASH / "prefill.log").read_text() + RESTARTED.replace("22:10:05", "22:03:08"))

    assert incident_suspects(log, CRASH / "decode.log") == [("prefill at 10.0.0.1:8998", ["decode lost its heartbeat"])]


def test_a_log_whose_lines_name_no_role_takes_it_from_its_file_name(tmp_path: Path):
    """A crash alone (no batch line, no failure line, no scheduler loop in its traceback tells its side) in
    `decode.log`: the rank is decode-0's, not `decode.log`'s with no role."""
    log = tmp_path / "decode.log"
    lines = (CRASH / "prefill.log").read_text().splitlines(True)[2:]
    log.write_text("".join(line for line in lines if "disagg_prefill" not in line))

    [rank] = json.loads(kvtop_here("ranks", "--sglang-log", str(log), "--json").stdout)

    assert (rank["label"], rank["role"], rank["crashed"]["text"]) == ("decode-0/TP2", "decode", SAID)


def test_a_crash_whose_shipper_stripped_the_indents_still_says_its_exception(tmp_path: Path):
    """Cloud Logging keeps each line's text without its leading blanks (SGLang issue #18980's log): the code lines
    and the `^^^^` marks under them look like the exception line; the exception is the line shaped as one."""
    wrapper = "ERROR 2026-01-16T22:03:02.821451064Z [severity: ERROR] "
    log = tmp_path / "prefill.log"
    log.write_text("".join(f"{wrapper}{line.lstrip()}\n" for line in (CRASH / "prefill.log").read_text().splitlines()))
    cut = tmp_path / "cut.log"  # the same, cut before its exception (as a report's excerpt is)
    cut.write_text("".join(log.read_text().splitlines(keepends=True)[:-3]))

    crashed = json.loads(kvtop_here("check", "--sglang-log", str(log), "--json").stdout)["ranks_crashed"]
    cut_short = json.loads(kvtop_here("check", "--sglang-log", str(cut), "--json").stdout)["ranks_crashed"]

    assert crashed == {"prefill-0/TP2": SAID}
    assert cut_short == {
        "prefill-0/TP2": "Scheduler hit an exception: its traceback was cut, in sglang/srt/disaggregation/common/"
        "conn.py:311 check_status"
    }


def test_a_crash_pasted_without_its_time_and_its_traceback_line_is_read(tmp_path: Path):
    """People take the time out of SGLang's prefix and the `Traceback ...` line out of a crash when they paste
    it (SGLang issue #20485): `[DP5 TP5 EP5 PP1] Scheduler hit an exception:` still names the crash of rank 5 of
    the second pipeline stage."""
    log = tmp_path / "prefill.log"
    log.write_text('[DP5 TP5 EP5 PP1] Scheduler hit an exception:\n  File "sglang/srt/managers/scheduler.py"\n')

    ranks = json.loads(kvtop_here("ranks", "--sglang-log", str(log), "--json").stdout)

    assert [(rank["label"], rank["crashed"]["text"]) for rank in ranks] == [
        ("prefill-0/PP1-TP5", "Scheduler hit an exception: its traceback was cut")
    ]
