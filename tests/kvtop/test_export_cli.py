"""`kvtop export` as the installed command: on SGLang logs, its usage errors, and what it says when it cannot serve."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kvtop_cli import StderrLines, kvtop, kvtop_here
from prometheus_client.parser import text_string_to_metric_families

from kvtop.model.cluster import ClusterModel
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster
from transport import Role
from transport.bootstrap import BootstrapServer

ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts"
LOGS = ("--sglang-log", str(ABORTS / "prefill.log"), "--sglang-log", str(ABORTS / "decode.log"))
KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"


@contextmanager
def exporting(*args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`kvtop export ARGS` until the block ends (SIGTERM); yields its URL (the first stdout line) and the process."""
    process = subprocess.Popen([KVTOP, "export", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip(), process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


def totals(url: str) -> dict[str, float]:
    """The sum of each family's samples (counters by their `_total` name)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


@pytest.mark.processes
def test_export_on_sglang_logs_counts_the_origins_echoes_and_aborts_kvtop_failures_lists():
    """Origins inferred from the logs, their echoes, and client aborts apart: as `kvtop failures --json` groups
    them; SIGTERM then ends the exporter with exit 0."""
    listed = kvtop("failures", "--json", *LOGS)
    groups = json.loads(listed.stdout)["groups"]
    faults = [group for group in groups if not group["aborted"]]
    aborts = [group for group in groups if group["aborted"]]

    with exporting(*LOGS, "--listen", "127.0.0.1:0") as (url, process):
        served = totals(url)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0

    assert url.startswith("http://127.0.0.1:")
    assert (served["kvtop_failure_origins_total"], served["kvtop_client_aborts_total"]) == (len(faults), len(aborts))
    assert served["kvtop_failure_echoes_total"] == sum(group["echo_count"] for group in faults)
    assert served["kvtop_client_abort_echoes_total"] == sum(group["echo_count"] for group in aborts)
    assert faults and aborts and served["kvtop_rank_state"] > 0


@pytest.mark.processes
def test_export_on_a_recording_counts_what_failures_lists_on_it(tmp_path: Path):
    """`kvtop export --replay DIR --at T` serves the model the recording held at T: the origins and echoes
    `kvtop failures --replay DIR --at T --json` lists there, fewer than at the recording's end."""
    recorder = Recorder(tmp_path / "rec", keyframe_events=1000, flush_s=3600.0)
    end = feed(recorder, ClusterModel(), SyntheticCluster(spacing_s=0.001), passes=40, rooms_per_pass=50)
    recorder.close()
    served_at: dict[str, dict[str, float]] = {}
    listed_at: dict[str, list[dict[str, object]]] = {}
    for at in (repr(end - 1.0), repr(end)):
        source = ("--replay", str(tmp_path / "rec"), "--at", at)
        listed_at[at] = json.loads(kvtop("failures", "--json", *source).stdout)["groups"]
        with exporting(*source, "--listen", "127.0.0.1:0") as (url, _):
            served_at[at] = totals(url)
    for at, served in served_at.items():
        faults = [group for group in listed_at[at] if not group["aborted"]]
        assert served["kvtop_failure_origins_total"] == len(faults), at
        assert served["kvtop_failure_echoes_total"] == sum(group["echo_count"] for group in faults), at
    early, late = (served["kvtop_failure_origins_total"] for served in served_at.values())
    assert 0 < early < late


def finished_rooms(url: str) -> dict[str, float]:
    """`kvtop_rooms_finished_total` by outcome."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "kvtop_rooms_finished")
    return {sample.labels["outcome"]: sample.value for sample in family.samples}


@pytest.mark.processes
def test_export_on_a_recording_counts_every_room_finished_before_the_keyframe_it_seeks_from(tmp_path: Path):
    """record -> replay -> export: `kvtop_rooms_finished_total` at T is what the live model had counted at T (its
    keyframes carry the counts: a model restored from one counted only the rooms its replayed ops retired), and it
    only grows from an earlier T to a later one."""
    recorder = Recorder(tmp_path / "rec", keyframe_events=300, flush_s=3600.0, fork_keyframes=False)
    live: dict[float, dict[str, float]] = {}
    model = ClusterModel()
    cluster = SyntheticCluster(spacing_s=0.001, failure_rate=0.1)
    end = feed(recorder, model, cluster, passes=40, rooms_per_pass=50,
               on_pass=lambda now: live.setdefault(now, {**model.retired_outcomes, "lost": model.lost}))  # fmt: skip
    recorder.close()
    assert recorder.stats().keyframes > 10
    middle = sorted(live)[3 * len(live) // 4]  # after the first sweeps retired rooms, before the last
    served: dict[float, dict[str, float]] = {}
    for at in (middle, end):
        with exporting("--replay", str(tmp_path / "rec"), "--at", repr(at), "--listen", "127.0.0.1:0") as (url, _):
            served[at] = finished_rooms(url)

    assert served == {at: live[at] for at in (middle, end)}
    assert 0 < served[middle]["succeeded"] < served[end]["succeeded"] and served[end]["failed"] > 0


def http_get(url: str) -> tuple[int, str]:
    """The status and body of GET `url` (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


@pytest.mark.processes
def test_export_answers_on_metrics_only_and_404_names_it_elsewhere():
    """Every path answered with the metrics, so a scrape aimed at `/` or `/metric` looked right; now only
    `/metrics` (its query parameters too) answers, and any other path is 404 naming `/metrics`."""
    with exporting(*LOGS, "--listen", "127.0.0.1:0") as (url, _):
        root = url.removesuffix("/metrics")
        metrics = http_get(url)
        queried = http_get(f"{url}?scrape=1")
        elsewhere = {
            path: http_get(root + path) for path in ("/", "/metric", "/metrics/", "/favicon.ico", "/x/metrics")
        }

    assert metrics[0] == 200 and "kvtop_failure_origins_total" in metrics[1]
    assert queried[0] == 200 and "kvtop_failure_origins_total" in queried[1]
    assert elsewhere == dict.fromkeys(elsewhere, (404, "404 not found: kvtop's metrics are at /metrics\n"))


@pytest.mark.processes
def test_export_says_so_when_its_address_is_taken():
    """A port already bound is one line naming the address and exit 1, not a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = kvtop("export", *LOGS, "--listen", address)

    assert result.returncode == 1
    assert f"cannot serve metrics on {address}" in result.stderr
    assert "Traceback" not in result.stderr


def test_export_usage_errors_exit_2():
    """No source, a --listen that is no HOST:PORT, and --export on bare kvtop without the dashboard are bad usage."""
    no_source = kvtop_here("export")
    bad_listen = kvtop_here("export", *LOGS, "--listen", "9464")
    headless = kvtop_here("--no-dashboard", "--export", "127.0.0.1:0", "--duration", "1")

    assert [no_source.returncode, bad_listen.returncode, headless.returncode] == [2, 2, 2]
    assert "--bootstrap" in no_source.stderr
    assert "is not HOST:PORT" in bad_listen.stderr
    assert "kvtop export --bootstrap" in headless.stderr


@pytest.mark.processes
def test_export_says_so_when_the_cluster_does_not_answer():
    """A bootstrap address nobody serves is a clear one-line error and exit 1, within the wait."""
    result = kvtop("export", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.5", "--listen", "127.0.0.1:0")

    assert result.returncode == 1
    assert "did not answer" in result.stderr


def ranks_by_state(url: str) -> dict[str, float]:
    """`kvtop_ranks` per state, as served."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return {sample.labels["state"]: sample.value for sample in families["kvtop_ranks"].samples}


@pytest.mark.processes
def test_export_says_once_when_every_agent_it_heard_goes_quiet_and_when_one_answers_again(
    bootstrap: BootstrapServer, make_manager, wait_for
):
    """prefill-7 answered, then stopped: the exporter served on and said nothing, so a cluster gone quiet read as a
    healthy one on its stderr. Now it says once that no agent was heard for longer than --wait, and again when one
    answers."""
    first = make_manager(Role.PREFILL, "prefill-7")
    with exporting("--bootstrap", bootstrap.endpoint, "--wait", "2", "--listen", "127.0.0.1:0") as (url, process):
        lines = StderrLines(process)
        wait_for(lambda: ranks_by_state(url)["alive"] == 1, timeout=30, what="prefill-7 counted alive")

        first.close()

        quiet = lines.next("kvtop: no agent heard for ")
        make_manager(Role.PREFILL, "prefill-8")
        again = lines.next("kvtop: an agent answered again after ")

    assert quiet.endswith("; serving on: kvtop_ranks counts the quiet ranks stale, then gone"), quiet
    assert [line for line in lines.seen if not line.startswith("kvtop: Prometheus metrics at ")] == [quiet, again]


@pytest.mark.processes
def test_export_on_a_bootstrap_that_lists_no_agent_says_so_and_serves_ranks_0_until_one_answers(
    bootstrap: BootstrapServer, make_manager, wait_for
):
    """A bootstrap listing no agent: the exporter served in silence, no rank series at all, which no alert on them
    sees; now `kvtop_ranks` is 0 in every state (an alert can tell it from health), stderr says so once, and says
    when the first agent answers, counted alive from then on."""
    with exporting("--bootstrap", bootstrap.endpoint, "--wait", "0.5", "--listen", "127.0.0.1:0") as (url, process):
        assert process.stderr is not None
        said = [process.stderr.readline() for _ in range(2)]
        silent = ranks_by_state(url)
        make_manager(Role.PREFILL, "prefill-7")
        said.append(wait_for(process.stderr.readline, timeout=30, what="the exporter's next line"))
        alive = wait_for(lambda: ranks_by_state(url)["alive"], timeout=30, what="the agent counted alive")

    assert said[0].startswith("kvtop: Prometheus metrics at ")
    assert said[1] == (
        f"kvtop: no agent listed by {bootstrap.endpoint} (none registered there, or every one deregistered); "
        "serving on: kvtop_ranks says 0 until an agent answers\n"
    )
    assert said[2].startswith("kvtop: an agent answered after ")
    assert set(silent.values()) == {0.0} and "alive" in silent
    assert alive == 1.0
