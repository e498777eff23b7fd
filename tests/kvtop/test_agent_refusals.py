"""`kvtop agent` and `python -m transport.harness.agent` refuse, before the rank starts, what it could not start
with or the bootstrap would refuse: one line, exit 2, no rank run (each was a traceback, or a refusal later)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop, kvtop_here

from kvtop.cli import agent_cmd
from transport.config import Role
from transport.harness.agent import OPTIONS_JSON, AgentOptions, child_args, parse_args

BASE = ("--role", "prefill", "--bootstrap", "tcp://127.0.0.1:9")
PETABYTE_POOL = ("--pages", str(1 << 20), "--page-bytes", str(1 << 30))


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[AgentOptions]:
    """The options each `kvtop agent` would have run a rank with."""
    seen: list[AgentOptions] = []
    monkeypatch.setattr(agent_cmd, "run_rank", lambda options: seen.append(options) or 0)
    return seen


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--log-file", "/tmp"), "kvtop: --log-file /tmp is a folder (give a file in it)"),
        (("--log-file", "/proc/nope/x"), "kvtop: --log-file /proc/nope/x: no folder /proc/nope"),
        (("--rank", "5", "--tp", "2"), "kvtop: --rank/--tp: rank 5 of TP 2 (TP 1 to 1024, 0 <= rank < TP)"),
        (PETABYTE_POOL, "kvtop: --pages/--page-bytes: a KV pool of 1048576 pages of 1073741824 B (1048576.0 GiB)"),
    ],
    ids=["log-file-folder", "log-file-no-folder", "rank-past-tp", "pool-past-memory"],
)
def test_agent_refuses_options_it_could_not_start_with(
    ran: list[AgentOptions], args: tuple[str, ...], said: str
) -> None:
    """A log file it cannot write, a rank outside its TP, a pool larger than the machine: one line, exit 2."""
    done = kvtop_here("agent", *BASE, "--instance", "prefill-0", *args)

    assert (done.returncode, ran) == (2, [])
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1


@pytest.mark.parametrize("instance", ["", "a b/c", "x" * 65])
def test_agent_refuses_an_instance_name_in_the_bootstraps_words(ran: list[AgentOptions], instance: str) -> None:
    """The bootstrap would refuse the name later ('registration ... refused: instance name ...'): said at start."""
    done = kvtop_here("agent", *BASE, "--instance", instance)

    assert (done.returncode, ran) == (2, [])
    rule = "(letters, digits, '.', '_', '-'; at most 64)"
    assert done.stderr == f"kvtop: --instance: instance name {instance!r} {rule}\n"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--log-level", "LOUD"), "--log-level"),
        (("--page-bytes", "9999999999999"), "--page-bytes"),
        (("--tp", "1025"), "--tp"),
        (("--control", "tcp://127.0.0.1:99999"), "--control"),
        (("--control", "tcp://127.0.0.1:-1"), "--control"),
    ],
    ids=["log-level", "page-bytes", "tp", "control-port-past-65535", "control-port-negative"],
)
def test_agent_refuses_values_outside_its_options_ranges(
    ran: list[AgentOptions], args: tuple[str, ...], option: str
) -> None:
    """A level logging does not know, a page past 1 GiB (a MemoryError), a port libzmq would wrap: usage errors."""
    done = kvtop_here("agent", *BASE, "--instance", "prefill-0", *args)

    assert (done.returncode, ran) == (2, [])
    assert f"Invalid value for '{option}'" in done.stderr


def test_agent_takes_a_log_level_in_any_case(ran: list[AgentOptions]) -> None:
    """The level is a choice of logging's levels, in any case."""
    done = kvtop_here("agent", *BASE, "--instance", "prefill-0", "--log-level", "warning")

    assert done.returncode == 0, done.stderr
    assert [options.log_level for options in ran] == ["WARNING"]


def test_agent_refuses_a_bootstrap_port_past_65535(ran: list[AgentOptions]) -> None:
    """libzmq would dial tcp://127.0.0.1:99999 as port 34463."""
    done = kvtop_here("agent", "--role", "prefill", "--instance", "p-0", "--bootstrap", "tcp://127.0.0.1:99999")

    assert (done.returncode, ran) == (2, [])
    assert done.stderr == "kvtop: --bootstrap: 'tcp://127.0.0.1:99999' has no valid port (1 to 65535)\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--log-level", "loud"), "argument --log-level: invalid choice: 'LOUD'"),
        (("--instance", "a b/c"), "--instance: instance name 'a b/c'"),
        (("--control", "tcp://127.0.0.1:99999"), "--control: 'tcp://127.0.0.1:99999' has no valid port"),
        (("--page-bytes", str(1 << 31)), "--page-bytes: page size 2147483648 B (1 to 1073741824)"),
    ],
    ids=["log-level", "instance", "control-port", "page-bytes"],
)
def test_python_m_agent_refuses_the_same_as_usage_errors(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], said: str
) -> None:
    """`python -m transport.harness.agent` checks the same options: argparse's usage error, exit 2."""
    with pytest.raises(SystemExit) as exited:
        parse_args(["--role", "prefill", "--instance", "p-0", "--bootstrap", "tcp://127.0.0.1:9", *args])

    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_agent_options_from_json_are_checked_as_well(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A harness's options (one JSON object) go through the same checks: a log file in a missing folder."""
    fields = json.loads(child_args(AgentOptions(Role.PREFILL, "p-0", 0, 1, "tcp://127.0.0.1:9"))[1])
    fields["log_file"] = str(tmp_path / "gone" / "p.log")

    with pytest.raises(SystemExit) as exited:
        parse_args([OPTIONS_JSON, json.dumps(fields)])

    assert exited.value.code == 2
    assert f"--log-file {tmp_path / 'gone' / 'p.log'}: no folder {tmp_path / 'gone'}" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("log_file", [False, True], ids=["log-on-stderr", "log-file"])
def test_an_agent_whose_bootstrap_does_not_answer_exits_1_with_one_line_and_no_traceback(tmp_path, log_file):
    """The registration's 10 s go by; it ended in a BootstrapError traceback (logged, then raised again), then
    said the error twice on stderr (the rank's log line, then kvtop's): once, kvtop's where the log is a file."""
    logged = ("--log-file", str(tmp_path / "rank.log")) if log_file else ()
    done = kvtop("agent", "--role", "prefill", "--instance", "prefill-0", "--bootstrap", "tcp://127.0.0.1:1", *logged)

    said = (
        "bootstrap tcp://127.0.0.1:1 did not answer within 10.0s "
        "(nothing listens on 127.0.0.1:1: the connection was refused)"
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if said in line] == [
        f"kvtop: {said}" if log_file else done.stderr.splitlines()[-1]
    ]
    assert done.stderr.splitlines()[-1].endswith(f"prefill-0/TP0 cannot register: {said}") or log_file
