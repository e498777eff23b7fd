"""Small helpers shared by every socket loop: opening with a size bound, binding, routing ids, draining.

Every socket is opened by `open_socket`, which sets `ZMQ_MAXMSGSIZE` from the
table below: libzmq drops a connection whose next frame is larger than the
bound, after reading only the frame's size, so no peer can make a socket
allocate more (a PUB counts too: what a subscriber sends it are subscriptions,
and libzmq keeps each one in a trie).

    socket                                        largest inbound frame
    control ROUTER (agent), control DEALER        SMALL_FRAME: Submit, GetStats, Digest; their replies
    bootstrap ROUTER (service)                    SMALL_FRAME: Register, Deregister, Resolve, ListAgents
    bootstrap DEALER (agents, kvtop)              LIST_FRAME: an AgentList or Route
    snapshot ROUTER (agent)                       SMALL_FRAME: SnapshotRequest
    snapshot DEALER (subscriber)                  LIST_FRAME: a Snapshot
    event PUB, consensus PUB (XPUB, manual)       SMALL_FRAME: subscriptions (see `serve_subscriptions`)
    event SUB (subscriber), consensus SUB         LIST_FRAME: an EventBatch, a Vote
    data ROUTER (prefill)                         LIST_FRAME: a TransferRequest (a list of pages)
    data DEALER (decode)                          `data_frame_bound`: one chunk's payload frame

With CURVE on (`transport.curve`), every one of these sockets is opened with the keys of its side:
the one that binds as the server, the one that connects as a client.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import zmq

from transport.counters import Counters
from transport.curve import CurveSide
from transport.errors import FrameRejected
from transport.wire import MAX_CONTROL_FRAME, FrameDecoder

T = TypeVar("T")

HEADER_SLACK: Final = 64 << 10
SMALL_FRAME: Final = 64 << 10
"""Messages of a few fields (a registration, a request, a result, a subscription)."""
SUBSCRIPTION_FRAME: Final = 1024
"""What a subscriber sends a publisher that forwards subscriptions as they come (a relay's XPUB): kvtop's are one
byte (the whole stream), and a CURVE handshake's commands a few hundred; libzmq keeps every distinct topic, so a
peer's 60 KB topics took a relay to gigabytes."""
LIST_FRAME: Final = MAX_CONTROL_FRAME + HEADER_SLACK
"""Messages that carry lists (pages, agents, rooms, events): the decoders' own limit, plus slack."""


def data_frame_bound(chunk_bytes: int, page_bytes: int) -> int:
    """The largest frame a decode rank's data link accepts: one chunk (or one page, when pages are larger)."""
    return max(chunk_bytes, page_bytes) + HEADER_SLACK


def open_socket(
    context: zmq.Context[zmq.Socket[bytes]], kind: int, max_frame: int, curve: CurveSide | None = None
) -> zmq.Socket[bytes]:
    """A socket of `kind` that closes without lingering and accepts no frame above `max_frame` bytes.

    `curve`: its CURVE side (`CurveKeys.server` for a socket that binds, `.client` for one that connects);
    None for plain TCP.
    """
    sock: zmq.Socket[bytes] = context.socket(kind)
    sock.linger = 0
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
    if curve is not None:
        try:
            curve.apply(sock)
        except BaseException:
            sock.close(linger=0)
            raise
    return sock


def send_now(sock: zmq.Socket[bytes], frame: bytes) -> bool:
    """Send `frame` if `sock` takes it at once; False where it would wait. A dialing DEALER whose peer refused
    its CURVE key has no connection left to queue on after its first message: a blocking send there never
    returns, so requests to a peer go this way and count on their deadline or retry instead."""
    try:
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


def open_publisher(context: zmq.Context[zmq.Socket[bytes]], curve: CurveSide | None = None) -> zmq.Socket[bytes]:
    """A PUB that lets its owner see what subscribers send (XPUB in manual mode), bounded like a PUB."""
    sock = open_socket(context, zmq.XPUB, SMALL_FRAME, curve)
    sock.setsockopt(zmq.XPUB_MANUAL, 1)
    return sock


def serve_subscriptions(sock: zmq.Socket[bytes], counters: Counters, limit: int = 1000) -> None:
    """Apply what subscribers sent an `open_publisher` socket: a subscription to the whole stream is served.

    A subscription to a topic is refused and counted (`unexpected`): these streams are served whole, and
    libzmq would keep every distinct topic in memory. A frame that is no subscription is `malformed`.
    Unsubscriptions are ignored (a SUB filters on its own side too).
    """
    for _ in range(limit):
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        if frame == b"\x01":
            sock.setsockopt(zmq.SUBSCRIBE, b"")  # manual mode: applies to the pipe that sent it
        elif frame[:1] == b"\x01":
            counters.reject("unexpected")
        elif frame[:1] != b"\x00":
            counters.reject("malformed")


def bind_ephemeral(sock: zmq.Socket[bytes], host: str) -> str:
    """Bind `sock` to a free TCP port on `host`; returns the endpoint to connect to."""
    port = sock.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def bind_problem(endpoint: str) -> str:
    """Why `endpoint` cannot be bound, where libzmq would not say so ("" otherwise): a TCP port that is not
    0..65535 or `*` (libzmq binds port 99999 as 34463, and -1 as 65535)."""
    scheme, _, rest = endpoint.partition("://")
    port = rest.rpartition(":")[2]
    if scheme != "tcp" or port == "*" or (port.isdecimal() and port.isascii() and int(port) < 65536):
        return ""
    return f"{endpoint[:80]!r} has no valid port (0 to 65535; 0 or * for a free one)"


def bind(sock: zmq.Socket[bytes], endpoint: str, host: str) -> str:
    """Bind to `endpoint`, or to a free port on `host` when it is empty; returns the endpoint. An endpoint
    that fails `bind_problem` raises `zmq.ZMQError` (EINVAL), as libzmq does for one it cannot parse."""
    if not endpoint:
        return bind_ephemeral(sock, host)
    if problem := bind_problem(endpoint):
        raise zmq.ZMQError(errno.EINVAL, problem)
    sock.bind(endpoint)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def drain_message(sock: zmq.Socket[bytes]) -> int:
    """Discard the rest of a multipart message; returns how many frames were dropped."""
    dropped = 0
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv_into(bytearray())
        dropped += 1
    return dropped


Salvage = Callable[[bytes], tuple[bytes, T] | None]
"""What a reader keeps of a malformed frame (`transport.plane.salvage`): (the frame to pass on, b"" where what
is kept is not the frame as it came; the message), or None to reject it whole."""


def decode_waiting(
    sock: zmq.Socket[bytes],
    decoder: FrameDecoder[T],
    counters: Counters,
    limit: int = 100_000,
    salvage: Salvage[T] | None = None,
) -> Iterator[T]:
    """Messages waiting on a single-frame socket (at most `limit`), decoded; rejections are counted and skipped
    (a malformed one that `salvage` keeps part of is yielded as it kept it)."""
    for _, message in decode_waiting_frames(sock, decoder, counters, limit, salvage):
        yield message


def decode_waiting_frames(
    sock: zmq.Socket[bytes],
    decoder: FrameDecoder[T],
    counters: Counters,
    limit: int = 100_000,
    salvage: Salvage[T] | None = None,
) -> Iterator[tuple[bytes, T]]:
    """As `decode_waiting`, each message with the frame it came in (a recorder keeps it as it came)."""
    for _ in range(limit):
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            yield frame, decoder.decode(frame)
        except FrameRejected as rejected:
            kept = salvage(frame) if salvage is not None and rejected.reason == "malformed" else None
            if kept is None:
                counters.reject(rejected.reason)
            else:
                yield kept


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
