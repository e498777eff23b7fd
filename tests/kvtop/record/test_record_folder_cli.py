"""`kvtop record` on a real cluster where its folder is not its own: a second recorder on the folder exits 1
naming the first (until the first dies), a write that fails stops it with one line and counts what it
dropped, and a cap too small for a ring is a usage error."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtop.cluster.local import demo_spec
from kvtop.model.cluster import ClusterModel
from kvtop.record.writer import Recorder
from tests.kvtop.kvtop_cli import StderrLines, kvtop, kvtop_here
from transport import Role
from transport.bootstrap import BootstrapServer
from transport.config import Timeouts
from transport.harness.cluster import LocalCluster
from transport.harness.workload import Router, WorkloadSpec

FILE_LIMIT = 32 << 10
"""The largest file the recorder of the failing-write test may write (RLIMIT_FSIZE: a write past it fails
with EFBIG, as one on a full disk fails with ENOSPC)."""


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 1P1D TP1 cluster's bootstrap address."""
    logs = tmp_path_factory.mktemp("logs")
    spec = demo_spec(1, 1, 1, {}, str(logs), Timeouts(bootstrap_s=5.0, waiting_s=5.0, transfer_s=2.0))
    with LocalCluster(spec) as cluster:
        yield cluster.endpoint


def _record(endpoint: str, folder: Path, *options: str, file_limit: int = 0) -> subprocess.Popen[str]:
    """A `kvtop record` process (`file_limit`: its RLIMIT_FSIZE, 0 for none)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    command = [sys.executable, "-m", "kvtop", "record", "--bootstrap", endpoint, "--out", str(folder), *options]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limit if file_limit else None)


def _recording(process: subprocess.Popen[str]) -> None:
    """Wait until the recorder says it records."""
    assert process.stderr is not None
    line = process.stderr.readline()
    assert line.startswith("kvtop record: recording"), line


@pytest.mark.processes
def test_a_second_recorder_on_a_folder_exits_1_naming_the_first_ones_pid_until_the_first_dies(
    endpoint: str, tmp_path: Path
) -> None:
    """The second `kvtop record` on a folder says one line naming the first's pid and exits 1, before it
    connects; once the first is killed (-9: no clean exit), the folder's lock is gone and a recorder runs."""
    folder = tmp_path / "rec"
    first = _record(endpoint, folder)
    try:
        _recording(first)
        second = kvtop("record", "--bootstrap", endpoint, "--out", str(folder), "--duration", "1")
        assert second.returncode == 1
        assert second.stderr == f"kvtop: another kvtop (pid {first.pid}) records into {folder}\n"
    finally:
        first.kill()
        first.communicate(timeout=10)
    third = kvtop("record", "--bootstrap", endpoint, "--out", str(folder), "--duration", "1")
    assert third.returncode == 0, third.stderr


@pytest.mark.processes
def test_a_write_that_fails_stops_the_recorder_with_one_line_and_counts_the_ops_it_dropped(
    endpoint: str, tmp_path: Path
) -> None:
    """Rooms recorded until the segment reaches the file size limit in a block of ops (the cluster fails no
    room and the one keyframe is the first block): exit 1, no traceback, the reason said once, the ops that
    were not written counted on the last status line; what was written replays."""
    folder = tmp_path / "rec"
    recorder = _record(endpoint, folder, file_limit=FILE_LIMIT)
    router = Router(endpoint, WorkloadSpec(rate=100.0, median_pages=16, max_pages=64, seed=1))
    try:
        _recording(recorder)
        deadline = time.monotonic() + 60
        while recorder.poll() is None and time.monotonic() < deadline:
            router.step()
            time.sleep(0.002)
        _, stderr = recorder.communicate(timeout=10)
    finally:
        router.close()
        if recorder.poll() is None:
            recorder.kill()
            recorder.communicate(timeout=10)
    assert recorder.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if "File too large" in line] == [
        f"kvtop: recording to {folder} stopped: File too large"
    ]
    stopped = next(line for line in stderr.splitlines() if line.startswith("kvtop record: stopped;"))
    assert " ops dropped" in stopped, stderr
    replayed = kvtop("status", "--replay", str(folder), "--json")
    assert replayed.returncode == 0, replayed.stderr


def test_a_cap_below_the_smallest_ring_is_a_usage_error() -> None:
    """`--max-bytes 64KiB`: exit 2 with one line naming the least cap, before any source is opened."""
    done = kvtop_here("record", "--bootstrap", "tcp://127.0.0.1:9", "--max-bytes", "64KiB")
    assert done.returncode == 2
    assert "'64KiB' is below 1MiB" in done.stderr


def test_a_bad_out_retain_or_cap_is_a_usage_error_naming_its_option(tmp_path: Path) -> None:
    """`--out` a file said `cannot record to FILE: File exists`, exit 1 (the work failed, not the usage); `--retain
    forever` said `Invalid value: 'forever' ...` without naming the option. Each is now exit 2 naming it."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a recording\n")
    bootstrap = ("record", "--bootstrap", "tcp://127.0.0.1:9")

    out = kvtop_here(*bootstrap, "--out", str(a_file))
    retain = kvtop_here(*bootstrap, "--out", str(tmp_path / "rec"), "--retain", "forever")
    cap = kvtop_here(*bootstrap, "--out", str(tmp_path / "rec"), "--max-bytes", "lots")

    assert (out.returncode, retain.returncode, cap.returncode) == (2, 2, 2)
    assert f"Invalid value for --out: '{a_file}' is a file: a recording is a folder" in out.stderr, out.stderr
    assert "Invalid value for --retain: 'forever' is not a duration" in retain.stderr, retain.stderr
    assert "Invalid value for --max-bytes: 'lots' is not a size" in cap.stderr, cap.stderr
    assert not (tmp_path / "rec").exists()


def _empty_recording(out: Path) -> None:
    """A recording of a cluster with no agent: one keyframe of an empty model."""
    recorder = Recorder(out, flush_s=3600.0)
    recorder.tick(ClusterModel(), time.time())
    recorder.close()


def test_a_recording_of_no_agent_is_nothing_to_show_and_nothing_to_judge(tmp_path: Path):
    """`status --replay` of a recording that holds no agent said `ranks 0 from logs`, exit 0 (silence shown as
    health): now exit 2 saying it holds no agent (`check`: test_check.py)."""
    out = tmp_path / "rec"
    _empty_recording(out)

    status = kvtop_here("status", "--replay", str(out))
    failures = kvtop_here("failures", "--replay", str(out))

    assert [(r.returncode, r.stdout) for r in (status, failures)] == [(2, ""), (2, "")]
    assert "the recording holds no agent" in status.stderr


def test_a_record_that_never_reached_its_cluster_leaves_nothing_behind(tmp_path: Path) -> None:
    """A dead bootstrap: exit 1, and the folder it made (lock file, a ~400-byte segment of an empty keyframe) is
    removed; a folder it was given keeps what it held, a recording its segments."""
    made, given, recording = tmp_path / "made", tmp_path / "given", tmp_path / "recording"
    given.mkdir()
    _empty_recording(recording)
    held = sorted(recording.iterdir())
    dead = ("record", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5", "--out")

    codes = [kvtop_here(*dead, str(out)).returncode for out in (made, given, recording)]

    assert codes == [1, 1, 1]
    assert not made.exists()
    assert list(given.iterdir()) == []
    assert sorted(recording.iterdir()) == held


def test_an_out_folder_of_other_files_is_refused_naming_it(tmp_path: Path) -> None:
    """A folder that holds files and no recording (a home folder, a project's): exit 2 naming it and what it holds,
    before anything is written in it; it was recorded into in silence."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")

    done = kvtop_here("record", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5", "--out", str(folder))

    assert done.returncode == 2, done.stderr
    assert f"Invalid value for --out: '{folder}' holds other files (notes.txt) and no recording" in done.stderr
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


@pytest.mark.processes
def test_a_record_started_before_any_agent_says_so_and_records_the_first_that_registers(
    tmp_path: Path, bootstrap: BootstrapServer, make_manager, wait_for
) -> None:
    """A bootstrap that lists no agent yet: the recorder went on in silence (`ranks 0/0 alive` only with
    --status); now it says no agent answered, records on, says when one does, and that one is in the recording."""
    out = tmp_path / "rec"
    command = [
        sys.executable,
        "-m",
        "kvtop",
        "record",
        "--bootstrap",
        bootstrap.endpoint,
        "--wait",
        "0.5",
        "--duration",
        "60",
    ]
    process = subprocess.Popen([*command, "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        said = [process.stderr.readline() for _ in range(2)]
        make_manager(Role.PREFILL, "prefill-7")
        said.append(wait_for(process.stderr.readline, timeout=30, what="the recorder's next line"))
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)

    assert process.returncode == 0, rest
    assert said[1].startswith(f"kvtop record: no agent listed by {bootstrap.endpoint} (none registered there, ")
    assert said[2].startswith("kvtop record: an agent answered after ")
    ranks = kvtop_here("ranks", "--replay", str(out), "--json")
    assert [rank["label"] for rank in json.loads(ranks.stdout)] == ["prefill-7/TP0"], ranks.stderr


@pytest.mark.processes
def test_a_record_says_once_when_every_agent_it_heard_goes_quiet_and_when_one_answers_again(
    tmp_path: Path, bootstrap: BootstrapServer, make_manager
) -> None:
    """The recorder heard prefill-7, which then stopped: it recorded on and said nothing (a cluster gone quiet read
    as a healthy one). Now it says once that no agent was heard for longer than --wait, and again when one answers."""
    first = make_manager(Role.PREFILL, "prefill-7")
    command = [sys.executable, "-m", "kvtop", "record", "--bootstrap", bootstrap.endpoint, "--wait", "2",
               "--duration", "120", "--status", "--interval", "0.5", "--out", str(tmp_path / "rec")]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines = StderrLines(process)
    try:
        while "ranks 1/1 alive" not in lines.next("kvtop record: "):
            pass

        first.close()

        quiet = lines.next("kvtop record: no agent heard for ")
        make_manager(Role.PREFILL, "prefill-8")
        again = lines.next("kvtop record: an agent answered again after ")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)

    assert process.returncode == 0, lines.seen
    assert quiet.endswith("; recording on: agents are recorded as they answer"), quiet
    assert float(quiet.split(" for ")[1].split("s ")[0]) >= 2.0
    opening, *rest = lines.seen
    assert opening.startswith(f"kvtop record: recording {bootstrap.endpoint} to "), opening
    assert [line for line in rest if "; ranks " not in line] == [quiet, again], lines.seen  # status lines aside


def test_a_record_no_agent_ever_answered_exits_1_saying_the_recording_holds_none(tmp_path: Path) -> None:
    """An endpoint nobody serves for the whole run: exit 0 and an empty recording, as if it had recorded; now
    exit 1 with one line (the recording, of nothing, is kept)."""
    done = kvtop_here("record", "--connect", "tcp://127.0.0.1:9", "--wait", "0.5", "--duration", "1", "--out",
                      str(tmp_path / "rec"))  # fmt: skip

    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "kvtop: no agent answered while it recorded (tcp://127.0.0.1:9): the recording holds none"
    )


@pytest.mark.processes
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT], ids=["sighup", "ctrl-c"])
def test_a_closed_terminal_or_ctrl_c_stops_the_recorder_as_cleanly_as_sigterm(
    endpoint: str, tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGHUP (an ssh session that dropped) killed the recorder at once (-1): no last flush, no `stopped` line;
    a second signal right behind the first cut the last flush short (-2, or exit 0 saying it never began)."""
    folder = tmp_path / "rec"
    process = _record(endpoint, folder)
    try:
        _recording(process)
        process.send_signal(signum)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert stderr.startswith("kvtop record: stopped; ") and "before it began" not in stderr, stderr
    assert kvtop("dump", "--replay", str(folder)).stderr == ""


@pytest.mark.processes
def test_a_record_stopped_within_its_wait_is_not_judged_a_cluster_that_never_answered(
    tmp_path: Path, bootstrap: BootstrapServer
) -> None:
    """Stopped before its --wait ran out, its agents had not had their time to answer: it exited 1 saying none
    answered (a recorder SIGINTed right after it started, beside agents it had not heard yet)."""
    process = _record(bootstrap.endpoint, tmp_path / "rec", "--wait", "60")
    try:
        _recording(process)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()

    assert process.returncode == 0, stderr
    assert "no agent answered" not in stderr
