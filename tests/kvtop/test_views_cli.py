"""`kvtop status | ranks | rooms | events` against a live cluster, as the installed command."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_support import small_cluster
from kvtop_cli import kvtop, kvtop_here

from transport import Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec


def test_views_describe_a_cluster_that_moved_rooms_and_failed_one(make_cluster, control):
    """After two rooms (one corrupted), every view reports the ranks, the link, and the failure at the right level."""
    cluster = make_cluster(small_cluster({"prefill-0/TP0": "corrupt:1@decode-0"}))
    agents = {agent.label: control(agent.control_endpoint) for agent in cluster.agents()}
    agents["prefill-0/TP0"].submit(7, 4)
    agents["decode-0/TP0"].submit(7, 4, "prefill-0")
    for client in agents.values():
        client.wait_result(7, 10)

    ranks = json.loads(kvtop("ranks", "--bootstrap", cluster.endpoint, "--json").stdout)
    status = json.loads(kvtop("status", "--bootstrap", cluster.endpoint, "--json").stdout)
    rooms = json.loads(kvtop("rooms", "--bootstrap", cluster.endpoint, "--json").stdout)
    info_lines = kvtop("events", "--bootstrap", cluster.endpoint).stdout.splitlines()
    debug_lines = kvtop("events", "--bootstrap", cluster.endpoint, "--level", "debug", "--jsonl").stdout.splitlines()

    assert [(r["label"], r["role"], r["state"], r["origins"], r["echoes"]) for r in ranks] == [
        ("decode-0/TP0", "decode", "alive", 1, 0),
        ("prefill-0/TP0", "prefill", "alive", 0, 1),
    ]
    assert {"role", "instance", "rank", "host", "pid", "state"} <= set(ranks[0])
    assert (status["ranks"]["alive"], status["failure_rate"], status["top_origins"]) == (
        2,
        1.0,
        [["decode-0/TP0 checksum", 1]],
    )
    assert [(room["room"], room["outcome"], room["stuck"]) for room in rooms] == [(7, "failed", False)]
    failures = [line for line in info_lines if " failure " in line]
    assert len(failures) == 1 and "decode-0/TP0" in failures[0] and "ERROR" in failures[0]
    echoes = [json.loads(line) for line in debug_lines if json.loads(line)["kind"] == "failure"]
    assert sorted((e["agent"], e["level"], e["origin"]) for e in echoes) == [
        ("decode-0/TP0", "error", "decode-0/TP0"),
        ("prefill-0/TP0", "debug", "decode-0/TP0"),
    ]


@pytest.mark.processes
def test_views_fail_clearly_when_nobody_answers():
    """Each view exits 1 with a one-line reason when the bootstrap address is dead."""
    for view in ("status", "ranks", "rooms", "events", "failures"):
        result = kvtop(view, "--bootstrap", "tcp://127.0.0.1:9", "--wait", "0.3")
        assert (view, result.returncode) == (view, 1)
        assert "did not answer" in result.stderr


def test_a_relay_that_does_not_answer_is_named_a_relay_not_a_bootstrap():
    """`--relay ADDR` shared one parameter with --bootstrap: a dead relay was said as `bootstrap ADDR did not
    answer`, naming an option the user never gave."""
    status = kvtop_here("status", "--relay", "tcp://127.0.0.1:9", "--wait", "0.3")
    check = kvtop_here("check", "--wait", "0.3", env={"KVTOP_RELAY": "tcp://127.0.0.1:9"})
    both = kvtop_here("status", "--relay", "tcp://127.0.0.1:9", "--bootstrap", "tcp://127.0.0.1:8")

    assert status.returncode == 1
    assert "relay tcp://127.0.0.1:9 did not answer" in status.stderr and "bootstrap" not in status.stderr
    assert check.returncode == 2
    assert "relay tcp://127.0.0.1:9 did not answer" in check.stdout and "bootstrap" not in check.stdout
    assert both.returncode == 2
    assert "give --bootstrap or --relay, not both" in both.stderr
    typed_over_env = kvtop_here("status", "--relay", "tcp://127.0.0.1:9", "--wait", "0.3",
                                env={"KVTOP_BOOTSTRAP": "tcp://127.0.0.1:8"})  # fmt: skip
    assert typed_over_env.returncode == 1
    assert "relay tcp://127.0.0.1:9 did not answer" in typed_over_env.stderr


def test_check_at_an_http_port_says_it_is_another_servers_not_a_curve_matter():
    """SGLang's own bootstrap port (HTTP: silent until asked) given as kvtop's bootstrap: CRITICAL as unreachable,
    and why, where it said `(if it serves CURVE, pass its --curve-keys)`."""
    with socket.socket() as http:
        http.bind(("127.0.0.1", 0))
        http.listen()  # the kernel takes the connections; the server never speaks first
        port = http.getsockname()[1]
        result = kvtop_here("check", "--bootstrap", f"tcp://127.0.0.1:{port}", "--wait", "0.5")

    assert result.returncode == 2
    assert result.stdout.startswith(f"KVTOP CRITICAL - cluster unreachable at tcp://127.0.0.1:{port}: ")
    assert f"(127.0.0.1:{port} took the connection but sent no ZeroMQ greeting within " in result.stdout
    assert "SGLang's own bootstrap port is an HTTP one" in result.stdout and "CURVE" not in result.stdout


def test_views_reject_an_address_that_is_not_one():
    """A malformed --bootstrap is bad usage (exit 2) with a message that shows the expected form."""
    result = kvtop_here("status", "--bootstrap", "garbage")

    assert result.returncode == 2
    assert "tcp://127.0.0.1:5555" in result.stderr


def test_a_bad_bootstrap_address_from_the_environment_names_its_variables_as_words():
    """Typer named the variables of --bootstrap as a Python list: "(env var: '['KVTOP_BOOTSTRAP', ...]')"."""
    result = kvtop_here("status", env={"KVTOP_BOOTSTRAP": "garbage"})
    relay = kvtop_here("status", env={"KVTOP_RELAY": "garbage"})

    assert result.returncode == 2
    assert "'--bootstrap' (or KVTOP_BOOTSTRAP): 'garbage' is not an address" in result.stderr
    assert "[" not in result.stderr.splitlines()[-1]
    assert "'--relay' (or KVTOP_RELAY): 'garbage' is not an address" in relay.stderr


def test_agents_given_by_event_endpoint_are_seen_like_discovered_ones(make_cluster):
    """`--connect EP` (no bootstrap) finds every rank, alive, with the identity from its snapshot."""
    cluster = make_cluster(ClusterSpec(prefill_tp=2, num_pages=16, page_bytes=4096))
    connect = [arg for agent in cluster.agents() for arg in ("--connect", agent.event_endpoint)]

    ranks = json.loads(kvtop("ranks", *connect, "--json").stdout)

    assert [(r["label"], r["state"], r["pid"] > 0) for r in ranks] == [
        ("decode-0/TP0", "alive", True),
        ("prefill-0/TP0", "alive", True),
        ("prefill-0/TP1", "alive", True),
    ]


def _status_following(bootstrap: str) -> subprocess.Popen[str]:
    """`kvtop status --follow --json` on `bootstrap`, a frame every 0.2 s on its stdout."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "status", "--bootstrap", bootstrap, "--follow", "--json", "--interval", "0.2"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def test_status_follow_prints_json_lines_until_interrupted(make_cluster):
    """`status --follow --json` prints one JSON object per interval and ends cleanly on Ctrl-C."""
    import signal

    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    with _status_following(cluster.endpoint) as process:
        assert process.stdout is not None
        frames = [json.loads(process.stdout.readline()) for _ in range(2)]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0

    assert [frame["ranks"]["alive"] for frame in frames] == [2, 2]


def test_status_follow_says_when_the_bootstrap_service_stops_answering(make_cluster):
    """It printed its ranks going gone and nothing of the service: silence looked like ranks that went quiet."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    with _status_following(cluster.endpoint) as process:
        assert process.stdout is not None
        try:
            assert json.loads(process.stdout.readline()).get("source_error") is None
            cluster.bootstrap.close()
            said = ""
            for _, line in zip(range(150), process.stdout, strict=False):  # a frame each 0.2 s, an ask each 2 s
                if said := json.loads(line).get("source_error", ""):
                    break
        finally:
            process.terminate()
            process.wait(timeout=10)

    assert said.startswith(
        f"bootstrap {cluster.endpoint} stopped answering (none within"
    )  # it answered before: no hint of keys


def test_events_of_a_live_cluster_show_one_line_per_failure_and_keep_the_raw_level(make_cluster, control):
    """Both ranks of prefill-0 fail room 9 (no decode ever asks): one line by default; --debug shows the other
    rank's at debug with the level it published as raw_level; lines come in time order across the agents.
    (CI once saw a decode rank's heartbeat in the --debug tail: one that came live while the snapshots were
    awaited on a loaded machine.)"""
    spec = ClusterSpec(
        prefill_tp=2,
        num_pages=16,
        page_bytes=4096,
        transfer=TransferConfig(timeouts=Timeouts(1, 3, 2)),
    )
    cluster = make_cluster(spec)
    prefills = [control(a.control_endpoint) for a in cluster.agents() if a.role == "prefill"]
    for client in prefills:
        client.submit(9, 4)
    for client in prefills:
        client.wait_result(9, 10)

    lines = kvtop("events", "--bootstrap", cluster.endpoint, "--jsonl").stdout.splitlines()
    default = [json.loads(line) for line in lines]
    debug = kvtop("events", "--bootstrap", cluster.endpoint, "--jsonl", "--debug").stdout.splitlines()
    events = [json.loads(line) for line in debug]
    failures = [event for event in events if event["kind"] == "failure"]

    assert [(e["room"], e["level"]) for e in default if e["kind"] == "failure"] == [(9, "warning")]
    assert sorted(e["rank"] for e in failures) == ["prefill-0/TP0", "prefill-0/TP1"]
    assert sorted(e["level"] for e in failures) == ["debug", "warning"]
    assert [e["raw_level"] for e in failures if e["level"] == "warning"] == ["warning"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    # the two prefill ranks' rooms and failures, interleaved; a heartbeat (any agent's) may arrive while kvtop
    # waits for the snapshots, and shows at debug too
    assert {e["agent"] for e in events if e["kind"] != "heartbeat"} == {"prefill-0/TP0", "prefill-0/TP1"}


@pytest.mark.processes
def test_views_exit_1_with_one_line_when_no_agent_answers():
    """Each view given only a dead endpoint exits 1 with one stderr line that names it, and prints nothing."""
    for view in ("status", "ranks", "rooms", "events", "failures"):
        result = kvtop(view, "--connect", "tcp://127.0.0.1:1", "--wait", "0.3")

        assert (view, result.returncode, result.stdout) == (view, 1, "")
        assert result.stderr.splitlines() == ["kvtop: no agent answered within 0.3s (tcp://127.0.0.1:1)"]


def test_ranks_lists_an_endpoint_that_never_answered_as_gone(make_cluster):
    """`ranks` beside a live agent lists the dead endpoint as a gone rank, never heard from."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    live = next(agent for agent in cluster.agents() if agent.role == "decode")

    ranks = json.loads(
        kvtop("ranks", "--connect", live.event_endpoint, "--connect", "tcp://127.0.0.1:1", "--json").stdout
    )

    assert [(r["label"], r["state"], r["last_seen_s"]) for r in ranks if r["state"] != "alive"] == [
        ("tcp://127.0.0.1:1", "gone", None)
    ]
    assert [r["label"] for r in ranks if r["state"] == "alive"] == [live.label]


def _interrupted_while_waiting(view: str, wait_for) -> subprocess.CompletedProcess[str]:
    """`kvtop VIEW` waiting 30 s on an endpoint that never answers, Ctrl-C once its sockets are up."""
    import signal

    import psutil

    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, view, "--connect", "tcp://127.0.0.1:1", "--wait", "30"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        waiting = psutil.Process(process.pid)
        wait_for(lambda: waiting.num_threads() >= 3, timeout=30, what="its ZeroMQ threads up (it waits)")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=20)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.processes
def test_ctrl_c_before_a_view_showed_anything_exits_130_saying_so(wait_for):
    """Ctrl-C while `status` waited exited 0 with no output, as if it had shown a healthy cluster."""
    done = _interrupted_while_waiting("status", wait_for)

    assert (done.returncode, done.stdout) == (130, "")
    assert "kvtop: interrupted before the source answered" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_ctrl_c_before_a_check_judged_is_unknown_on_stdout(wait_for):
    """`check` exited 130 with nothing on stdout, where monitoring reads why."""
    done = _interrupted_while_waiting("check", wait_for)

    assert done.returncode == 3
    assert done.stdout.startswith("KVTOP UNKNOWN - interrupted before the source was judged")


@pytest.mark.processes
@pytest.mark.parametrize(
    "library",
    ["msgspec/_core", "zmq/backend/cython/_zmq"],
    ids=["while-kvtop-loads-its-command", "while-the-check-opens-its-source"],
)
def test_ctrl_c_at_any_moment_before_a_check_judged_is_unknown_on_stdout(library: str, wait_for):
    """A Ctrl-C while kvtop's modules loaded printed a traceback and exited 130, one while Typer ran the command
    exited 130 with stdout empty: wherever it lands before the verdict (a bootstrap that never answers: no verdict
    for 30 s), `check` says UNKNOWN on stdout, exit 3, no traceback. The moment: once a library the command loads
    on its way is mapped (msgspec: the command's modules, before Typer runs it; pyzmq: the check's live source, in
    its body; a check loads no numpy). Typer's option parsing has no such library since kvtop reads its options
    without pydantic."""
    import signal

    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "check", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "30"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        maps = f"/proc/{process.pid}/maps"
        wait_for(lambda: library in open(maps).read(), timeout=30, what=f"{library} loaded")  # noqa: SIM115
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=20)

    assert process.returncode == 3, (stdout, stderr)
    assert stdout.startswith("KVTOP UNKNOWN - interrupted before the source was judged")
    assert "Traceback" not in stderr


_LANDS_IN = {
    "a-class-body": (
        "class Describes:\n"
        "    def __set_name__(self, owner, name):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        sum(range(100_000))\n"
        "class Spec:\n"
        "    field = Describes()\n"
    ),
    "a-library-that-swallows-it": (
        "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    sum(range(100_000))\nexcept BaseException:\n    pass\n"
    ),
}
"""Code a Ctrl-C may land in while a check loads: a class body whose `__set_name__` turns any exception into a
RuntimeError (a dataclass's field; seen: a traceback and exit 1), and an import guarded by `except BaseException`
(the check then waited out its --wait)."""


@pytest.mark.processes
@pytest.mark.parametrize("as_json", [False, True], ids=["nagios", "json"])
@pytest.mark.parametrize("code", list(_LANDS_IN.values()), ids=list(_LANDS_IN))
def test_ctrl_c_landing_in_code_that_would_hide_it_is_still_unknown(code: str, as_json: bool):
    """The console entry point runs a command whose code stands in for what a check runs while it loads, then
    carries on (prints `carried on`): the Ctrl-C must end the check UNKNOWN wherever it lands."""
    body = "\n".join(f"    {line}" for line in code.splitlines())
    argv = ["kvtop", "check", "--bootstrap", "tcp://127.0.0.1:9"] + ["--json"] * as_json
    script = (
        "import os, signal, sys\n"
        "import kvtop.cli.app as app\n"
        "def command():\n"
        f"{body}\n"
        "    print('carried on')\n"
        "app.main = command\n"
        f"sys.argv = {argv!r}\n"
        "from kvtop.cli.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)

    said = "interrupted before the source was judged"
    assert done.returncode == 3, done
    if as_json:
        assert json.loads(done.stdout) == {"verdict": "UNKNOWN", "summary": said, "problems": [said], "exit_code": 3}
    else:
        assert done.stdout == f"KVTOP UNKNOWN - {said}\n"
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_ctrl_c_while_a_view_loads_its_model_is_said_too(wait_for):
    """A Ctrl-C that landed while `status` loaded its modules (Typer running it, before its source was opened)
    exited 130 with nothing said at all (Typer's exit, any command's: `cluster up` too); it says why now."""
    import signal

    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = [command, "status", "--bootstrap", "tcp://127.0.0.1:9", "--wait", "30"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        maps = f"/proc/{process.pid}/maps"
        library = "zmq/backend/cython/_zmq"  # the live source's: loaded in the view's body
        wait_for(lambda: library in open(maps).read(), timeout=30, what=f"{library} loaded")  # noqa: SIM115
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=20)

    assert (process.returncode, stdout) == (130, ""), stderr
    assert stderr.startswith("kvtop: interrupted before"), stderr
    assert "Traceback" not in stderr


@pytest.mark.processes
def test_a_bootstrap_that_lists_no_agent_is_said_to_list_none(bootstrap):
    """A bootstrap service whose agents had all deregistered: `no agent answered within 2s (listed by ...)`, as if
    agents had hung; it answered, listing none, and the line says so."""
    done = kvtop_here("ranks", "--bootstrap", bootstrap.endpoint, "--wait", "0.5")

    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"kvtop: no agent listed by {bootstrap.endpoint} (none registered there, or every one deregistered)\n"
    )


@pytest.mark.processes
def test_ctrl_c_while_cluster_up_loads_exits_130_as_the_readme_says():
    """A Ctrl-C while `cluster up` loads exits 130 (`interrupted before it began`), which the README's exit codes
    gave to views alone: its 130 row now names any command before it began, and a service's clean stop after."""
    script = (  # the command's modules stand in by one whose load is where the Ctrl-C lands
        "import os, signal, sys, types\n"
        "class Loading(types.ModuleType):\n"
        "    def __getattr__(self, name):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        sum(range(10_000_000))\n"
        "        raise AttributeError(name)\n"
        "import kvtop.cli\n"
        "sys.modules['kvtop.cli.app'] = Loading('kvtop.cli.app')\n"
        "sys.argv = ['kvtop', 'cluster', 'up']\n"
        "from kvtop.cli.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| 130 |"))

    assert (done.returncode, done.stderr) == (130, "kvtop: interrupted before it began\n")
    assert "any command while kvtop loads" in row and "`kvtop: interrupted before it began`" in row
    assert "Once a service or `cluster up` began, Ctrl-C is a clean stop (0)" in row
