"""`kvtop relay` exits 1 when an upstream does not answer at start, whichever way it was given (--connect ran on
with nobody there, exit 0), names an upstream relay a relay, and refuses durations and ports it cannot use."""

from __future__ import annotations

import socket

import pytest
from cluster_support import small_cluster
from kvtop_cli import kvtop_here

HINT = "(nothing listens on 127.0.0.1:1: the connection was refused)"


def test_relay_exits_1_when_an_agent_given_by_connect_publishes_nothing() -> None:
    """An event endpoint nobody publishes on is an upstream that does not answer: one line, exit 1."""
    done = kvtop_here("relay", "--connect", "tcp://127.0.0.1:1", "--duration", "5")

    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"kvtop: agent tcp://127.0.0.1:1 published nothing within 3.0s {HINT}\n"


def test_relay_names_an_upstream_relay_that_does_not_answer_a_relay() -> None:
    """`--relay ADDR` that does not answer was called a 'bootstrap' in the error."""
    done = kvtop_here("relay", "--relay", "tcp://127.0.0.1:1", "--duration", "5")

    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"kvtop: relay tcp://127.0.0.1:1 did not answer within 2.0s {HINT}\n"


def test_relay_runs_on_agents_given_by_connect_that_publish(make_cluster) -> None:
    """With a live agent's event endpoint it starts, relays until --duration and exits 0."""
    cluster = make_cluster(small_cluster())
    endpoint = cluster.agents()[0].event_endpoint

    done = kvtop_here("relay", "--connect", endpoint, "--duration", "0.2")

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kvtop relay: events at tcp://127.0.0.1:")


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_relay_refuses_a_duration_that_is_not_positive(value: str) -> None:
    """`--duration -1` and `nan` ran and exited 0 at once."""
    done = kvtop_here("relay", "--connect", "tcp://127.0.0.1:1", "--duration", value)

    assert done.returncode == 2
    assert "Invalid value for '--duration'" in done.stderr


@pytest.mark.parametrize("option", ["--listen", "--snapshot-listen"])
def test_relay_refuses_to_bind_a_port_past_65535(option: str) -> None:
    """libzmq binds port 99999 as 34463: the relay printed an address nobody asked for."""
    done = kvtop_here("relay", "--connect", "tcp://127.0.0.1:1", option, "tcp://127.0.0.1:99999")

    assert done.returncode == 2
    assert "'tcp://127.0.0.1:99999' has no valid port (0 to 65535; 0 or * for a free one)" in done.stderr


def test_bootstrap_refuses_to_bind_a_port_past_65535() -> None:
    """`kvtop bootstrap --listen tcp://127.0.0.1:99999` printed tcp://127.0.0.1:34463 and served there; now it is a
    usage error with the reason (exit 2)."""
    done = kvtop_here("bootstrap", "--listen", "tcp://127.0.0.1:99999")

    assert (done.returncode, done.stdout) == (2, "")
    assert "'tcp://127.0.0.1:99999' has no valid port (0 to 65535; 0 or * for a free one)" in done.stderr


@pytest.mark.parametrize("command", [("bootstrap",), ("relay", "--bootstrap", "tcp://127.0.0.1:1")])
def test_a_port_in_use_is_said_once(command: tuple[str, ...]) -> None:
    """`Address already in use (addr='tcp://127.0.0.1:P')` after the address: libzmq's text said it twice (the relay,
    binding more than one, names the address at the end, once)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"

        done = kvtop_here(*command, "--listen", address)

    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count(address) == 1 and "addr=" not in done.stderr  # the relay names which of its binds
    assert done.stderr.rstrip().endswith(("Address already in use", f"Address already in use: {address}"))
