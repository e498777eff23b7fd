"""Every headless view on SGLang logs, run as the installed `kvtop` command."""

from __future__ import annotations

import calendar
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kvtop_cli import kvtop, kvtop_here
from sglang_lines import cut_log
from typer.testing import CliRunner

from kvtop.bench.sglang_log import FIRST_ROOM, write_failed_rooms
from kvtop.cli.app import command_line
from kvtop.model import cluster

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang" / "old-era"
LOGS = ("--sglang-log", str(FIXTURES / "prefill.log"), "--sglang-log", f"decode={FIXTURES / 'decode.log'}")


@pytest.mark.processes
@pytest.mark.parametrize("times", [("--since", "2099-01-01T00:00:00"), ("--at", "2020-01-01T00:00:00")])
def test_a_time_outside_what_the_logs_tell_is_refused_not_judged_ok(times: tuple[str, str]):
    """`check --since` past the logs' last line (a time of day is today's: the logs were older) said OK, exit 0,
    on logs that hold failures; views printed an empty cluster. Both say the span the logs' lines tell."""
    check = kvtop("check", *LOGS, *times)
    status = kvtop("status", *LOGS, *times)

    assert (check.returncode, status.returncode) == (3, 2)
    assert check.stdout.startswith(f"KVTOP UNKNOWN - {times[0]} ")
    assert "the logs' lines run from " in check.stdout and "the logs' lines run from " in status.stderr


@pytest.mark.processes
def test_failures_json_from_logs_has_each_origin_with_its_echoes_and_context():
    """Room 1111: origin prefill-0/TP1 send_failed, three echoes of unknown origin, the glog line as likely cause."""
    result = kvtop("failures", "--json", *LOGS)

    assert result.returncode == 0, result.stderr
    group = next(g for g in json.loads(result.stdout)["groups"] if g["room"] == 1111)
    assert (group["origin_label"], group["origin"]["reason_class"], group["origin"]["level"], group["echo_count"]) == (
        "prefill-0/TP1",
        "send_failed",
        "warning",
        3,
    )
    assert {echo["origin"] for echo in group["echoes"]} == {""}
    assert [line["kind"] for line in group["context"] if line["likely_cause"]] == ["glog"]
    assert "3 garbled (skipped)" in result.stderr


@pytest.mark.processes
def test_failures_text_from_logs_shows_likely_causes_and_unknown_origins():
    """The table names each origin once, shows the transport-library line under it, and "origin unknown"."""
    result = kvtop("failures", *LOGS)

    assert result.returncode == 0, result.stderr
    assert "likely cause" in result.stdout
    assert "origin unknown" in result.stdout


@pytest.mark.processes
def test_check_on_logs_that_hold_failures_is_critical_and_counts_log_ranks_apart():
    """Log ranks are neither alive nor gone and give no failure rate; the logs' incidents make the verdict, the
    first problem names the biggest one's suspect, with the class of most of its failure groups (a tie of the
    Bootstrapping timeout at 03:04:30 that starts it and a NIXL lost peer: its earliest failure's, docs/incidents.md),
    since that earliest failure. (Room 6666's refusal of a session whose decode rank answered in that second is the
    link's since 2026-12-06: the timeout no longer joins a `decode at 10.0.0.8:15005` incident.)"""
    result = kvtop("check", "--json", *LOGS)

    verdict = json.loads(result.stdout)
    assert (result.returncode, verdict["verdict"], verdict["ranks_log"], verdict["ranks_gone"]) == (
        2,
        "CRITICAL",
        4,
        [],
    )
    assert (verdict["failure_rate"], verdict["judged"]) == (None, "span")
    assert verdict["problems"][0].startswith(
        "incident: the decode side of prefill-0 stopped answering (timeout_bootstrap) since 03:04:30, 2 rooms"
    )


@pytest.mark.processes
def test_status_ranks_rooms_and_events_read_logs():
    """status shows log ranks and the parse counts; ranks says `log`; rooms lists the failed rooms; events shows
    one failure line per group, every other member at debug, the logged level kept as raw_level."""
    status = json.loads(kvtop("status", "--json", "--window", "600", *LOGS).stdout)
    ranks = json.loads(kvtop("ranks", "--json", *LOGS).stdout)
    rooms = json.loads(kvtop("rooms", "--json", *LOGS).stdout)
    events = [json.loads(line) for line in kvtop("events", "--jsonl", "--level", "debug", *LOGS).stdout.splitlines()]
    groups = json.loads(kvtop("failures", "--json", *LOGS).stdout)["groups"]

    assert (status["ranks"]["log"], status["logs"]["garbled"], status["logs"]["failures"]) == (4, 3, 25)
    assert {rank["state"] for rank in ranks} == {"log"}
    failures = [e for e in events if e["kind"] == "failure"]
    assert sorted(room["room"] for room in rooms) == sorted({e["room"] for e in failures})
    assert (len(failures), len(groups), sum(e["raw_level"] == "debug" for e in failures)) == (25, 13, 9)
    assert sum(e["level"] != "debug" for e in failures) == len(groups)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_json_from_log_files_holds_null_where_a_log_tells_nothing():
    """Logs time no transfer and tell no pid, CPU or memory: those are null in the JSON (never a made-up 0), the
    text shows `-`; what logs do tell (failures, rooms failed) stays a number."""
    runner = CliRunner()
    status = json.loads(runner.invoke(command_line(), ["status", "--json", "--window", "600", *LOGS]).stdout)
    ranks = json.loads(runner.invoke(command_line(), ["ranks", "--json", *LOGS]).stdout)
    text = runner.invoke(command_line(), ["ranks", *LOGS]).stdout

    assert (status["rooms_per_s"], status["gbps"], status["failure_rate"]) == (None, None, None)
    assert status["latency_s"] == {"p50": None, "p90": None, "p99": None}
    assert status["failures"] > 0 and status["rooms_failed"] > 0
    assert ranks and all((r["pid"], r["gbps"], r["cpu_percent"], r["rss_bytes"]) == (None,) * 4 for r in ranks)
    assert all(isinstance(r["origins"], int) for r in ranks)
    rows = [line.split() for line in text.splitlines()[1:] if "/TP" in line]
    assert rows and all(row[2] == "log" and row[3] in ("log", "suspect") and row[4:6] == ["-", "-"] for row in rows), (
        text
    )


def test_a_log_that_is_not_there_is_a_usage_error():
    """A missing file: exit 2 naming the option (UNKNOWN, 3, for check)."""
    failures = kvtop_here("failures", "--sglang-log", "/nonexistent/prefill.log")
    check = kvtop_here("check", "--sglang-log", "/nonexistent/prefill.log")

    assert (failures.returncode, check.returncode) == (2, 3)
    assert "--sglang-log" in failures.stderr


def test_a_folder_of_logs_is_a_usage_error_naming_the_files_in_it(tmp_path: Path):
    """`--sglang-log DIR` said `'DIR' is not a file that can be read`, as for a typo: it says it is a folder and names
    the logs in it to give one by one."""
    for name in ("prefill.log", "decode.log"):
        (tmp_path / name).write_text("")

    view = kvtop_here("status", "--sglang-log", str(tmp_path))
    check = kvtop_here("check", "--sglang-log", str(tmp_path))

    said = f"'{tmp_path}' is a folder: give --sglang-log once per server's log file (in it: decode.log, prefill.log)"
    assert (view.returncode, check.returncode) == (2, 3)
    assert view.stderr.rstrip().endswith(said) and check.stdout.rstrip().endswith(said), (view.stderr, check.stdout)


def test_logs_joined_by_a_comma_are_a_usage_error_saying_one_file_per_option():
    """`--sglang-log prefill.log,decode.log` (the help read `<list[str]>`) said only `does not exist`: it names
    the files it holds, to give one by one."""
    joined = f"{FIXTURES / 'prefill.log'},{FIXTURES / 'decode.log'}"

    view = kvtop_here("status", "--sglang-log", joined)

    assert view.returncode == 2
    assert view.stderr.rstrip().endswith(
        f"'{joined}' does not exist: files joined by a comma? give --sglang-log once per file"
    ), view.stderr


NOT_A_LOG = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
"""A file given by mistake (here /etc/passwd's shape): no line of an SGLang server log."""


def test_a_file_that_is_no_sglang_log_is_said_not_shown_as_a_cluster_with_nothing_in_it(tmp_path: Path):
    """Every view said nothing was wrong (an empty table, exit 0; check CRITICAL for no ranks): now exit 2 naming
    the file (check UNKNOWN: nothing it could judge)."""
    passwd = tmp_path / "passwd"
    passwd.write_text(NOT_A_LOG)

    ranks = kvtop_here("ranks", "--sglang-log", str(passwd))
    check = kvtop_here("check", "--sglang-log", str(passwd))

    said = (
        f"nothing to read in the logs given: {passwd}: not an SGLang server log (no line at its start or end is in "
        "SGLang's format)"
    )
    assert (ranks.returncode, ranks.stdout, ranks.stderr.strip()) == (2, "", f"kvtop: {said}")
    assert (check.returncode, check.stdout.strip()) == (3, f"KVTOP UNKNOWN - {said}")


RUNBOOK = """# On-call runbook: KV transfers
If decode logs `Lost connection with prefill instance`, the prefill server failed: check its bootstrap port.
A `KVTransferError` with `failed its checksum` means corrupt KV; a Traceback (most recent call last) means a crash.
"""
"""A file given by mistake that quotes SGLang's words (`bootstrap`, ` failed`, `Traceback`) without its lines."""


def test_a_file_that_only_quotes_sglang_words_is_no_log_either(tmp_path: Path):
    """A runbook or a README whose lines hold the words kvtop looks for was read as an empty healthy cluster (exit 0,
    empty tables: silence shown as health; only check said UNKNOWN); now refused as a file that is no log."""
    runbook = tmp_path / "runbook.md"
    runbook.write_text(RUNBOOK)

    views = {view: kvtop_here(view, "--sglang-log", str(runbook)) for view in ("status", "failures", "incidents")}
    check = kvtop_here("check", "--sglang-log", str(runbook))

    said = f"nothing to read in the logs given: {runbook}: not an SGLang server log"
    assert {view: (r.returncode, r.stdout) for view, r in views.items()} == {view: (2, "") for view in views}
    assert all(r.stderr.startswith(f"kvtop: {said}") for r in views.values()), views
    assert (check.returncode, check.stdout.startswith(f"KVTOP UNKNOWN - {said}")) == (3, True), check.stdout


def test_a_wrong_file_beside_logs_is_named_and_the_logs_are_read(tmp_path: Path):
    """Beside a real log, a file that is none (or is empty) is named in the summary; the log is read as ever."""
    passwd, empty = tmp_path / "passwd", tmp_path / "empty.log"
    passwd.write_text(NOT_A_LOG)
    empty.write_text("")

    result = kvtop_here("ranks", "--sglang-log", str(passwd), "--sglang-log", str(empty), *LOGS)

    assert result.returncode == 0 and "prefill-0/TP0" in result.stdout
    assert result.stderr.strip().endswith(
        f", nothing read from 2: {passwd}: not an SGLang server log (no line at its start or end is in SGLang's "
        f"format); "
        f"{empty}: empty"
    )


def test_an_empty_log_alone_is_nothing_to_show_and_nothing_to_judge(tmp_path: Path):
    """A log its server has not written yet: a view read once said nothing was wrong (an empty table, exit 0: silence
    shown as health); now exit 2 naming it, as for a file that is no log (`--follow` waits for it to grow); `check`
    has nothing to judge, UNKNOWN (it said CRITICAL for no ranks, as for a cluster that lost them all)."""
    empty = tmp_path / "server.log"
    empty.write_text("")

    views = {view: kvtop_here(view, "--sglang-log", str(empty)) for view in ("status", "ranks", "failures", "events")}
    check = kvtop_here("check", "--sglang-log", str(empty))

    said = f"kvtop: nothing to read in the logs given: {empty}: empty"
    assert {view: (r.returncode, r.stdout, r.stderr.splitlines()[-1]) for view, r in views.items()} == {
        view: (2, "", said) for view in views
    }
    assert check.returncode == 3
    assert check.stdout == f"KVTOP UNKNOWN - nothing to read in the logs given: {empty}: empty\n"


ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts"
ABORT_LOGS = ("--sglang-log", str(ABORTS / "prefill.log"), "--sglang-log", str(ABORTS / "decode.log"))


def failure_lines(*args: str) -> list[dict[str, object]]:
    result = kvtop("events", "--jsonl", *args, *ABORT_LOGS)
    assert result.returncode == 0, result.stderr
    return [event for line in result.stdout.splitlines() if (event := json.loads(line))["kind"] == "failure"]


@pytest.mark.processes
def test_events_show_one_line_per_failure_group_by_default():
    """Seven prefill ranks losing one decode peer are one WARNING line; every group shows its origin once."""
    shown = failure_lines()

    assert [(e["room"], e["rank"], e["level"], e["reason_class"]) for e in shown] == [
        (101, "prefill-0/TP2", "warning", "aborted"),
        (102, "decode-0/TP0", "error", "aborted"),
        (103, "prefill-0/TP5", "warning", "aborted"),
        (104, "prefill-0/TP4", "warning", "peer_lost"),
        (105, "decode-0/TP0", "error", "timeout_waiting"),
    ]


def test_events_take_json_as_every_other_view_does_and_print_json_lines():
    """`events --json` (the word every other view takes) was `No such option: --json`: a script written against
    `status --json` stopped at the tail. It is `--jsonl`'s other name: a tail is JSON Lines."""
    as_json, as_jsonl = kvtop_here("events", *LOGS, "--json"), kvtop_here("events", *LOGS, "--jsonl")

    assert (as_json.returncode, as_json.stdout) == (0, as_jsonl.stdout)
    assert [json.loads(line)["kind"] for line in as_json.stdout.splitlines()][:1] == ["failure"]


@pytest.mark.processes
def test_debug_events_show_every_member_at_debug_with_the_level_the_rank_logged():
    """With --debug the other six ranks of room 104 appear, at level debug, their raw_level still warning."""
    room = [e for e in failure_lines("--debug") if e["room"] == 104]

    assert [(e["level"], e["raw_level"]) for e in room] == [("warning", "warning")] + [("debug", "warning")] * 6


@pytest.mark.processes
def test_client_aborts_are_counted_apart_in_failures_status_and_check():
    """failures marks the aborted groups (echoes at debug, raw_level kept), status and check count 3 client
    aborts and 2 failures."""
    groups = json.loads(kvtop("failures", "--json", *ABORT_LOGS).stdout)["groups"]
    status = json.loads(kvtop("status", "--json", "--window", "600", *ABORT_LOGS).stdout)
    check = kvtop("check", "--json", "--window", "600", *ABORT_LOGS)

    assert [(g["room"], g["aborted"]) for g in groups] == [
        (101, True),
        (102, True),
        (103, True),
        (104, False),
        (105, False),
    ]
    lost_peer = next(g for g in groups if g["room"] == 104)
    assert {(e["level"], e["raw_level"]) for e in lost_peer["echoes"]} == {("debug", "warning")}
    assert (status["failures"], status["aborted"]) == (2, 3)
    verdict = json.loads(check.stdout)
    assert (check.returncode, verdict["aborted"]) == (2, 3)
    assert [incident["client"] for incident in verdict["incidents"]] == [False, False]  # aborts are no incident


@pytest.mark.processes
def test_max_abort_rate_is_a_check_threshold_in_its_perfdata_and_bounded():
    """--max-abort-rate 0.2 shows as abort_rate's WARNING;CRITICAL perfdata; 1.5 is a usage error (UNKNOWN). On
    logs the rate is undetermined (`U`, JSON null), as the failure rate: they name no room that succeeded (it
    said 0.0000 with every room the logs name aborted)."""
    capped = kvtop("check", "--max-abort-rate", "0.2", *ABORT_LOGS)
    wrong = kvtop("check", "--max-abort-rate", "1.5", *ABORT_LOGS)
    as_json = json.loads(kvtop("check", "--json", *ABORT_LOGS).stdout)

    assert (capped.returncode, wrong.returncode) == (2, 3)  # 2: the logs' two cluster incidents
    assert "aborted=3 abort_rate=U;0.1;0.2" in capped.stdout
    assert (as_json["failure_rate"], as_json["abort_rate"]) == (None, None)


FAILURE_LINE = (
    "[2026-01-02 03:04:05 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r' "
    "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): Request 7 timed out after "
    "300.0s in KVPoll.WaitingForInput\n"
)


@pytest.mark.processes
@pytest.mark.parametrize(("encoding", "order"), [("utf-16", "LE"), ("utf-16-be", "BE"), ("utf-16-le", "LE")])
def test_a_utf16_log_is_refused_with_one_line_not_read_as_no_failures(tmp_path: Path, encoding: str, order: str):
    """A UTF-16 log (with a byte order mark or without) said "0 failures, 0 garbled" and exit 0; now every view
    refuses it with one line naming its encoding (exit 2, check UNKNOWN)."""
    log = tmp_path / "decode.log"
    log.write_text(FAILURE_LINE * 3, encoding=encoding)

    failures = kvtop("failures", "--sglang-log", str(log))
    check = kvtop("check", "--sglang-log", str(log))

    assert (failures.returncode, failures.stdout, check.returncode) == (2, "", 3)
    assert failures.stderr.strip() == (
        f"kvtop: cannot read an SGLang log: {log} is UTF-16 {order}, not UTF-8 text: convert it first "
        f"(iconv -f UTF-16 -t UTF-8 {log} > log.txt)"
    )


@pytest.mark.processes
def test_a_utf8_log_with_a_byte_order_mark_reads_its_first_line_too(tmp_path: Path):
    """The mark before the first line's prefix hid the prefix: the line's time became the file's."""
    log = tmp_path / "decode.log"
    log.write_text(FAILURE_LINE, encoding="utf-8-sig")

    groups = json.loads(kvtop("failures", "--json", "--sglang-log", str(log)).stdout)["groups"]

    stamp = calendar.timegm((2026, 1, 2, 3, 4, 5, 0, 0, 0))
    assert [(g["room"], g["origin"]["reason_class"], g["origin"]["ts"]) for g in groups] == [
        (7, "timeout_waiting", stamp)
    ]


def test_failures_on_more_failed_rooms_than_the_model_keeps_say_how_many_more_in_text_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """2,000 failed rooms over two seconds, the model keeping 1,500 failures: the list ends with how many older
    failures it did not keep, the JSON carries the count; from a --since the kept ones reach, none was cut."""
    monkeypatch.setattr(cluster, "FAILURES_KEPT", 1_500)
    log = tmp_path / "decode-0.log"
    write_failed_rooms(log, 2_000)
    second = calendar.timegm((2026, 1, 2, 0, 0, 1))
    runner = CliRunner()

    text = runner.invoke(command_line(), ["failures", "--sglang-log", str(log)])
    listed = runner.invoke(command_line(), ["failures", "--json", "--sglang-log", str(log)])
    since = runner.invoke(command_line(), ["failures", "--json", "--sglang-log", str(log), "--since", str(second)])

    assert (text.exit_code, listed.exit_code, since.exit_code) == (0, 0, 0), text.stderr
    assert (
        text.stdout.splitlines()[-1] == "... and 500 more failures, older than these: the model keeps the newest 1,500"
    )
    groups, cut = json.loads(listed.stdout)["groups"], json.loads(listed.stdout)["not_kept"]
    assert (len(groups), cut, groups[0]["room"]) == (1_500, 500, FIRST_ROOM + 500)
    assert (len(json.loads(since.stdout)["groups"]), json.loads(since.stdout)["not_kept"]) == (1_000, 0)


@pytest.mark.processes
def test_the_prefill_whose_log_is_at_the_lost_address_reads_suspect():
    """Decode lost the prefill at 10.0.0.5:8998, whose own log was read as prefill-0: the incident names the
    address, and prefill-0/TP0 read `log` beside the decode ranks that noticed."""
    lost = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"
    ranks = kvtop("ranks", "--sglang-log", str(lost / "decode.log"), "--sglang-log", str(lost / "prefill.log"))

    states = {line.split()[0]: line.split()[3] for line in ranks.stdout.splitlines()[1:]}
    assert states == {"decode-0/TP0": "log", "decode-0/TP1": "log", "prefill-0/TP0": "suspect"}


def test_failures_debug_names_the_rank_of_each_context_line():
    """Both decode ranks log `Lost connection with prefill instance ..., 5 requests affected`: under each room the two
    lines read `lost_connection decode-0`, twice the same to the eye; each names its rank, TP0 first."""
    lost = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"
    result = kvtop_here("failures", "--debug", "--sglang-log", str(lost / "decode.log"))

    context = [line.split()[:3:2] for line in result.stdout.splitlines() if line.startswith("  lost_connection ")]
    assert context == [["lost_connection", "decode-0/TP0"], ["lost_connection", "decode-0/TP1"]] * 5


def test_an_agent_s_own_decode_log_read_alone_names_the_rank_that_sent_corrupt_kv(tmp_path: Path):
    """`kvtop cluster up --log-dir D` with a corrupting prefill rank: its prefill log holds no line of the rooms, so
    the room's prefill instance was unknown and `incidents --sglang-log D/*.log` blamed `the prefill side of
    decode-0`. The agent's checksum line names its sender's label; that rank is the suspect."""
    log = tmp_path / "decode-0.log"
    log.write_text(
        "".join(
            f"[2026-12-05 16:05:5{i} TP1] Decode transfer failed for request rank=1 decode_req.req.rid='r{i}' "
            f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): KV chunk 1 "
            f"of room {room} from prefill rank 1 (prefill-0/TP1) failed its checksum (page 4{i}: expected "
            f"afdbc2c87661f2d3, got 8246a4b32ca7511b)\n"
            for i, room in enumerate((1379139310825798417, 8227124511058525432))
        )
    )

    incidents = json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]

    assert [(incident["suspect_text"], incident["room_count"]) for incident in incidents] == [("prefill-0/TP1", 2)]


@pytest.mark.processes
def test_a_log_copied_mid_line_says_its_last_line_cut_and_reads_no_cut_address_into_an_incident(tmp_path: Path):
    """`check` on a decode log whose last line was cut inside its address (`bootstrap_addr: 1`) read that line as
    whole: a second incident, `the prefill side of decode-0`, of a room the cut line half named. The cut line is not
    read; check warns that it was cut, and so does `incidents` on stderr."""
    log = tmp_path / "decode.log"
    cut_log(log)

    check = kvtop("check", "--json", "--sglang-log", f"decode={log}")
    shown = kvtop("incidents", "--sglang-log", f"decode={log}")

    verdict = json.loads(check.stdout)
    assert [incident["headline"] for incident in verdict["incidents"]] == [
        "prefill at 10.0.0.5:8998 stopped answering (peer_lost)"
    ]
    assert f"warning: last line cut: not read in {log}" in verdict["summary"]
    assert f"last line cut: not read in {log}" in shown.stderr


def _piped(*args: str, data: bytes) -> subprocess.CompletedProcess[str]:
    """The installed `kvtop ARGS` with `data` piped into its stdin."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    done = subprocess.run([command, *args], input=data, capture_output=True, timeout=60, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.mark.processes
def test_a_log_piped_in_is_read_as_its_file_is():
    """`zcat x.gz | kvtop check --sglang-log decode=-` was refused (`'-' does not exist`): a piped log is copied to
    a file first and judged as the file is; a message about it names `stdin`, not the copy that is gone on exit."""
    decode = (FIXTURES / "decode.log").read_bytes()
    prefill = ("--sglang-log", str(FIXTURES / "prefill.log"))
    from_file = kvtop("check", *LOGS)
    piped = _piped("check", *prefill, "--sglang-log", "decode=-", data=gzip.compress(decode))
    dev_stdin = _piped("failures", *prefill, "--sglang-log", "decode=/dev/stdin", "--json", data=decode)
    files = kvtop("failures", *LOGS, "--json")
    garbage = _piped("check", "--sglang-log", "-", data=b"not a log\n")

    assert (piped.returncode, piped.stdout) == (from_file.returncode, from_file.stdout)
    assert from_file.returncode == 2
    assert json.loads(dev_stdin.stdout) == json.loads(files.stdout)
    assert garbage.returncode == 3
    assert "nothing to read in the logs given: stdin: not an SGLang server log" in garbage.stdout
    assert "kvtop-stdin" not in garbage.stdout


def test_a_log_piped_in_cannot_be_followed_and_stdin_holds_one_log():
    """A pipe is read to its end: `--follow` on it is bad usage saying to give the path, and a log sidecar (which
    waited for a file named `-`) refuses it; stdin named twice is said."""
    follow = kvtop_here("status", "--follow", "--sglang-log", "-")
    twice = kvtop_here("check", "--sglang-log", "-", "--sglang-log", "prefill=-")
    sidecar = kvtop_here("agent", "--sglang-log", "-")

    assert follow.returncode == 2
    assert "give the log's path to follow it" in follow.stderr
    assert twice.returncode == 3
    assert "stdin given twice as --sglang-log" in twice.stdout
    assert sidecar.returncode == 2
    assert "a sidecar follows a log file by its path" in sidecar.stderr
