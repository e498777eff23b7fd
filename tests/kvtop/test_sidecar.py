"""The log sidecar on a log a test writes: a file not there yet, rotations, garbled lines, metrics, liveness."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kvtop_cli import kvtop
from sidecar_support import KVTOP, registry, sidecars, view_json

from kvtop.sidecar.metrics import kv_metrics
from kvtop.sidecar.tail import LogTail
from kvtop.sources.live import Collector
from kvtop.sources.sglang import LogSpec
from kvtop.sources.sglang.prefix import split_stream
from kvtop.views.failures import to_json
from kvtop.views.tables import ranks_json
from tests.conftest import wait_for
from transport import BootstrapClient
from transport.registration import TAKEN_SUFFIX

METRICS = """\
# HELP sglang:num_transfer_failed_reqs_total Transfer failures.
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{model_name="m",tp_rank="0"} 2.0
sglang:num_transfer_failed_reqs_total{model_name="m",tp_rank="1"} 1.0
# HELP sglang:num_bootstrap_failed_reqs_total Bootstrap failures.
# TYPE sglang:num_bootstrap_failed_reqs_total counter
sglang:num_bootstrap_failed_reqs_total{model_name="m"} 0.0
# HELP sglang:kv_transfer_latency_ms Latency.
# TYPE sglang:kv_transfer_latency_ms histogram
sglang:kv_transfer_latency_ms_bucket{le="10.0"} 4.0
sglang:kv_transfer_latency_ms_bucket{le="+Inf"} 5.0
sglang:kv_transfer_latency_ms_sum 42.5
sglang:kv_transfer_latency_ms_count 5.0
# HELP sglang:num_decode_transfer_queue_reqs Queue.
# TYPE sglang:num_decode_transfer_queue_reqs gauge
sglang:num_decode_transfer_queue_reqs NaN
# HELP sglang:num_running_reqs Running.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs 7.0
"""
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
STARTED_S = 60.0
"""How long a sidecar may take to start and be heard: Python importing kvtop on a loaded two-core machine (CI's,
at a load of 30 to 50) takes tens of seconds, past the 20 s these waits had."""
HEARD_S = 30.0
"""How long a running sidecar may take to read and publish what its log gained, on such a machine."""


TIMEOUT = "Request {room} timed out after 300.0s in KVPoll.WaitingForInput"


def failure_line(room: int, tp: int = 0) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"[{stamp} TP{tp}] Decode transfer failed for request rank={tp} decode_req.req.rid='r{room}' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
        f"{TIMEOUT.format(room=room)}\n"
    )


def append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as log:
        log.write(text.encode() if isinstance(text, str) else text)


@pytest.fixture(scope="module")
def registry_address() -> Iterator[str]:
    with registry() as address:
        yield address


@pytest.fixture
def metrics_url() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """A Prometheus endpoint serving `METRICS` (shut down by the test to play a dead server, or at teardown)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", server
    server.shutdown()
    server.server_close()
    thread.join()


def test_kv_metrics_sum_label_sets_and_leave_out_buckets_and_non_finite_values():
    """Counters are summed over their label sets, histograms give _sum and _count, NaN and other metrics go."""
    assert kv_metrics(METRICS) == {
        TRANSFER_FAILED: 3.0,
        "sglang:num_bootstrap_failed_reqs_total": 0.0,
        "sglang:kv_transfer_latency_ms_sum": 42.5,
        "sglang:kv_transfer_latency_ms_count": 5.0,
    }


class Watch:
    """A kvtop collector subscribed to the registry's ranks: the model the views read, without a process per look."""

    def __init__(self, bootstrap: str) -> None:
        self.collector = Collector(bootstrap).start()

    def rank(self, label: str) -> dict[str, Any] | None:
        with self.collector.lock:
            return next((r for r in ranks_json(self.collector.model, time.time()) if r["label"] == label), None)

    def rooms(self) -> set[int]:
        with self.collector.lock:
            return {group.room for group in self.collector.model.groups()}

    def read_to_end(self, path: Path) -> dict[str, Any] | None:
        rank = self.rank("decode-7/TP0")
        size = path.stat().st_size
        return rank if rank and rank["log"]["exists"] and rank["log"]["position"] == size else None


@pytest.fixture
def watch(registry_address: str) -> Iterator[Watch]:
    watching = Watch(registry_address)
    yield watching
    watching.collector.close()


@pytest.mark.processes
def test_a_sidecar_waits_for_its_file_follows_rotations_counts_garbled_lines_and_scrapes_metrics(
    registry_address, metrics_url, watch: Watch, tmp_path: Path
):
    """Nothing lost through rename and copytruncate rotations; garbled lines, rotations and metrics in the
    heartbeat, as `kvtop ranks --json` shows them ("no data" for metrics that never moved); idle when the log
    stops, down when the server's metrics stop answering too."""
    url, metrics_server = metrics_url
    log = tmp_path / "server.log"
    with sidecars(registry_address, tmp_path) as started:
        started.start(log, "--role", "decode", "--instance", "decode-7", "--idle-after", "1.5",
                      "--metrics", url, "--metrics-interval", "0.5")  # fmt: skip

        def heartbeat_with_log() -> dict[str, Any] | None:  # its hello may come before the first heartbeat
            rank = watch.rank("decode-7/TP0")
            return rank if rank and rank["log"] is not None else None

        waiting = wait_for(heartbeat_with_log, STARTED_S, "the heartbeat of a file not there yet")
        assert (waiting["state"], waiting["log"]["exists"]) == ("idle", False)

        append(log, failure_line(101) + failure_line(102))
        append(log, "[2026-12-01 12:00:00 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='x'\n")
        append(log, b"[2026-12-01 12:00:00 TP0] Session 10.0.0.7:15004 \xff\xfe failed.\n")  # read, not garbled
        append(log, b"[2026-12-01 12:00:00 TP0] Decode transfer failed for request\n")  # cut before its rank
        wait_for(lambda: watch.read_to_end(log), HEARD_S, "the new file read to its end")

        os.rename(log, tmp_path / "server.log.1")  # rename: the server writes the old file once more, then a new one
        append(tmp_path / "server.log.1", failure_line(103))
        append(log, failure_line(104))
        wait_for(lambda: watch.read_to_end(log), HEARD_S, "the renamed file drained and the new one read")

        shutil.copyfile(log, tmp_path / "server.log.2")  # copytruncate
        os.truncate(log, 0)
        append(log, failure_line(105) + failure_line(106, tp=1))

        wait_for(lambda: watch.rooms() == {101, 102, 103, 104, 105, 106}, HEARD_S, "every failure line")
        wait_for(lambda: watch.read_to_end(log) and watch.rank("decode-7/TP0")["log"]["metrics_error"] == "", HEARD_S,
                 "the truncated file read again, the metrics scraped")  # fmt: skip
        ranks = {rank["label"]: rank for rank in view_json("ranks", "--bootstrap", registry_address)}
        assert {
            group["room"] for group in view_json("failures", "--bootstrap", registry_address)["groups"]
        } == watch.rooms()
        followed = ranks["decode-7/TP0"]["log"]
        assert (followed["garbled"], followed["rotations"]) == (2, 2)
        assert "decode-7/TP1" in ranks  # a rank the log named later
        assert followed["metrics"][TRANSFER_FAILED] == 3.0
        assert followed["metrics"]["sglang:num_bootstrap_failed_reqs_total"] == "no data"  # zero since the first
        assert followed["metrics"]["sglang:kv_transfer_speed_gb_s"] == "no data"  # never served
        wait_for(lambda: watch.rank("decode-7/TP0")["state"] == "idle", 10, "idle once the log stops")

        metrics_server.shutdown()
        metrics_server.server_close()
        wait_for(lambda: watch.rank("decode-7/TP0")["state"] == "down", 10, "down once metrics stop")


FIXTURES = Path(__file__).parent / "fixtures" / "sglang"


def _folded(groups: list[dict[str, Any]] | None) -> list[tuple[int, str, str, int]]:
    """(room, origin, class, echoes) of each group; a rank heard as taken by its label (its failures are its own,
    named `prefill-0/TP0~taken`), as the files read together name it."""
    return sorted(
        (
            g["room"],
            g["origin_label"].removesuffix(TAKEN_SUFFIX),
            g["origin"]["reason_class"] if g["origin"] else "",
            g["echo_count"],
        )
        for g in groups or []
    )


def _each_server_s_log(incident: Path, folder: Path) -> list[Path]:
    """The incident's logs, one per server: a file of several servers' lines (`compose`) split by the wrapper's
    name for each, the wrapper kept."""
    logs: list[Path] = []
    for log in sorted(incident.glob("*.log")):
        lines: dict[str, list[bytes]] = {}
        for line in log.read_bytes().splitlines(keepends=True):
            lines.setdefault(split_stream(line.decode("utf-8", "replace"))[0], []).append(line)
        if len(lines) < 2:
            logs.append(log)
            continue
        for name, text in lines.items():
            logs.append(folder / f"{name}.log")
            logs[-1].write_bytes(b"".join(text))
    return logs


def _crashed(ranks: list[dict[str, Any]]) -> dict[str, str]:
    """The crashed ranks `kvtop ranks --json` lists, with what their crash says."""
    return {rank["label"]: rank["crashed"]["text"] for rank in ranks if rank["crashed"]}


NEVER_STARTED = ("ascend-init", "launcher-death")
"""Fixtures of a server that died at start-up: no failure to fold (`test_a_sidecar_on_a_later_node_s_log_...`)."""


@pytest.mark.processes
@pytest.mark.parametrize("incident", sorted(path.name for path in FIXTURES.iterdir() if path.name not in NEVER_STARTED))
def test_sidecars_on_real_log_shapes_fold_like_the_files_read_together(registry_address, watch, tmp_path, incident):
    """Each fixture incident (both log eras, aborts, worker errors, crashes): a sidecar per server's log gives the
    origins and echo counts that `kvtop failures --sglang-log` gives on the files, and the crashed ranks that
    `kvtop ranks` names (a `docker compose logs` file of several servers: a sidecar on each server's own lines, as
    `docker compose logs -f SERVICE` writes them, names each by its container).

    It waits for every sidecar to be heard from, not only for the fold: a log with no failure of its own
    (`fatal-signal`'s prefill) adds nothing to it, and a sidecar still loading when the fold agreed (under load)
    died of the SIGTERM that stops it (exit -15) before it could take it as a stop."""
    given = [arg for log in sorted((FIXTURES / incident).glob("*.log")) for arg in ("--sglang-log", str(log))]
    logs = _each_server_s_log(FIXTURES / incident, tmp_path)
    files = _folded(view_json("failures", *given)["groups"]), _crashed(view_json("ranks", *given))
    assert files[0]
    with sidecars(registry_address, tmp_path) as started:
        unheard = {started.start(log).pid for log in logs}
        published: list[tuple[list[tuple[int, str, str, int]], dict[str, str]]] = []

        def agree() -> bool:
            with watch.collector.lock:
                model = watch.collector.model
                groups = to_json(model.groups())
                published[:] = [(_folded(groups), {k: c.text for k, c in model.crashes.items()})]
                unheard.difference_update(view.pid for view in model.ranks.values() if view.last_seen)
                rows = {g["origin_label"] for g in groups if g["origin"]} <= model.ranks.keys()  # each its row's
            return not unheard and published[0] == files and rows

        try:
            wait_for(agree, STARTED_S, "every sidecar heard from, their fold and crashed ranks matching the files'")
        except AssertionError:
            assert (files, unheard) == (published[0] if published else None, set())


@pytest.mark.processes
def test_two_sidecars_claiming_one_rank_say_so_and_lose_neither_server_s_failures(registry_address, watch, tmp_path):
    """Two servers' logs that name no instance (both `decode-0`) followed by two sidecars on one host: each refresh
    took `decode-0/TP0` from the other, a view hearing one or the other (`unregistered-prefill`'s TP0 abort lost
    in half the runs). The later holds the rank; the earlier says its registration is refused, naming the fix, and
    is heard as taken: both servers' failures are in the view."""
    first, second = tmp_path / "one.log", tmp_path / "two.log"
    first.write_text(failure_line(101))
    second.write_text(failure_line(202))
    with sidecars(registry_address, tmp_path) as started:
        started.start(first)
        wait_for(lambda: 101 in watch.rooms(), STARTED_S, "the first sidecar's failure heard")
        started.start(second)
        said = tmp_path / "sidecar-0.stderr"
        wait_for(lambda: "two processes claim the rank" in said.read_text(), STARTED_S, "the earlier sidecar refused")
        wait_for(lambda: {101, 202} <= watch.rooms(), HEARD_S, "both servers' failures in the view")

    assert "--instance each" in said.read_text()


COMPOSE = FIXTURES / "compose" / "all.log"
CRASHED = "qwen3-32b-sglang-2p2d-decode-1-1"
"""The server of `compose` whose scheduler crashed."""


@pytest.mark.processes
def test_a_sidecar_on_a_file_of_several_servers_stops_with_exit_2_and_says_why(registry_address, watch, tmp_path):
    """A sidecar follows one server's log: on `docker compose logs` of several servers it published decode-1-1's
    crash as its first server's (`prefill-0/TP0`). On one server's lines it names the crash by the container; once
    the file gains another server's lines it stops (exit 2), naming them; on the whole file it publishes nothing."""
    lines = COMPOSE.read_text().splitlines(keepends=True)
    log = tmp_path / "compose.log"
    log.write_text("".join(line for line in lines if line.startswith(CRASHED)))
    command = [KVTOP, "agent", "--sglang-log", str(log), "--bootstrap", registry_address]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as process:
        try:

            def crashes() -> dict[str, str]:
                with watch.collector.lock:
                    return {label: crash.text for label, crash in watch.collector.model.crashes.items()}

            crashed = wait_for(crashes, STARTED_S, "the crash of the file's one server published")
            append(log, "".join(line for line in lines if not line.startswith(CRASHED)))
            _, said = process.communicate(timeout=20)
        finally:
            process.kill()
    whole = kvtop("agent", "--sglang-log", str(COMPOSE))  # with no --bootstrap, each rank it publishes is said

    assert list(crashed) == [f"{CRASHED}/TP0"]
    assert crashed[f"{CRASHED}/TP0"].startswith("Scheduler hit an exception: RuntimeError: CUDA error")
    several = "holds the lines of several servers (qwen3-32b-sglang-2p2d-decode-1-1, qwen3-32b-sglang-2p2d-prefill-0-1"
    assert process.returncode == 2 and several in said, said
    assert (whole.returncode, whole.stderr.count("\n")) == (2, 1), whole.stderr
    assert "publishes" not in whole.stderr and "follows one server's log" in whole.stderr


def test_a_sidecar_names_a_wrapped_log_s_server_as_its_wrapper_does_unless_instance_names_it(tmp_path: Path):
    """`docker compose logs -f decode-7` of one server: its failures and its ranks are `decode-7-1`'s, as a view's
    --sglang-log names them; with --instance, both are the instance's (its failures were the container's). A log
    whose one record is still held (a traceback, read once the log is quiet) names its server from its first line:
    the sidecar's ranks were `decode-0`'s, its crash published as theirs."""
    log, traceback = tmp_path / "decode.log", tmp_path / "crashed.log"
    log.write_text(f"decode-7-1  | {failure_line(11, tp=1)}")
    traceback.write_text("".join(line for line in COMPOSE.read_text().splitlines(True) if line.startswith(CRASHED)))
    tails = LogTail(LogSpec(log)), LogTail(LogSpec(log), "decode-9"), LogTail(LogSpec(traceback))
    labels = [sorted({label for label, _ in tail.poll().events}) for tail in tails]
    told = [(tail.instance, tail.role, named) for tail, named in zip(tails, labels, strict=True)]
    for tail in tails:
        tail.close()

    assert told == [
        ("decode-7-1", "decode", ["decode-7-1/TP1"]),
        ("decode-9", "decode", ["decode-9/TP1"]),
        (CRASHED, "decode", []),
    ]


@pytest.mark.processes
def test_a_sidecar_publishes_each_pipeline_stage_s_ranks_and_crashes(registry_address, watch, tmp_path):
    """sglang #30158's shape (`pipeline-crash`: TP4 PP2, PP1 TP3's scheduler crashes, then PP0 TP3's): a rank per TP
    tag published four ranks, and PP0 TP3's crash as PP1 TP3's aftermath."""
    with sidecars(registry_address, tmp_path) as started:
        started.start(FIXTURES / "pipeline-crash" / "prefill.log")

        def published() -> tuple[list[str], list[str]]:
            with watch.collector.lock:
                model = watch.collector.model
                return sorted(model.ranks), sorted(model.crashes)

        expected = (
            sorted(f"prefill-0/{stage}TP{tp}" for stage in ("", "PP1-") for tp in range(4)),
            ["prefill-0/PP1-TP3", "prefill-0/TP3"],
        )
        try:
            wait_for(lambda: published() == expected, STARTED_S, "every stage's ranks and crashes published")
        except AssertionError:
            assert published() == expected


def _listed(bootstrap: str) -> tuple[list[str], list[str]]:
    """The ranks the bootstrap service lists, and those it lists as expired."""
    with BootstrapClient(bootstrap) as client:
        listing = client.listing()
    return sorted(agent.label for agent in listing.agents), sorted(agent.label for agent in listing.expired)


REPLICA_RANKS = ["prefill-0/DP0-TP0", "prefill-0/DP0-TP1", "prefill-0/DP1-TP0", "prefill-0/DP1-TP1"]


@pytest.mark.processes
def test_a_sidecar_registers_and_publishes_each_dp_replica_s_rank_under_its_own_name(registry_address, watch, tmp_path):
    """`dp-replicas`: plain `--dp-size 2` of TP 2. The sidecar registered `prefill-0/TP0` and `TP1` once for both
    replicas, so DP1 TP0's crash was the crash of the TP0 that DP0 serves on. Each replica's rank is listed, heard
    and crashed under the name the files read together give it, and no rank of no replica is listed."""
    with sidecars(registry_address, tmp_path) as started:
        started.start(FIXTURES / "dp-replicas" / "prefill.log")

        def published() -> tuple[list[str], list[str], list[str], list[str]]:
            with watch.collector.lock:
                model = watch.collector.model
                known, crashed = sorted(model.ranks), sorted(model.crashes)
                heard = sorted(label for label, view in model.ranks.items() if view.last_seen)
            return _listed(registry_address)[0], known, heard, crashed

        expected = (REPLICA_RANKS, REPLICA_RANKS, REPLICA_RANKS, ["prefill-0/DP1-TP0"])
        try:
            wait_for(lambda: published() == expected, STARTED_S, "each replica's ranks listed, heard, DP1 TP0 crashed")
        except AssertionError:
            assert published() == expected
    files = view_json("ranks", "--sglang-log", str(FIXTURES / "dp-replicas" / "prefill.log"))
    assert sorted(rank["label"] for rank in files) == REPLICA_RANKS


@pytest.mark.processes
def test_a_sidecar_started_before_its_server_takes_its_rank_of_no_replica_off_once_the_server_says_replicas(
    registry_address, watch, tmp_path
):
    """Started before the server writes its log, the sidecar registers `--tp`'s `prefill-0/TP0`; the server's
    `server_args` line then says its DP ranks are replicas: that rank is none of the server's. It is deregistered
    (not left to expire, which lists it as a rank that died), and each replica's ranks are listed."""
    log = tmp_path / "prefill.log"
    with sidecars(registry_address, tmp_path) as started:
        started.start(log, "--role", "prefill")
        wait_for(lambda: _listed(registry_address) == (["prefill-0/TP0"], []), STARTED_S, "the rank of --tp listed")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        append(log, f"[{stamp}] server_args=ServerArgs(model_path='/m', tp_size=2, dp_size=2, "
                    "enable_dp_attention=False, disaggregation_mode='prefill')\n")  # fmt: skip
        wait_for(lambda: _listed(registry_address) == (REPLICA_RANKS, []), HEARD_S, "only the replicas' ranks listed")


@pytest.mark.processes
def test_a_sidecar_on_a_later_node_s_log_names_the_scheduler_its_launcher_says_died(registry_address, watch, tmp_path):
    """`launcher-death`: node 1 of a TP16 prefill over two nodes, whose launcher says `Rank 2 scheduler is dead.`,
    then `Exit code: -9`. A sidecar following that node's log publishes TP10's crash (its third scheduler), killed by
    SIGKILL."""
    with sidecars(registry_address, tmp_path) as started:
        started.start(FIXTURES / "launcher-death" / "prefill-node1.log")

        def published() -> dict[str, str]:
            with watch.collector.lock:
                return {label: crash.text for label, crash in watch.collector.model.crashes.items()}

        expected = {"prefill-0/TP10": "its scheduler died at start-up, killed by SIGKILL"}
        try:
            wait_for(lambda: published() == expected, STARTED_S, "the crash of the node's third scheduler published")
        except AssertionError:
            assert published() == expected


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/sglang/python/sglang/srt/disaggregation/nixl/conn.py", line 611, in transfer_worker\n'
    "    self.send_kvcache(req, chunk)\n"
    "RuntimeError: post xfer failed: NIXL_ERR_BACKEND\n"
)


@pytest.mark.processes
def test_a_sidecar_publishes_the_last_record_of_its_log_once_the_log_is_quiet(registry_address, watch, tmp_path):
    """A server's last words, with no line after them: a worker error and its traceback fail its room (its
    reason the traceback's last line), a failure line's traceback reaches the collector as context."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    worker_log, failure_log = tmp_path / "prefill.log", tmp_path / "decode.log"
    worker_log.write_text(f"[{stamp} TP3] Unexpected transfer worker error for room 401\n{TRACEBACK}")
    failure_log.write_text(failure_line(402) + TRACEBACK)
    with sidecars(registry_address, tmp_path) as started:
        started.start(worker_log, "--role", "prefill", "--instance", "prefill-8")
        started.start(failure_log, "--role", "decode", "--instance", "decode-8")

        def last_records() -> tuple[dict[int, str], set[str]]:
            with watch.collector.lock:
                model = watch.collector.model
                origins = {g.room: g.origin.reason for g in model.groups() if g.origin and g.room in (401, 402)}
                tracebacks = {label.partition("/")[0] for label, line in model.context if line.kind == "traceback"}
            return origins, tracebacks

        published = (
            {401: "RuntimeError: post xfer failed: NIXL_ERR_BACKEND", 402: TIMEOUT.format(room=402)},
            {"prefill-8", "decode-8"},
        )
        try:
            wait_for(lambda: last_records() == published, STARTED_S, "the last records published")
        except AssertionError:
            assert last_records() == published


@pytest.mark.processes
def test_a_sidecar_that_cannot_bind_exits_1_with_one_line_and_bad_usage_exits_2(tmp_path: Path):
    """An address not on this host ends the sidecar at once (exit 1, one line); a role that is none exits 2."""
    log = tmp_path / "decode.log"
    log.write_text(failure_line(1))
    unbindable = kvtop("agent", "--sglang-log", str(log), "--host", "192.0.2.1", "--insecure")
    bad_role = kvtop("agent", "--sglang-log", str(log), "--role", "router")

    assert (unbindable.returncode, unbindable.stderr.count("\n")) == (1, 1), unbindable.stderr
    assert "cannot bind on 192.0.2.1" in unbindable.stderr
    assert bad_role.returncode == 2 and "expected prefill or decode" in bad_role.stderr


@pytest.mark.processes
def test_a_sidecar_on_a_log_that_tells_no_role_yet_says_what_it_waits_for(tmp_path: Path):
    """On an empty `server.log` it registered nothing and said nothing (a dead bootstrap unreported too): it says
    it waits for the log's lines to tell prefill or decode."""
    import subprocess
    import sys

    log = tmp_path / "server.log"
    log.write_text("")
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "agent", "--sglang-log", str(log), "--bootstrap", "tcp://127.0.0.1:9"]
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        said = process.stderr.readline()  # blocks until the first line: the test's timeout bounds it
        process.terminate()
        process.wait(timeout=20)

    assert said.strip() == f"kvtop agent: waiting for {log}'s lines to tell prefill or decode (--role says it now)"


@pytest.mark.processes
def test_a_sidecar_on_a_file_that_is_no_sglang_log_says_so(tmp_path: Path):
    """A sidecar pointed at a wrong file (a runbook that quotes SGLang's words) published nothing and said nothing:
    its rank alive, `check` OK. It says on stderr that the file is no SGLang server log."""
    import subprocess
    import sys

    runbook, stderr = tmp_path / "runbook.md", tmp_path / "stderr"
    runbook.write_text("If decode says `Lost connection with prefill instance`, check the bootstrap port.\n")
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "agent", "--sglang-log", str(runbook), "--role", "decode"]
    said = (
        f"kvtop agent: {runbook}: not an SGLang server log (no line at its start or end is in SGLang's format): "
        "nothing of it is published\n"
    )
    with stderr.open("w") as out, subprocess.Popen(args, stderr=out) as process:
        try:
            said_no_log = lambda: "nothing of it is published" in stderr.read_text()  # noqa: E731
            wait_for(said_no_log, STARTED_S, "the file said to be no log")
        finally:
            process.terminate()
            process.wait(timeout=20)

    lines = stderr.read_text().splitlines(keepends=True)
    assert lines[0].startswith("kvtop agent: decode-0/TP0 publishes on tcp://") and said in lines, lines


def test_metrics_not_yet_scraped_are_no_sign_the_server_is_down():
    """A sidecar's first heartbeat can leave before its first scrape (a loaded machine): `not scraped yet` read as an
    error made the rank `down` beside a server that answers; only a scrape that went wrong is one."""
    from kvtop.sidecar.metrics import MetricsScraper

    scraper = MetricsScraper("http://127.0.0.1:9/metrics", timeout_s=0.5)
    before = scraper.error
    scraper.scrape()

    assert before == ""
    assert scraper.error.startswith("http://127.0.0.1:9/metrics unanswered")


@pytest.mark.processes
def test_a_sidecar_on_a_server_of_huge_pipeline_and_tp_sizes_publishes_a_bounded_number_of_ranks(tmp_path: Path):
    """A `server_args` line of `tp_size=16, pp_size=1024` asked for 16,384 ranks, a publisher each: the sidecar died
    out of sockets at the 511th (exit 1). It publishes `RANKS_MAX`, says the rest are cut, and stops cleanly."""
    import subprocess
    import sys

    from kvtop.sidecar.sidecar import RANKS_MAX

    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-06-23 15:10:00] server_args=ServerArgs(model_path='/m', tp_size=16, pp_size=1024, nnodes=1, "
        "node_rank=0, dist_init_addr=None, disaggregation_mode='prefill')\n"
    )
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    with subprocess.Popen([command, "agent", "--sglang-log", str(log)], stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        said: list[str] = []
        while not said or "ranks: the lines of those past them" not in said[-1]:
            line = process.stderr.readline()  # blocks until a line or the end: the test's timeout bounds it
            if not line:
                break
            said.append(line)
        published = [process.stderr.readline() for _ in range(RANKS_MAX)] if process.poll() is None else []
        process.terminate()
        code = process.wait(timeout=20)

    assert said[-1].strip() == (
        f"kvtop agent: the log names more than {RANKS_MAX} ranks: the lines of those past them are not published"
    ), said[-3:]
    assert len(published) == RANKS_MAX and all(" publishes on " in line for line in published)
    assert code == 0


@pytest.mark.processes
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("router.log", "Starting the router on 0.0.0.0:8000 with 2 workers\n"),
        ("decode-runbook.md", "If decode says `Lost connection with prefill instance`, check the bootstrap port.\n"),
    ],
    ids=["a-router-log", "a-runbook-quoting-decode"],
)
def test_a_sidecar_with_no_role_on_a_file_that_is_no_sglang_log_says_only_that_and_publishes_no_rank(
    tmp_path: Path, name: str, text: str
):
    """With no --role, a sidecar on a wrong file (a router's log) said first that it waited for the file's lines to
    tell prefill or decode, `--role says it now`: no line of it ever will. A runbook that quotes a decode's words
    (`Lost connection with prefill instance`) was taken for a decode server's log: the sidecar published
    decode-0/TP0, listed alive by every view, while it said nothing of the file is published. Either says the file
    is no SGLang server log, and nothing of a role."""
    import subprocess
    import sys

    path = tmp_path / name
    path.write_text(text)
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    with subprocess.Popen([command, "agent", "--sglang-log", str(path)], stderr=subprocess.PIPE, text=True) as ran:
        assert ran.stderr is not None
        said = ran.stderr.readline()  # blocks until the first line: the test's timeout bounds it
        ran.terminate()
        ran.wait(timeout=20)

    assert said.strip() == (
        f"kvtop agent: {path}: not an SGLang server log (no line at its start or end is in SGLang's format): "
        "nothing of it is published"
    )
