"""A view through a relay whose upstream relay died names that relay, not the ranks behind it, and calls those ranks
unheard (not gone) in every view: the ranks table, `status`, `check`, a dashboard's model, its recording.

Real processes: a cluster's agents, `kvtop relay` on its bootstrap (the rack relay), a second `kvtop relay` on the
first, and the views on the second (a dashboard's model process among them); the rack relay is killed.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cluster_support import KVTOP, small_cluster
from kvtop_cli import kvtop

from kvtop.attach.runtime import RUNTIME_ENV
from kvtop.cli.model_spec import LiveModel
from kvtop.model.cluster import ClusterModel
from kvtop.model.shapes import GONE_S, Liveness
from kvtop.record.dashboard import RecordChoice
from kvtop.sources.live import Collector
from kvtop.tui.model_client import ModelProcess
from tests.conftest import wait_for
from transport.bootstrap import BootstrapClient, BootstrapServer
from transport.plane.relay import Relay

pytestmark = pytest.mark.processes


@contextmanager
def relay_process(*upstream: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`kvtop relay UPSTREAM...` running, and its address (the one views take as --relay)."""
    process = subprocess.Popen([KVTOP, "relay", *upstream], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "--relay " in line, (line, process.stderr.read() if process.poll() is not None else "")
        yield process, line.rsplit("--relay ", 1)[1].rstrip(")\n")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def discovery_errors(address: str) -> int:
    with BootstrapClient(address, timeout_s=2.0, service="relay") as client:
        return client.listing().counters["discovery_errors"]


def ranks_table(*source: str) -> list[dict[str, object]]:
    """`kvtop ranks SOURCE --json`."""
    listed = kvtop("ranks", *source, "--json")
    assert listed.returncode == 0, listed.stderr
    ranks = json.loads(listed.stdout)
    assert isinstance(ranks, list)
    return ranks


def silent_past_gone(*source: str) -> list[dict[str, object]] | None:
    """The ranks table once every rank was silent past `GONE_S` (it would be gone but for the relay's word)."""
    ranks = ranks_table(*source)
    return ranks if all(float(str(rank["last_seen_s"])) > GONE_S for rank in ranks) else None


def test_a_view_through_a_relay_whose_upstream_relay_died_names_it_not_the_ranks(make_cluster) -> None:
    """The cluster relay kept listing the four ranks it had from the dead rack relay; `check` called each one gone
    (no answer) and `status` said no agent answered, with no word of why. Now both say the upstream relay stopped
    answering, by its address, and `check` names that as the finding, the ranks behind it unheard, not gone.

    `check` also said `0 ranks alive, need 4` as if the ranks were dead: it now says they are unheard behind the
    relay. `status` and `ranks` printed nothing (exit 1): they now show the ranks unheard and the dead upstream
    (still exit 1: no agent answered), and `status --follow` exited 1 at once: it goes on, saying so."""
    cluster = make_cluster(small_cluster(prefill_tp=2, decode_tp=2))
    ranks = sorted(agent.label for agent in cluster.agents())
    with (
        relay_process("--bootstrap", cluster.endpoint) as (rack, rack_address),
        relay_process("--relay", rack_address) as (_, address),
    ):
        rack.kill()
        rack.wait(30)
        wait_for(lambda: discovery_errors(address) > 0, 10, "the cluster relay noticed its upstream is down")
        stopped = f"relay {rack_address} stopped answering (none within 1.0s)"  # it answered before: no hint of keys
        lost = f"upstream stopped answering the relay at {address}: {stopped}"

        check = kvtop("check", "--relay", address, "--wait", "2", "--json")
        status = kvtop("status", "--relay", address, "--wait", "2")
        status_json = kvtop("status", "--relay", address, "--wait", "2", "--json")
        listed = kvtop("ranks", "--relay", address, "--wait", "2", "--json")
        followed = following_status(address, f"source  {lost}")

    result = json.loads(check.stdout)
    assert (check.returncode, result["verdict"]) == (2, "CRITICAL"), check.stdout
    assert result["problems"][0] == f"{lost}; ranks behind it unheard: {', '.join(ranks)}"  # no hint of CURVE keys
    assert (result["ranks_gone"], result["ranks_unheard"]) == ([], ranks)
    assert not any("ranks gone" in problem for problem in result["problems"]), result["problems"]
    behind = f"({len(ranks)} unheard behind the relay at {address}, whose upstream stopped answering)"
    assert result["problems"][1:] == [f"0 ranks alive, need {len(ranks)} {behind}"], result["problems"]
    assert status.returncode == 1, status.stderr
    unheard = f"{len(ranks)} unheard (behind the relay at {address}, whose upstream stopped answering)"
    assert f"ranks   0/{len(ranks)} alive, 0 stale, 0 gone, {unheard}" in status.stdout, status.stdout
    assert f"source  {lost}; ranks behind it unheard: {', '.join(ranks)}" in status.stdout, status.stdout
    assert status.stderr.startswith(f"kvtop: {lost}"), status.stderr
    assert status.stderr.endswith(f"; no agent answered within 2s (listed by {address})\n"), status.stderr
    said = json.loads(status_json.stdout)
    assert (status_json.returncode, said["upstream_errors"], said["ranks_kept"]) == (1, [stopped], ranks)
    assert listed.returncode == 1, listed.stderr
    assert {str(rank["label"]): rank["state"] for rank in json.loads(listed.stdout)} == dict.fromkeys(ranks, "unheard")
    assert followed == 0


def following_status(address: str, said: str) -> int:
    """`kvtop status --relay ADDRESS --follow` until a frame says `said`, then Ctrl-C: its exit code."""
    command = [KVTOP, "status", "--relay", address, "--follow", "--interval", "0.2"]
    view = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # None: its stdout ended
    assert view.stdout is not None
    threading.Thread(target=lambda: [*map(lines.put, view.stdout or ()), lines.put(None)], daemon=True).start()

    def saying() -> bool:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            return False
        assert line is not None, f"the followed view ended (exit {view.wait(30)}) before saying {said!r}"
        return said in line

    try:
        wait_for(saying, 15, f"the followed view said {said!r}")
    finally:
        view.send_signal(signal.SIGINT)
        view.wait(30)
    return view.returncode


def test_a_status_following_through_the_relay_says_when_its_upstream_relay_dies(make_cluster) -> None:
    """`kvtop status --follow` connected before the rack relay died: its ranks went silent with no word of why;
    now a `source` line names the upstream relay that stopped answering."""
    cluster = make_cluster(small_cluster())
    with (
        relay_process("--bootstrap", cluster.endpoint) as (rack, rack_address),
        relay_process("--relay", rack_address) as (_, address),
    ):
        command = [KVTOP, "status", "--relay", address, "--follow", "--interval", "0.2"]
        view = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        assert view.stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in view.stdout or ()], daemon=True).start()
        try:
            wait_for(lambda: "2/2 alive" in lines.get(timeout=10), 10, "the view heard both ranks")
            rack.kill()
            said = f"source  upstream stopped answering the relay at {address}: relay {rack_address} stopped answering"
            wait_for(lambda: said in lines.get(timeout=15), 15, "the view named the dead upstream relay")
        finally:
            view.send_signal(signal.SIGINT)
            view.wait(30)


def test_a_relay_passes_on_what_its_upstream_relay_says_of_its_own_upstream(make_cluster) -> None:
    """Three tiers: the rack relay's upstream (a relay on the bootstrap) dies; the top relay's listing says so,
    through the rack relay, and keeps the ranks listed as unheard."""
    cluster = make_cluster(small_cluster())
    ranks = sorted(agent.label for agent in cluster.agents())
    bottom = Relay(bootstrap=cluster.endpoint, name="bottom").start()
    rack = Relay(relays=[bottom.address], name="rack").start()
    top = Relay(relays=[rack.address], name="top").start()
    try:
        bottom.close()
        with BootstrapClient(top.address, timeout_s=2.0, service="relay") as client:
            listing = wait_for(lambda: (found := client.listing()).upstream_errors and found, 10, "the top relay")
    finally:
        top.close()
        rack.close()
    assert listing.upstream_errors == [
        f"via {rack.address}: relay {bottom.address} stopped answering (none within 1.0s)"
    ]
    assert listing.kept == ranks


def test_a_dashboard_and_its_recording_call_the_ranks_behind_a_dead_upstream_unheard_not_gone(
    make_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dashboard's model (as `kvtop top --relay` runs it, recording) heard both ranks through the cluster relay, then
    the rack relay under it was SIGKILLed. Past `GONE_S` its ranks table said `gone`, `check --model` named them gone
    and said nothing of the relay, and its recording replayed them gone. Now each says `unheard`, and `check` (on the
    model or the recording) names the dead upstream first."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv(RUNTIME_ENV, str(runtime))
    cluster = make_cluster(small_cluster())
    ranks = sorted(agent.label for agent in cluster.agents())
    ring = tmp_path / "ring"
    with (
        relay_process("--bootstrap", cluster.endpoint) as (rack, rack_address),
        relay_process("--relay", rack_address) as (_, address),
        ModelProcess(LiveModel(address, record=RecordChoice(True, str(ring)), kind="relay")) as dashboard,
    ):
        model = ("--model-at", str(dashboard.pid))
        alive = ["alive"] * len(ranks)
        wait_for(lambda: [rank["state"] for rank in ranks_table(*model)] == alive, 15, "the dashboard heard every rank")
        rack.kill()
        rack.wait(30)
        table = wait_for(lambda: silent_past_gone(*model), 30, "every rank silent past GONE_S")
        check = kvtop("check", *model, "--json")
        status = kvtop("status", *model, "--json")
    replayed = ranks_table("--replay", str(ring))
    replay_check = kvtop("check", "--replay", str(ring), "--json")

    stopped = f"relay {rack_address} stopped answering (none within 1.0s)"
    down = f"upstream stopped answering the relay at {address}: {stopped}"
    unheard = f"{down}; ranks behind it unheard: {', '.join(ranks)}"
    assert {str(rank["label"]): rank["state"] for rank in table} == dict.fromkeys(ranks, "unheard")
    assert {str(rank["label"]): rank["state"] for rank in replayed} == dict.fromkeys(ranks, "unheard")
    for judged in (check, replay_check):
        result = json.loads(judged.stdout)
        assert (judged.returncode, result["problems"][0]) == (2, unheard), judged.stdout
        assert (result["ranks_gone"], result["ranks_stale"], result["ranks_unheard"]) == ([], [], ranks)
    said = json.loads(status.stdout)
    assert (said["ranks"]["unheard"], said["ranks"]["gone"]) == (len(ranks), 0)
    assert (said["upstream_errors"], said["ranks_kept"]) == ([stopped], ranks)


def test_a_view_given_the_bootstrap_that_lists_the_relay_hears_of_the_relays_dead_upstream(make_cluster) -> None:
    """A view given only a bootstrap service that lists a relay (registered there) subscribes through the relay but
    never read the relay's own listing: when the relay's upstream relay died, the ranks behind it went stale then
    gone, with no word of why. Now the view asks the relay itself, names the dead upstream and calls them unheard."""
    cluster = make_cluster(small_cluster())
    ranks = sorted(agent.label for agent in cluster.agents())
    views = BootstrapServer().start()  # where views find the relay: it lists no agent of its own
    rack = Relay(bootstrap=cluster.endpoint, name="rack").start()
    top = Relay(relays=[rack.address], bootstrap=views.endpoint, register=True, name="top").start()
    collector = Collector(views.endpoint, model=ClusterModel()).start()

    def states() -> dict[str, Liveness]:
        with collector.lock:
            return collector.model.liveness(time.time())

    try:
        wait_for(lambda: states() == dict.fromkeys(ranks, Liveness.ALIVE), 15, "the view heard every rank")
        rack.close()
        wait_for(lambda: states() == dict.fromkeys(ranks, Liveness.UNHEARD), 20, "the ranks unheard behind the relay")
        with collector.lock:
            down = collector.model.intake.upstream_down()
    finally:
        collector.close()
        top.close()
        rack.close()
        views.close()
    stopped = f"relay {rack.address} stopped answering (none within 1.0s)"
    assert down == f"upstream stopped answering the relay at {top.address}: {stopped}"
