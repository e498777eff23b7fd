"""Small helpers shared by every socket loop: binding, routing ids, draining."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import zmq

from transport.counters import Counters
from transport.errors import FrameRejected
from transport.wire import FrameDecoder

T = TypeVar("T")


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


def decode_waiting(
    sock: zmq.Socket[bytes], decoder: FrameDecoder[T], counters: Counters, limit: int = 100_000
) -> Iterator[T]:
    """Messages waiting on a single-frame socket (at most `limit`), decoded; rejections are counted and skipped."""
    for _ in range(limit):
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            yield decoder.decode(frame)
        except FrameRejected as rejected:
            counters.reject(rejected.reason)


def decode_routed(frames: list[bytes], decoder: FrameDecoder[T], counters: Counters) -> tuple[bytes, T] | None:
    """(routing id, message) of a ROUTER's [identity, frame]; None (and a counted rejection) otherwise."""
    if len(frames) != 2:
        counters.reject("unexpected")
        return None
    identity, payload = frames
    try:
        return identity, decoder.decode(payload)
    except FrameRejected as rejected:
        counters.reject(rejected.reason)
        return None
