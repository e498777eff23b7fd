"""`sockets.bind` refuses a TCP port libzmq would wrap (99999 bound as 34463, -1 as 65535) with the EINVAL libzmq
gives an address it cannot parse; a bootstrap client names the service it dials in its errors."""

from __future__ import annotations

import errno

import pytest
import zmq

from transport.bootstrap import BootstrapClient
from transport.errors import BootstrapError
from transport.sockets import bind, bind_problem


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:0", "tcp://127.0.0.1:*", "tcp://*:65535", "tcp://[::1]:5555"])
def test_bind_problem_passes_ports_0_to_65535_and_star(endpoint: str) -> None:
    """Port 0 and * pick a free port; 65535 is the last."""
    assert bind_problem(endpoint) == ""


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:65536", "tcp://127.0.0.1:99999", "tcp://127.0.0.1:-1"])
def test_bind_problem_names_a_port_outside_0_to_65535(endpoint: str) -> None:
    """What libzmq would wrap silently is named, with the range."""
    assert bind_problem(endpoint) == f"{endpoint!r} has no valid port (0 to 65535; 0 or * for a free one)"


def test_bind_refuses_a_port_past_65535_as_libzmq_refuses_a_bad_address() -> None:
    """EINVAL, the reason in the message, and nothing bound."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    try:
        with pytest.raises(zmq.ZMQError) as refused:
            bind(sock, "tcp://127.0.0.1:99999", "127.0.0.1")
        assert refused.value.errno == errno.EINVAL
        assert "has no valid port" in str(refused.value)
        assert sock.getsockopt_string(zmq.LAST_ENDPOINT) == ""
    finally:
        context.destroy(linger=0)


def test_a_bootstrap_client_names_the_service_it_dials() -> None:
    """A relay answers listings as a bootstrap does: its client says 'relay' when it dials one."""
    said = r"^relay tcp://127\.0\.0\.1:9 did not answer within 0\.1s"
    with (
        BootstrapClient("tcp://127.0.0.1:9", timeout_s=0.1, service="relay") as client,
        pytest.raises(BootstrapError, match=said),
    ):
        client.listing()
