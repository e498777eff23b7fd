"""`kvtop cluster up` as an operator runs it: bad faults exit 2, an exiting rank is reported, --restart revives it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cluster_support import KVTOP
from kvtop_cli import kvtop, kvtop_here

from kvtop.sources.live import Collector
from transport.bootstrap import BootstrapClient
from transport.errors import TransportError
from transport.harness.cluster import ClusterSpec, LocalCluster


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("prefil-0=corrupt", "fault target 'prefil-0' matches no agent"),
        ("prefill-7=corrupt", "fault target 'prefill-7' matches no agent"),
        ("prefill-0/TP9=corrupt", "fault target 'prefill-0/TP9' matches no agent"),
        ("corrupt@nosuch", "peer 'nosuch' matches no agent on the other side"),
        ("decode-0=corrupt", "a decode rank acts only on die"),
    ],
    ids=["typo", "no-such-instance", "no-such-rank", "no-such-peer", "kind-decode-cannot-act-on"],
)
def test_cluster_up_exits_2_with_one_line_naming_the_agents_for_a_fault_that_reaches_none(fault, expected):
    """A --fault that would inject nothing stops `cluster up` before any agent starts: exit 2, one stderr line."""
    result = kvtop_here("cluster", "up", "--fault", fault, "--duration", "1")

    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtop: --fault: ")
    assert expected in lines[0]
    if "matches no agent" in expected:
        assert "this cluster has prefill-0, decode-0 (ranks TP0, TP1)" in lines[0]


@pytest.mark.processes
def test_cluster_up_with_its_default_faults_runs_and_exits_0_on_a_one_prefill_cluster(tmp_path):
    """The demo faults only name ranks that exist, so a 1P1D `cluster up` runs, moves rooms and exits 0, leaving
    no temporary log folder behind."""
    result = kvtop("cluster", "up", "--duration", "3", "--rate", "20", env={"TMPDIR": str(tmp_path)})

    assert result.returncode == 0, result.stderr
    assert list(tmp_path.glob("kvtop-logs-*")) == []
    assert result.stdout.startswith("tcp://127.0.0.1:")
    assert re.search(r"done: [1-9]\d* rooms ok, .*0 rank exits \(0 still down\)", result.stderr), result.stderr


@pytest.mark.parametrize("label", ["prefill-0/TP0", "decode-0/TP1"])
def test_the_die_fault_kills_the_rank_and_cluster_up_reports_it_at_once(cluster_up, tmp_path, label):
    """die on a prefill or a decode rank ends that process with SIGKILL; stderr names it, and the run exits 1."""
    running = cluster_up("--rate", "5", "--fault", f"{label}=die", "--log-dir", str(tmp_path))

    match = running.wait_line(rf"kvtop: rank {re.escape(label)} \(pid (\d+)\) killed by SIGKILL")

    pid = int(match[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert f"stderr in {tmp_path / label.replace('/', '-')}.stderr" in match.string
    running.wait_line(r"rooms ok \d+, failed [1-9]\d*, refused \d+, lost \d+, in flight")
    assert running.stop() == 1
    running.wait_line(r"done: .*, 1 rank exits \(1 still down\)", timeout_s=10)


def test_a_rank_lost_with_a_temporary_log_folder_is_said_with_its_stderr_not_a_path_removed_on_exit(
    cluster_up, tmp_path
):
    """Without --log-dir the agents' logs go to a temporary folder removed on exit: the exit line pointed at a
    stderr file there that was gone once the operator looked. It now says the stderr's last lines, and the folder's
    line says it is temporary."""
    running = cluster_up("--rate", "5", "--fault", "decode-0/TP1=die", env={"TMPDIR": str(tmp_path)})

    running.wait_line(r"agent logs .*\(temporary: removed on exit; --log-dir DIR keeps them\)")
    match = running.wait_line(r"kvtop: rank decode-0/TP1 \(pid \d+\) killed by SIGKILL; its stderr (ended: |was empty)")

    assert "stderr in" not in match.string
    assert running.stop() == 1
    assert list(tmp_path.glob("kvtop-logs-*")) == []


def test_the_status_line_says_no_room_starts_once_the_only_decode_instance_lost_a_rank(cluster_up, tmp_path):
    """The only decode instance down: every arrival was dropped without a word, and the line kept its `failed 0`
    as if healthy. It now leads with why no room starts and counts the arrivals dropped, as does the summary."""
    running = cluster_up("--rate", "20", "--fault", "decode-0/TP0=die", "--log-dir", str(tmp_path))

    running.wait_line(r"kvtop: rank decode-0/TP0 \(pid \d+\) killed by SIGKILL")
    running.wait_line(r"NO ROOM STARTS: no decode instance up \(a rank down\)  \|  rooms ok \d+, .*dropped [1-9]")
    assert running.stop() == 1
    running.wait_line(r"done: .*arrivals dropped, 1 rank exits \(1 still down\); no decode instance up", timeout_s=10)


def test_restart_brings_a_killed_rank_back_as_a_new_incarnation_the_collector_sees_without_a_gap(cluster_up, tmp_path):
    """SIGKILL of a rank under --restart: reported, started again (new pid and incarnation), rooms succeed again."""
    running = cluster_up("--rate", "10", "--fault", "none", "--restart", "--log-dir", str(tmp_path))
    with BootstrapClient(running.bootstrap) as client:
        old = next(a for a in client.list_agents() if a.label == "decode-0/TP0")
    collector = Collector(running.bootstrap).start()
    try:
        running.wait_line(r"rooms ok [1-9]")
        os.kill(old.pid, signal.SIGKILL)

        running.wait_line(rf"kvtop: rank decode-0/TP0 \(pid {old.pid}\) killed by SIGKILL")
        back = running.wait_line(r"kvtop: rank decode-0/TP0 is back: pid (\d+), restart 1")
        ok_then = int(running.wait_line(r"rooms ok (\d+)")[1])
        running.wait_line(rf"rooms ok (?!{ok_then}\b)\d+")

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with collector.lock:
                view = collector.model.ranks.get("decode-0/TP0")
                incarnation, pid = (view.incarnation, view.pid) if view else (0, 0)
            if incarnation not in (0, old.incarnation) and pid == int(back[1]):
                break
            time.sleep(0.1)
        assert (pid, incarnation != old.incarnation) == (int(back[1]), True), running.lines[-10:]
        with collector.lock:
            assert collector.model.gaps == 0, running.lines[-10:]
    finally:
        collector.close()
    assert running.stop() == 0, running.lines[-10:]
    assert (tmp_path / "decode-0-TP0.stderr").exists()


@pytest.mark.processes
def test_an_agent_that_crashes_leaves_its_traceback_in_the_log_folder(tmp_path):
    """An agent that cannot start (no pages for its pool) exits 1; its traceback is in LOG_DIR/<rank>.stderr."""
    cluster = LocalCluster(ClusterSpec(num_pages=0, log_dir=str(tmp_path)))

    with pytest.raises(TransportError) as raised:
        cluster.start(ready_timeout_s=30)

    assert "exited with code 1, see " in str(raised.value)
    named = re.search(r"exited with code 1, see (\S+?\.stderr)", str(raised.value))
    assert named is not None and Path(named[1]).parent == tmp_path  # the rank that exited first (any of them)
    stderr = Path(named[1]).read_text()
    assert "Traceback (most recent call last)" in stderr
    assert all(p.process.poll() is not None for p in cluster.processes)


@contextlib.contextmanager
def _held_port(port: int) -> Iterator[None]:
    """Keep the dead bootstrap's port bound, never listening, while its agents leave, so that no concurrent test's
    service takes it as its free port and answers their probes (they would then rightly ask it to deregister them:
    the likely cause of one CI failure where both decode ranks said nothing). A port bound with nobody listening
    refuses a connection as a free one does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside the dead service's TIME_WAITs
        held.bind(("127.0.0.1", port))
        yield


@pytest.mark.processes
def test_the_agents_of_a_cluster_killed_by_sigkill_exit_without_asking_its_dead_bootstrap(
    cluster_up, tmp_path, wait_for
):
    """SIGKILL takes the bootstrap service down with `kvtop cluster up`: its agents notice their parent gone, see
    that nothing listens at the bootstrap address, and exit without deregistering, each saying why. Before, each
    asked the dead service and waited out the deregistration's whole timeout (1 s) on its way out."""
    running = cluster_up("--duration", "60", "--fault", "none", "--log-dir", str(tmp_path))
    running.wait_line("local cluster up")
    agents = psutil.Process(running.process.pid).children(recursive=True)

    port = running.bootstrap.rpartition(":")[2]

    running.process.kill()

    running.process.wait(30)
    with _held_port(int(port)):
        wait_for(lambda: not any(agent.is_running() for agent in agents), timeout=30, what="every agent exited")
    logs = "".join(path.read_text() for path in sorted(tmp_path.glob("*.log")))
    left = re.findall(rf"(\S+) leaves without deregistering: nothing listens on 127\.0\.0\.1:{port}\b", logs)
    assert sorted(left) == ["decode-0/TP0", "decode-0/TP1", "prefill-0/TP0", "prefill-0/TP1"], logs


@pytest.mark.processes
def test_a_closed_terminal_sighup_stops_the_cluster_cleanly_as_ctrl_c_does(cluster_up, tmp_path):
    """SIGHUP killed it at once (exit 129): no `done:` line, its agents left for their parent-death check and its
    temporary log folder behind."""
    running = cluster_up("--duration", "60", env={"TMPDIR": str(tmp_path)})
    running.wait_line("local cluster up")
    agents = psutil.Process(running.process.pid).children(recursive=True)

    running.process.send_signal(signal.SIGHUP)

    assert running.process.wait(30) == 0
    assert running.wait_line(r"^done: ")
    assert not any(agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE for agent in agents)
    assert not list(tmp_path.glob("kvtop-logs-*"))


@pytest.mark.processes
def test_a_sigterm_while_the_agents_come_up_stops_the_cluster_cleanly(tmp_path, wait_for):
    """Stopped once its agents are started and before they all registered: it exited 130 with no line, its
    agents left for their parent-death check and its temporary log folder behind."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [KVTOP, "cluster", "up", "--duration", "60"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as process:
        cluster = psutil.Process(process.pid)
        agents = wait_for(lambda: cluster.children(recursive=True), timeout=30, what="agents started")
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, (stdout, stderr)
    assert "stopping the local cluster" in stderr and "done: " in stderr
    assert not any(agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE for agent in agents)
    assert not list(tmp_path.glob("kvtop-logs-*"))


def test_none_beside_a_fault_is_a_usage_error_saying_what_none_means():
    """`--fault none --fault drop` said `unknown fault kind 'none'`, though `none` is documented."""
    result = kvtop_here("cluster", "up", "--fault", "none", "--fault", "drop", "--duration", "1")

    assert result.returncode == 2
    assert result.stderr == "kvtop: --fault: 'none' means no faults: give it alone, or only the faults to inject\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--log-dir", "/etc/passwd"), "kvtop: --log-dir /etc/passwd: not a folder\n"),
        (("--host", "::1"), "kvtop: --host ::1: an IPv6 address; a local cluster binds IPv4 (127.0.0.1, or a host's "
         "address)\n"),
        (("--host", "nosuchhost.invalid", "--insecure"), "kvtop: --host nosuchhost.invalid: no IPv4 address for it ("),
    ],
    ids=["log-dir-a-file", "ipv6", "unresolvable"],
)  # fmt: skip
def test_a_log_folder_or_host_the_cluster_cannot_use_is_one_line_and_exit_2(args: tuple[str, ...], said: str):
    """They ended in a FileExistsError or a ZMQError ('No such device') traceback once agents were starting."""
    result = kvtop_here("cluster", "up", *args, "--duration", "1")

    assert result.returncode == 2
    assert result.stderr.startswith(said)


@pytest.mark.processes
def test_a_second_signal_while_the_cluster_stops_is_ignored_and_the_stop_ends_clean(cluster_up, tmp_path):
    """A Ctrl-C or SIGTERM landing in the stop of the agents cut it short: exit 130, no `done:` line, the agents
    left to their parent-death check."""
    running = cluster_up("--duration", "60", env={"TMPDIR": str(tmp_path)})
    running.wait_line("local cluster up")
    agents = psutil.Process(running.process.pid).children(recursive=True)

    running.process.send_signal(signal.SIGTERM)
    running.wait_line("stopping the local cluster")
    running.process.send_signal(signal.SIGINT)
    running.process.send_signal(signal.SIGTERM)

    assert running.process.wait(30) == 0, running.lines[-10:]
    assert running.wait_line(r"^done: ")
    assert not any(agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE for agent in agents)
    assert not list(tmp_path.glob("kvtop-logs-*"))


@pytest.mark.processes
def test_the_next_cluster_up_removes_the_log_folder_a_killed_one_left_and_no_other(cluster_up, tmp_path, wait_for):
    """A SIGKILLed `cluster up` cannot remove its temporary log folder: the next one does and says so. A folder of a
    live process and one named another way are left alone."""
    killed = cluster_up("--duration", "60", "--fault", "none", env={"TMPDIR": str(tmp_path)})
    killed.wait_line("local cluster up")
    agents = psutil.Process(killed.process.pid).children(recursive=True)
    (left,) = tmp_path.glob("kvtop-logs-*")
    killed.process.kill()
    killed.process.wait(10)
    wait_for(lambda: not any(a.is_running() and a.status() != psutil.STATUS_ZOMBIE for a in agents), timeout=30,
             what="the killed cluster's agents gone (their parent-death check)")  # fmt: skip
    live = tmp_path / f"kvtop-logs-{os.getpid()}-live"
    other = tmp_path / "kvtop-logs-notapid"
    for kept in (live, other):
        kept.mkdir()
        (kept / "decode-0.log").write_text("kept\n")
    assert (left / "decode-0.log").exists()

    result = kvtop("cluster", "up", "--duration", "1", "--fault", "none", env={"TMPDIR": str(tmp_path)})

    assert result.returncode == 0, result.stderr
    assert f"kvtop: removed {left}: the log folder of a local cluster that was killed\n" in result.stderr
    assert sorted(tmp_path.glob("kvtop-logs-*")) == sorted([live, other])
