"""A service (agent, log sidecar, relay, exporter) stopped by SIGTERM at any moment of its start exits 0 with
no traceback, as it does once it runs: a supervisor that stops it early (a rollout, a teardown) read -15, or an
agent waiting on a silent bootstrap ignored the SIGTERM until its registration timed out, then exited 1."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import zmq

from transport.bootstrap import BootstrapServer

_SILENT = "tcp://127.0.0.1:9"
"""A bootstrap address nothing answers on."""


def _kvtop(*args: str) -> subprocess.Popen[str]:
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    return subprocess.Popen([command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_SERVICES = {
    "agent": ("agent", "--role", "prefill", "--instance", "prefill-0", "--bootstrap", _SILENT),
    "sidecar": ("agent", "--sglang-log", "{tmp}/prefill-0.log"),
    "relay": ("relay", "--bootstrap", _SILENT),
    "export": ("export", "--bootstrap", _SILENT, "--listen", "127.0.0.1:0"),
}


@pytest.mark.processes
@pytest.mark.parametrize("args", list(_SERVICES.values()), ids=list(_SERVICES))
def test_a_service_stopped_while_it_loads_exits_0(args: tuple[str, ...], tmp_path: Path, wait_for) -> None:
    """SIGTERM once msgspec's native module is mapped (kvtop's modules are loading: every service's options or
    module import transport's wire format; numpy no longer marks it, a relay never loads it): exit 0, one line,
    not killed by the signal."""
    with _kvtop(*(arg.format(tmp=tmp_path) for arg in args)) as process:
        maps = f"/proc/{process.pid}/maps"
        wait_for(lambda: "msgspec/_core" in open(maps).read(), timeout=30, what="msgspec loaded")  # noqa: SIM115
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 0, (stdout, stderr)
    assert "Traceback" not in stderr


def _answering_nothing(zmq_context: zmq.Context[zmq.Socket[bytes]]) -> tuple[zmq.Socket[bytes], str]:
    """A bootstrap address that takes requests and never answers them."""
    silent = zmq_context.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    return silent, f"tcp://127.0.0.1:{port}"


_WAITING = {
    "agent-registering": ("agent", "--role", "decode", "--instance", "decode-0", "--bootstrap", "{bootstrap}"),
    "relay-discovering": ("relay", "--bootstrap", "{bootstrap}"),
    "record-discovering": ("record", "--bootstrap", "{bootstrap}", "--wait", "60", "--out", "{tmp}/rec"),
}


@pytest.mark.processes
@pytest.mark.parametrize("args", list(_WAITING.values()), ids=list(_WAITING))
def test_a_service_stopped_while_its_bootstrap_keeps_it_waiting_exits_0(
    args: tuple[str, ...], tmp_path: Path, zmq_context: zmq.Context[zmq.Socket[bytes]], wait_for
) -> None:
    """SIGTERM once the bootstrap holds the service's first request: it stops (exit 0) instead of waiting the
    answer out (the agent: exit 1 "cannot register" after 10 s; the recorder: exit 1 after its --wait; the
    relay: killed by the signal)."""
    silent, bootstrap = _answering_nothing(zmq_context)
    try:
        with _kvtop(*(arg.format(bootstrap=bootstrap, tmp=tmp_path) for arg in args)) as process:
            wait_for(lambda: silent.poll(10), timeout=30, what="the service's request")
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=30)
    finally:
        silent.close(linger=0)

    assert process.returncode == 0, (stdout, stderr)
    assert "cannot register" not in stderr and "did not answer" not in stderr
    assert "Traceback" not in stderr


@pytest.mark.processes
def test_a_closed_terminal_stops_a_running_agent_relay_and_exporter_cleanly_and_a_second_signal_is_ignored(
    bootstrap: BootstrapServer, wait_for
) -> None:
    """SIGHUP (the terminal closed), a SIGTERM right behind it: each exits 0, the agent and the relay deregistered.
    SIGHUP killed all three at once (-1): the agent and the relay stayed listed until their entries expired."""
    address = bootstrap.endpoint
    services = [_kvtop("agent", "--role", "decode", "--instance", "decode-0", "--bootstrap", address)]
    try:
        wait_for(lambda: bootstrap.agents(), timeout=30, what="the agent registered")
        services.append(_kvtop("relay", "--bootstrap", address, "--register"))
        services.append(_kvtop("export", "--bootstrap", address, "--listen", "127.0.0.1:0"))
        wait_for(lambda: bootstrap.relays(), timeout=30, what="the relay registered")
        for process in services[1:]:
            assert process.stdout is not None and process.stdout.readline(), "no address printed"
        for process in services:
            process.send_signal(signal.SIGHUP)
            process.send_signal(signal.SIGTERM)
        ended = [(process.wait(30), process.communicate()[1]) for process in services]
    finally:
        for process in services:
            process.kill()

    assert [code for code, _ in ended] == [0, 0, 0], ended
    assert not any("Traceback" in stderr or "before it began" in stderr for _, stderr in ended), ended
    assert (bootstrap.agents(), bootstrap.relays(), bootstrap.counters.snapshot()["deregistered"]) == ([], [], 2)


@pytest.mark.processes
def test_an_agent_whose_parent_is_killed_leaves_a_bootstrap_that_still_answers_cleanly(
    bootstrap: BootstrapServer, wait_for, tmp_path: Path
) -> None:
    """The parent-death check stops an agent whose parent died by SIGKILL; its bootstrap service, elsewhere, still
    answers: the agent deregisters (its entry gone at once, not expired later), as a stopped one does."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    agent_args = f"agent --role decode --instance decode-0 --bootstrap {bootstrap.endpoint}"
    with open(tmp_path / "agent.stderr", "wb") as stderr:
        parent = subprocess.Popen(["sh", "-c", f'"{command}" {agent_args} & wait'], stderr=stderr)
    agent = None
    try:
        wait_for(lambda: bootstrap.agents(), timeout=30, what="the agent registered")
        (agent,) = psutil.Process(parent.pid).children()

        parent.kill()

        parent.wait(30)
        wait_for(lambda: bootstrap.counters.snapshot()["deregistered"] == 1, timeout=30, what="the agent deregistered")
        wait_for(lambda: not agent.is_running(), timeout=30, what="the agent exited")
    finally:
        if agent is not None and agent.is_running():
            agent.kill()
        parent.kill()
    assert bootstrap.agents() == []
