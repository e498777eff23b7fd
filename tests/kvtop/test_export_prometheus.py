"""`kvtop export` scraped by a real Prometheus server (Debian's `prometheus`, installed by .ci/run).

A local cluster with injected faults runs a few rooms; `kvtop export` serves its model; Prometheus scrapes
it every second. PromQL through Prometheus's HTTP API must count the failure origins and echoes that
`kvtop failures --json` lists, per origin role, instance and reason class.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kvtop_cli import kvtop

from kvtop.export import GRAFANA_DASHBOARD
from transport import FaultSpec, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec

T = TypeVar("T")
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no `prometheus` binary: Debian's package (apt-get install prometheus, as .ci/run does) is not installed",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM, then SIGKILL after 10 s: nothing outlives the test."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


@contextlib.contextmanager
def exporter(bootstrap: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`kvtop export` on a free loopback port; yields (host:port, process) once it printed its URL."""
    command = [shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop", "export", "--bootstrap", bootstrap]
    process = subprocess.Popen([*command, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()  # the first line, as documented; EOF if it died
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        yield url.removeprefix("http://").removesuffix("/metrics"), process
    finally:
        stop(process)


@contextlib.contextmanager
def prometheus(target: str, folder: Path) -> Iterator[str]:
    """A Prometheus server scraping `target` every second, on a temporary config and storage; yields its URL."""
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: kvtop, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    address = f"127.0.0.1:{free_port()}"
    assert PROMETHEUS is not None
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address={address}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(folder / "prometheus.log").open("w"), text=True,
    )  # fmt: skip
    try:
        url = f"http://{address}"
        wait_until(lambda: _ready(url) or process.poll() is not None, 20, "prometheus ready")
        assert process.poll() is None, (folder / "prometheus.log").read_text()
        yield url
    finally:
        stop(process)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_until(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)
    return value


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus's HTTP API: its result vector."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def scalar(url: str, promql: str) -> float:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else 0.0


def origin_labels(group: dict[str, Any]) -> tuple[str, str, str]:
    """The labels a `kvtop failures --json` group's origin is counted under."""
    origin = group["origin"]
    if origin is None:
        return ("unknown", group["origin_label"].rpartition("/")[0] or "unknown", "unknown")
    return (origin["role"], origin["instance"], origin["reason_class"])


MAY_BE_EMPTY = {"Ranks not alive"}
"""Dashboard panels with no series on a cluster whose ranks are all alive."""


def assert_every_dashboard_query_answers(server: str) -> None:
    """Each query of the Grafana dashboard (its variables as Grafana fills them) is PromQL that Prometheus
    evaluates, to some series unless nothing can match it on this cluster."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            promql = target["expr"].replace("$job", ".*").replace("$__rate_interval", "10s")
            result = query(server, promql)
            assert result or {panel["title"], target["legendFormat"]} & MAY_BE_EMPTY, (panel["title"], promql)


def test_prometheus_counts_the_origins_and_echoes_kvtop_failures_lists(make_cluster, control, tmp_path):
    """After rooms corrupted on prefill-0/TP1 and refused by prefill-0/TP0, PromQL's sum of origins and of
    echoes, and origins per (engine_type, pd_instance, reason_class), equal `kvtop failures --json`'s."""
    spec = ClusterSpec(
        prefill_tp=2,
        decode_tp=2,
        num_pages=128,
        page_bytes=16384,
        transfer=TransferConfig(chunk_bytes=16384, timeouts=Timeouts(3, 3, 2), peer_timeout_s=2),
        faults={"prefill-0/TP1": (FaultSpec.parse("corrupt:0.5"),), "prefill-0/TP0": (FaultSpec.parse("refuse:0.3"),)},
    )
    cluster = make_cluster(spec)
    with exporter(cluster.endpoint) as (target, export), prometheus(target, tmp_path) as server:
        wait_until(lambda: scalar(server, 'up{job="kvtop"}') == 1, 10, "the exporter scraped")
        agents = {agent.label: control(agent.control_endpoint) for agent in cluster.agents()}
        rooms = list(range(1001, 1011))
        for room in rooms:
            for label, client in agents.items():
                client.submit(room, 8, "prefill-0" if label.startswith("decode") else "")
        failed = {room for room in rooms for client in agents.values() if client.wait_result(room, 15).reason_class}

        listed = kvtop("failures", "--bootstrap", cluster.endpoint, "--json")
        listed_at = time.time()
        assert listed.returncode == 0, listed.stderr
        groups = [group for group in json.loads(listed.stdout)["groups"] if not group["aborted"]]
        assert failed and len(groups) >= len(failed)
        wait_until(
            lambda: scalar(server, "timestamp(kvtop_scrape_duration_seconds)") > listed_at + 1.0,
            10,
            "a scrape a second after kvtop failures answered",
        )

        assert scalar(server, "sum(kvtop_failure_origins_total)") == len(groups)
        assert scalar(server, "sum(kvtop_failure_echoes_total)") == sum(group["echo_count"] for group in groups)
        by_labels = query(server, "sum by (engine_type, pd_instance, reason_class) (kvtop_failure_origins_total)")
        labels = ("engine_type", "pd_instance", "reason_class")
        counted = {tuple(s["metric"][name] for name in labels): float(s["value"][1]) for s in by_labels}
        origins = Counter(origin_labels(group) for group in groups)
        assert counted == {key: float(count) for key, count in origins.items()}
        assert scalar(server, 'sum(kvtop_rank_state{state="alive"})') == len(agents)
        wait_until(lambda: scalar(server, 'kvtop_rooms_finished_total{outcome="failed"}') == len(failed), 10,
                   "the failed rooms retired and scraped")  # fmt: skip
        assert_every_dashboard_query_answers(server)
        assert export.poll() is None
    assert export.returncode == 0, "kvtop export did not stop cleanly on SIGTERM"
