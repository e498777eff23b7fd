"""Headless views on a running dashboard's model (`--model`): a model process started as `kvtop top` starts
it answers `kvtop status/failures/ranks/check --model` with what `--bootstrap` gives on the same cluster; no
model, a stale advert, a model that does not answer and a malformed ask each get a clear answer."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from cluster_support import small_cluster
from kvtop_cli import kvtop

from kvtop.attach import wire
from kvtop.attach.client import fetch
from kvtop.attach.runtime import RUNTIME_ENV, Advert, RuntimeDirError, publish, runtime_dir
from kvtop.cli.model_spec import LiveModel
from kvtop.model.cluster import ClusterModel
from kvtop.record.dashboard import RecordChoice
from kvtop.tui.model_client import ModelProcess
from kvtop.tui.model_server import ServedModel
from transport.harness.cluster import LocalCluster
from transport.harness.control import ControlClient

SPEC = small_cluster({"prefill-0/TP0": "corrupt:1@decode-0"})

pytestmark = pytest.mark.processes


@dataclass(frozen=True)
class FailingSource:
    """A model process whose source says it cannot reach its cluster now (a bootstrap gone after the start)."""

    def open(self, stack: contextlib.ExitStack) -> ServedModel:
        model = ClusterModel()
        model.expect("tcp://127.0.0.1:9")
        return ServedModel(model, threading.Lock(), error=lambda: "the bootstrap service did not answer")


@pytest.fixture(scope="module")
def runtime() -> Iterator[Path]:
    """A private runtime folder for this module's model processes (and the `kvtop` commands it runs)."""
    folder = Path(tempfile.mkdtemp(prefix="kvtop-rt-"))
    before = os.environ.get(RUNTIME_ENV)
    os.environ[RUNTIME_ENV] = str(folder)
    yield folder
    if before is None:
        del os.environ[RUNTIME_ENV]
    else:
        os.environ[RUNTIME_ENV] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One prefill and one decode agent that moved a room whose pages prefill corrupted (one failure, echoed)."""
    cluster = LocalCluster(SPEC).start()
    clients = {agent.label: ControlClient(agent.control_endpoint) for agent in cluster.agents()}
    try:
        clients["prefill-0/TP0"].submit(7, 4)
        clients["decode-0/TP0"].submit(7, 4, "prefill-0")
        for client in clients.values():
            client.wait_result(7, 10)
        yield cluster
    finally:
        for client in clients.values():
            client.close()
        cluster.stop()


@pytest.fixture(scope="module")
def dashboard(runtime: Path, cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelProcess]:
    """The dashboard's model process on the cluster, recording as `kvtop top` does by default."""
    ring = tmp_path_factory.mktemp("ring")
    spec = LiveModel(cluster.endpoint, record=RecordChoice(True, str(ring)))
    with ModelProcess(spec) as model:
        yield model


def _json(*args: str) -> object:
    result = kvtop(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _groups(*source: str) -> object:
    """The groups of `kvtop failures --json` on `source`."""
    listed = _json("failures", *source, "--json")
    assert isinstance(listed, dict)
    return listed["groups"]


def _fold(groups: object) -> list[tuple[object, ...]]:
    assert isinstance(groups, list)
    return sorted((g["room"], g["origin"]["rank"], g["origin"]["reason_class"], g["echo_count"]) for g in groups)


def test_status_failures_ranks_and_check_of_the_dashboards_model_match_the_clusters_own(
    dashboard: ModelProcess, cluster: LocalCluster
):
    """The fold (origins, echoes, per-rank counts), liveness and the verdict read through the dashboard's
    model are what a collector of the view's own reads from the cluster."""
    own = ("--bootstrap", cluster.endpoint)
    status, mine = _json("status", "--model", "--json"), _json("status", *own, "--json")
    assert isinstance(status, dict) and isinstance(mine, dict)
    assert status["ranks"] == mine["ranks"]
    assert (status["failure_rate"], status["top_origins"]) == (mine["failure_rate"], mine["top_origins"])
    assert status["top_origins"] == [["decode-0/TP0 checksum", 1]]
    failures = _json("failures", "--model", "--json")
    assert isinstance(failures, dict)
    assert _fold(failures["groups"]) == _fold(_groups(*own)) == [(7, "decode-0/TP0", "checksum", 1)]
    ranks = _json("ranks", "--model", "--json")
    assert isinstance(ranks, list)
    assert [(r["label"], r["state"], r["origins"], r["echoes"]) for r in ranks] == [
        ("decode-0/TP0", "alive", 1, 0),
        ("prefill-0/TP0", "alive", 0, 1),
    ]
    check, own_check = kvtop("check", "--model", "--json"), kvtop("check", *own, "--json")
    assert (check.returncode, own_check.returncode) == (2, 2), check.stdout + check.stderr  # 1 room of 1 failed
    verdict, own_verdict = json.loads(check.stdout), json.loads(own_check.stdout)
    keys = ("verdict", "ranks_alive", "ranks_total", "failure_rate", "gaps", "top_origins", "rejected_frames")
    assert {k: verdict[k] for k in keys} == {k: own_verdict[k] for k in keys}


def test_events_of_the_dashboards_model_are_its_journal_with_the_fold_s_levels(dashboard: ModelProcess):
    """The failure shows once at the default level (its origin, an error), its echo only with --debug."""
    result = kvtop("events", "--model", "--jsonl")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    failures = [(e["agent"], e["level"]) for e in lines if e["kind"] == "failure"]
    assert failures == [("decode-0/TP0", "error")]
    debug = [json.loads(line) for line in kvtop("events", "--model", "--jsonl", "--debug").stdout.splitlines()]
    assert sorted((e["agent"], e["level"]) for e in debug if e["kind"] == "failure") == [
        ("decode-0/TP0", "error"),
        ("prefill-0/TP0", "debug"),
    ]


def test_a_malformed_ask_is_refused_and_counted_and_the_endpoint_keeps_answering(
    dashboard: ModelProcess, runtime: Path
):
    pid = dashboard.pid
    endpoint = f"ipc://{runtime}/model-{pid}.sock"
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with context.socket(zmq.DEALER) as socket:
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(endpoint)
        answers = []
        for ask in ([b"hello"], [wire.VERSION, b"\xc1not msgpack"], [b"kvtop-model/0", b""],
                    [wire.VERSION, b"\x00" * (wire.MAX_ASK_BYTES + 1)]):  # fmt: skip
            socket.send_multipart(ask)
            assert socket.poll(5000), f"no answer to {ask[0]!r}"
            answers.append(wire.ANSWER_DECODER.decode(socket.recv_multipart()[1]))
    assert all(isinstance(answer, wire.Refused) for answer in answers)
    assert "2 frames" in answers[0].reason and "kvtop-model/0" in answers[2].reason
    attached = fetch(endpoint, 5.0)
    assert {"frames", "malformed", "version", "oversize"} <= set(attached.state.refused)
    assert attached.state.pid == pid and "decode-0/TP0" in attached.model.ranks
    assert "the dashboard's model refused" in kvtop("ranks", "--model").stderr  # visible to every view


def test_a_stale_advert_is_ignored_and_removed(dashboard: ModelProcess, runtime: Path):
    """An advert whose process is gone (a kill -9) neither counts as a second dashboard nor stays."""
    dead = multiprocessing.get_context("spawn").Process(target=int)
    dead.start()
    dead.join()
    assert dead.pid is not None
    stale = runtime / f"model-{dead.pid}.json"
    publish(stale, Advert(1, dead.pid, 0, f"ipc://{runtime}/model-{dead.pid}.sock", "bootstrap tcp://x:1"))
    result = kvtop("ranks", "--model", "--json")
    assert result.returncode == 0, result.stderr
    assert not stale.exists()


def test_several_dashboards_must_be_named_and_each_advert_goes_with_its_dashboard(
    dashboard: ModelProcess, cluster: LocalCluster, runtime: Path
):
    """With two models running, --model alone is a usage error naming both pids (check: UNKNOWN); --model-at
    PID reads the one named; once the second dashboard closes, its advert and socket are gone."""
    second = ModelProcess(LiveModel(cluster.endpoint, record=RecordChoice(False))).start()
    pid = second.pid
    advert, socket_file = runtime / f"model-{pid}.json", runtime / f"model-{pid}.sock"
    try:
        assert advert.exists() and socket_file.exists()
        ambiguous = kvtop("status", "--model")
        assert ambiguous.returncode == 2
        assert str(pid) in ambiguous.stderr and str(dashboard.pid) in ambiguous.stderr
        assert kvtop("check", "--model").returncode == 3
        named = _json("status", "--model-at", str(pid), "--json")
        assert isinstance(named, dict) and named["ranks"]["alive"] == 2
    finally:
        second.close()
    assert not advert.exists() and not socket_file.exists()


def test_no_running_model_or_one_that_does_not_answer_is_a_finding(wait_for):
    """No model in the runtime folder: views exit 1 and check is CRITICAL, each with one line; a model that
    never answers within --wait is the same."""
    folder = Path(tempfile.mkdtemp(prefix="kvtop-rt-"))
    try:
        env = {RUNTIME_ENV: str(folder)}
        for view in ("status", "events"):  # the one source lifecycle of the views, and the event tail's own
            result = kvtop(view, "--model", env=env)
            assert (view, result.returncode) == (view, 1)
            assert "no dashboard's model is running" in result.stderr
        check = kvtop("check", "--model", env=env)
        assert check.returncode == 2
        assert check.stdout.startswith("KVTOP CRITICAL - no dashboard's model is running")
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        with context.socket(zmq.ROUTER) as silent:  # it hears the ask and never answers
            silent.setsockopt(zmq.LINGER, 0)
            endpoint = f"ipc://{folder}/silent.sock"
            silent.bind(endpoint)
            late = kvtop("check", "--model-at", endpoint, "--wait", "0.3", env=env)
            wait_for(lambda: silent.poll(0), 1.0, "the ask reached the silent model")
        assert late.returncode == 2
        assert "did not answer within 0.3s" in late.stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_export_serves_the_dashboards_model_as_prometheus_metrics(dashboard: ModelProcess, wait_for):
    """`kvtop export --model` counts the one origin and its echo apart, says its source is the model, asks
    again meanwhile, and ends 0 on SIGTERM."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "export", "--model", "--listen", "127.0.0.1:0", "--model-every", "0.5"]
    exporter = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert exporter.stdout is not None
        url = exporter.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), exporter.stderr.read() if exporter.stderr else ""
        first = urllib.request.urlopen(url, timeout=10).read().decode()
        answered = fetch_answered(dashboard)
        wait_for(lambda: fetch_answered(dashboard) > answered + 1, 10.0, "the exporter asked the model again")
        metrics = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        exporter.send_signal(signal.SIGTERM)
        code = exporter.wait(10)
    assert code == 0
    for text in (first, metrics):
        assert (
            'kvtop_failure_origins_total{engine_type="decode",pd_instance="decode-0",reason_class="checksum"} 1.0'
            in text
        )
        assert (
            'kvtop_failure_echoes_total{engine_type="prefill",pd_instance="prefill-0",reason_class="checksum"} 1.0'
            in text
        )
        assert 'source="model"' in text


def fetch_answered(dashboard: ModelProcess) -> int:
    """How many asks the dashboard's model answered (this one included)."""
    return fetch(f"ipc://{os.environ[RUNTIME_ENV]}/model-{dashboard.pid}.sock", 5.0).state.answered


def test_a_following_view_asks_the_dashboards_model_again_each_interval(dashboard: ModelProcess):
    """`kvtop status --model --follow` prints a JSON line per ask (the model process answers each), and
    Ctrl-C ends it 0."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "status", "--model", "--follow", "--interval", "0.2", "--json"]
    before = fetch_answered(dashboard)
    view = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert view.stdout is not None
        frames = [json.loads(view.stdout.readline()) for _ in range(3)]
    finally:
        view.send_signal(signal.SIGINT)
        code = view.wait(10)
    assert code == 0
    assert [frame["ranks"]["alive"] for frame in frames] == [2, 2, 2]
    assert fetch_answered(dashboard) >= before + 1 + 3


def test_a_dashboard_whose_source_fails_now_is_critical_as_the_cluster_would_be(runtime: Path):
    """The error the dashboard's collector holds now (its bootstrap stopped answering) is the check's first
    problem, CRITICAL, and every view says it on stderr."""
    with ModelProcess(FailingSource()) as failing:
        pid = str(failing.pid)
        check = kvtop("check", "--model-at", pid)
        ranks = kvtop("ranks", "--model-at", pid)
    assert check.returncode == 2
    assert check.stdout.startswith("KVTOP CRITICAL - the dashboard's source: the bootstrap service did not answer;")
    assert "kvtop: the dashboard's source: the bootstrap service did not answer" in ranks.stderr


def test_a_runtime_folder_others_may_enter_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Anyone who can write in the runtime folder could pose as a dashboard: one open to others is refused
    (the dashboard runs on without its endpoint, saying why), and one made by kvtop is 0700."""
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    monkeypatch.setenv(RUNTIME_ENV, str(open_folder))
    with pytest.raises(RuntimeDirError, match="not this user's own with mode 0700"):
        runtime_dir()
    with ModelProcess(FailingSource()) as refused:
        warnings = refused.warnings
    assert [w for w in warnings if w.startswith("other commands cannot read this dashboard's model (--model):")]
    assert list(open_folder.iterdir()) == []
    made = tmp_path / "made"
    monkeypatch.setenv(RUNTIME_ENV, str(made))
    assert runtime_dir() == made
    assert made.stat().st_mode & 0o777 == 0o700
