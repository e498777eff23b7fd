"""Small helpers shared by every socket loop: binding, routing ids, draining."""

from __future__ import annotations

import zmq


def bind_ephemeral(sock: zmq.Socket[bytes], host: str) -> str:
    """Bind `sock` to a free TCP port on `host`; returns the endpoint to connect to."""
    port = sock.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def bind(sock: zmq.Socket[bytes], endpoint: str, host: str) -> str:
    """Bind to `endpoint`, or to a free port on `host` when it is empty; returns the endpoint."""
    if not endpoint:
        return bind_ephemeral(sock, host)
    sock.bind(endpoint)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def drain_message(sock: zmq.Socket[bytes]) -> int:
    """Discard the rest of a multipart message; returns how many frames were dropped."""
    dropped = 0
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv_into(bytearray())
        dropped += 1
    return dropped
