"""`kvtop record` on a real faulty local cluster, and every view on what it recorded: the replay says what
the live views said at the same instants (noted as the test goes), a recorder killed with -9 leaves a
recording that replays up to the cut, and `kvtop dump` lists the events as JSON Lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvtop.cluster.local import demo_spec
from kvtop.record.format import BlockKind
from kvtop.record.reader import Recording
from tests.conftest import wait_for
from tests.kvtop.kvtop_cli import kvtop
from transport.config import Timeouts
from transport.harness.cluster import LocalCluster
from transport.harness.workload import Router, WorkloadSpec
from transport.kv.faults import FaultSpec

pytestmark = pytest.mark.processes

STABLE = ("ranks", "rooms_open", "rooms_failed", "failures", "aborted", "stuck", "gaps", "rejected_events",
          "rejected_frames", "rooms_lost", "top_origins")  # fmt: skip
"""What a one-shot live view and the recorder's model agree on once the cluster is quiet (rates and spans
depend on the instant asked; a one-shot view knows bytes only from the agents' bounded snapshots)."""


def _stable(status: dict[str, Any]) -> dict[str, Any]:
    links = [(link["prefill"], link["decode"], link["failed_rooms"]) for link in status["links"]]
    return {**{key: status[key] for key in STABLE}, "links": links}


def _failures(groups: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    found = [
        (g["room"], g["origin_label"], g["origin"] and g["origin"]["reason_class"], g["echo_count"]) for g in groups
    ]
    return sorted(found, key=str)


@dataclass
class Recorded:
    """What the live views said as the cluster ran, and the recordings made meanwhile."""

    folder: Path
    cut: Path
    """Recorded by a recorder killed with -9 after the second burst."""
    killed_at: float
    said: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """(instant, live `kvtop status --json`) after each burst, once the cluster was quiet."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Live `kvtop failures --json` at the end."""
    recorder_exit: int = -1
    recorder_stderr: str = ""


def _burst(endpoint: str, seconds: float, seed: int) -> None:
    router = Router(endpoint, WorkloadSpec(rate=40.0, median_pages=16, max_pages=64, seed=seed))
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            router.step()
            time.sleep(0.002)
    finally:
        router.close()


def _quiet_status(endpoint: str) -> dict[str, Any]:
    """Live `kvtop status --json` once the cluster is quiet: no room open, the same answer twice."""
    previous: list[dict[str, Any]] = [{}]

    def settled() -> dict[str, Any] | None:
        result = kvtop("status", "--json", "--bootstrap", endpoint)
        assert result.returncode == 0, result.stderr
        status: dict[str, Any] = json.loads(result.stdout)
        same = _stable(status) == _stable(previous[0]) if previous[0] else False
        previous[0] = status
        return status if same and status["rooms_open"] == 0 else None

    return wait_for(settled, timeout=60.0, what="a quiet cluster")


def _recorder(endpoint: str, folder: Path) -> subprocess.Popen[str]:
    """`kvtop record` into `folder`, its status lines (two a second) written to `folder`.stderr: into a pipe
    nobody read while the cluster ran, they filled it on a loaded machine and blocked the recorder."""
    command = [sys.executable, "-m", "kvtop", "record", "--bootstrap", endpoint, "--out", str(folder)]
    command += ["--keyframe-events", "1000"]  # keyframes forked in the bursts (the first: under the lock)
    with _stderr(folder).open("w") as stderr:
        return subprocess.Popen([*command, "--status", "--interval", "0.5"], stderr=stderr, text=True)


def _stderr(folder: Path) -> Path:
    return folder.with_suffix(".stderr")


def _wait_recording(process: subprocess.Popen[str], folder: Path) -> None:
    def heard_every_rank() -> bool:
        assert process.poll() is None, f"the recorder ended before it heard every rank: {_stderr(folder).read_text()}"
        return "ranks 4/4 alive" in _stderr(folder).read_text()

    wait_for(heard_every_rank, timeout=60.0, what="the recorder to hear every rank")


def _wait_recorded_past(folder: Path, instant: float) -> None:
    """Until the recording in `folder` holds an op after `instant` (the ranks' heartbeats are recorded too): a
    recorder that lags on a loaded machine may not have written what it took in before `instant` yet."""
    wait_for(lambda: Recording(folder).end > instant, timeout=60.0, what=f"{folder.name} recorded past {instant}")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """A 1P1D TP2 cluster whose prefill-0/TP0 corrupts 20 % of its chunks, three bursts of rooms, recorded
    by two `kvtop record` processes (one of them killed with -9 after the second burst)."""
    tmp = tmp_path_factory.mktemp("record")
    faults = {"prefill-0/TP0": (FaultSpec.parse("corrupt:0.2"),)}
    spec = demo_spec(1, 1, 2, faults, str(tmp / "logs"), Timeouts(bootstrap_s=5.0, waiting_s=5.0, transfer_s=2.0))
    with LocalCluster(spec) as cluster:
        endpoint = cluster.endpoint
        recorder, doomed = _recorder(endpoint, tmp / "rec"), _recorder(endpoint, tmp / "cut")
        try:
            _wait_recording(recorder, tmp / "rec")
            _wait_recording(doomed, tmp / "cut")
            found = Recorded(tmp / "rec", tmp / "cut", 0.0)
            for burst in range(3):
                _burst(endpoint, 1.0, seed=burst)
                status = _quiet_status(endpoint)
                found.said.append((time.time(), status))
                if burst == 1:
                    _wait_recorded_past(tmp / "cut", found.said[-1][0])
                    doomed.kill()
                    found.killed_at = time.time()
            result = kvtop("failures", "--json", "--bootstrap", endpoint)
            assert result.returncode == 0, result.stderr
            found.failures = json.loads(result.stdout)["groups"]
            _wait_recorded_past(tmp / "rec", found.said[-1][0])
            recorder.send_signal(signal.SIGTERM)
            found.recorder_exit = recorder.wait(timeout=30)
            found.recorder_stderr = _stderr(tmp / "rec").read_text()
            yield found
        finally:
            for process in (recorder, doomed):
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=10)


def test_the_recorders_keyframes_are_forked_and_none_failed(recorded: Recorded) -> None:
    """The recording holds keyframes beyond the first (taken by forked children of `kvtop record`, with its
    zmq threads running), and its status never said one failed."""
    blocks = Recording(recorded.folder).blocks
    assert sum(block.kind is BlockKind.KEYFRAME for block in blocks) >= 2
    assert "keyframes failed" not in recorded.recorder_stderr


def test_the_recorder_stops_cleanly_on_sigterm(recorded: Recorded) -> None:
    """SIGTERM: exit 0 and a last line saying what was recorded."""
    assert recorded.recorder_exit == 0, recorded.recorder_stderr
    assert "kvtop record: stopped;" in recorded.recorder_stderr


def test_status_replayed_at_an_instant_says_what_the_live_view_said_then(recorded: Recorded) -> None:
    """`kvtop status --replay --at T --json` equals the live answer noted at T, for each T noted."""
    assert any(status["rooms_failed"] for _, status in recorded.said), "the faults made rooms fail"
    for instant, live in recorded.said:
        result = kvtop("status", "--replay", str(recorded.folder), "--at", f"{instant:.6f}", "--json")
        assert result.returncode == 0, result.stderr
        assert _stable(json.loads(result.stdout)) == _stable(live)


def test_failures_over_the_whole_recording_are_what_the_live_view_said_at_its_end(recorded: Recorded) -> None:
    """Same origins, classes and echo counts as live `kvtop failures --json` at the end."""
    result = kvtop("failures", "--replay", str(recorded.folder), "--json")
    assert result.returncode == 0, result.stderr
    replayed = json.loads(result.stdout)["groups"]
    assert _failures(replayed) == _failures(recorded.failures)
    assert any(group["echo_count"] for group in replayed)


def test_a_recording_cut_by_kill_9_replays_up_to_the_cut(recorded: Recorded) -> None:
    """The killed recorder's recording ends between the last instant the live view was noted (quiet) and the
    kill, and its end replays the state noted then."""
    recording = Recording(recorded.cut)
    instant, live = recorded.said[1]
    assert instant < recording.end <= recorded.killed_at
    at_cut = kvtop("status", "--replay", str(recorded.cut), "--json")
    assert at_cut.returncode == 0, at_cut.stderr
    assert _stable(json.loads(at_cut.stdout)) == _stable(live)


def test_views_outside_the_recording_say_so_and_exit_2(recorded: Recorded) -> None:
    """--at after the recording's end: one line naming its span, exit 2."""
    result = kvtop("ranks", "--replay", str(recorded.folder), "--at", "now")
    assert result.returncode == 2
    assert "is outside the recording" in result.stderr


def test_dump_lists_the_recorded_events_as_json_lines(recorded: Recorded) -> None:
    """Every line is one event with its arrival, agent, incarnation and kind; failures are among them."""
    result = kvtop("dump", "--replay", str(recorded.folder))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"arrived", "agent", "incarnation", "seq", "source", "kind", "ts"} <= lines[-1].keys()
    assert sum(line["kind"] == "failure" for line in lines) >= len(recorded.failures)
    assert [line["arrived"] for line in lines] == sorted(line["arrived"] for line in lines)
