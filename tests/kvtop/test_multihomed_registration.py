"""A rank the bootstrap refuses for its endpoint's address, as an operator of a multi-homed host meets it: the
agent exits 1 saying what was refused, why and the fix, and `kvtop status` and `kvtop check` name the refusal
(they said only that no agent answered). Real processes on this machine's own non-loopback addresses: a test
skips where the machine has too few."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from kvtop_cli import StderrLines, kvtop, kvtop_here

from transport import BootstrapServer
from transport.registration import foreign_endpoint

pytestmark = pytest.mark.processes


def _addresses(count: int) -> list[str]:
    """`count` non-loopback IPv4 addresses of this machine (the test skips without them)."""
    found = sorted(
        {
            address.address
            for addresses in psutil.net_if_addrs().values()
            for address in addresses
            if address.family.name == "AF_INET" and not ipaddress.ip_address(address.address).is_loopback
            and not ipaddress.ip_address(address.address).is_link_local
        }
    )  # fmt: skip
    if len(found) < count:
        pytest.skip(f"this machine has {len(found)} non-loopback IPv4 addresses, the test needs {count}")
    return found[:count]


@pytest.fixture
def service_at() -> Iterator[list[BootstrapServer]]:
    """Bootstrap services the test starts (on an address of its choosing), closed after it."""
    servers: list[BootstrapServer] = []
    yield servers
    for server in servers:
        server.close()


def _agent(bootstrap: str, host: str) -> tuple[int, str]:
    """Run `kvtop agent` (a prefill rank bound to `host`) until it exits: (exit code, its stderr)."""
    done = kvtop("agent", "--role", "prefill", "--instance", "prefill-0", "--bootstrap", bootstrap, "--host", host,
                 "--insecure")  # fmt: skip
    return done.returncode, done.stderr


def test_a_wildcard_host_is_refused_with_the_fix_in_the_agents_output_status_and_check(service_at) -> None:
    """--host 0.0.0.0 reaching the bootstrap over the network: refused (nobody can dial 0.0.0.0), said with the
    fix by the agent (exit 1), `kvtop status` and `kvtop check`, not only in the bootstrap's counters."""
    (own,) = _addresses(1)
    server = BootstrapServer(host=own).start()
    service_at.append(server)

    code, stderr = _agent(server.endpoint, "0.0.0.0")
    status = kvtop_here("status", "--bootstrap", server.endpoint, "--wait", "1")
    check = kvtop_here("check", "--bootstrap", server.endpoint, "--wait", "1")

    why = f"is a wildcard address registered from {own}: nobody can dial it"
    fix = f"the address its peers reach it at (`kvtop agent --host`; the service sees {own})"
    assert code == 1
    assert "prefill-0/TP0 cannot register" in stderr and why in stderr and fix in stderr
    assert status.returncode == 1
    assert f"no agent listed by {server.endpoint}" in status.stderr
    assert "the bootstrap service refused prefill-0/TP0: " in status.stderr
    assert why in status.stderr
    assert check.returncode == 2
    assert check.stdout.startswith("KVTOP CRITICAL - no ranks listed or discovered; the bootstrap service refused")
    assert why in check.stdout


def test_a_data_network_address_is_refused_naming_endpoint_network_and_taken_with_it(service_at) -> None:
    """A host that reaches the bootstrap from one address and binds its rank on another: refused, the agent naming
    the bootstrap's --endpoint-network for that address; a service given that network lists the rank."""
    management, data = _addresses(2)
    strict = BootstrapServer(host=management).start()
    service_at.append(strict)

    code, stderr = _agent(strict.endpoint, data)

    assert code == 1
    assert f"is not the registering client's address {management}" in stderr
    assert f"start the bootstrap with --endpoint-network {data}/32" in stderr

    allowing = BootstrapServer(host=management, endpoint_networks=[ipaddress.ip_network(data)]).start()
    service_at.append(allowing)
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    args = ["agent", "--role", "prefill", "--instance", "prefill-0", "--bootstrap", allowing.endpoint, "--host", data]
    agent = subprocess.Popen([command, *args, "--insecure"], stderr=subprocess.PIPE, text=True)
    try:
        ready = StderrLines(agent).next("[", timeout_s=60)
        assert f"prefill rank 0 of prefill-0 ready: data tcp://{data}:" in ready
        assert [entry.data_endpoint.rpartition(":")[0] for entry in allowing.agents()] == [f"tcp://{data}"]
    finally:
        agent.terminate()
        agent.wait(timeout=30)


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("tcp://10.1.2.4:5000", "start the bootstrap with --endpoint-network 10.1.2.4/32"),
        ("tcp://[fd00::4]:5000", "--endpoint-network fd00::4/128"),
        ("tcp://127.0.0.1:5000", "a loopback address registered from 10.1.2.3"),
        ("tcp://0.0.0.0:5000", "a wildcard address registered from 10.1.2.3: nobody can dial it"),
        ("tcp://[::]:5000", "a wildcard address"),
    ],
)
def test_each_foreign_endpoint_refusal_names_its_fix(endpoint: str, said: str) -> None:
    """The refusal reaches the refused rank's own log: it says what to change, on the bootstrap or the rank."""
    problem = foreign_endpoint(endpoint, "10.1.2.3")

    assert said in problem
    assert "--endpoint-network" in problem or "kvtop agent --host" in problem


def test_a_wildcard_endpoint_is_refused_even_inside_an_endpoint_network() -> None:
    """0.0.0.0 is in 0.0.0.0/0, but no reader can dial it: a network allows real addresses only."""
    assert "wildcard" in foreign_endpoint("tcp://0.0.0.0:5000", "10.1.2.3", [ipaddress.ip_network("0.0.0.0/0")])
