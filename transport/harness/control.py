"""A client of one agent's control socket: submit rooms, collect results, read stats."""

from __future__ import annotations

import itertools
import time
from typing import TypeVar

import zmq

from transport.curve import CurveKeys, dialing
from transport.errors import FrameRejected, TransportError
from transport.sockets import SMALL_FRAME, open_socket, send_now
from transport.wire import (
    ControlReply,
    Digest,
    DigestReply,
    FrameDecoder,
    GetStats,
    Refusal,
    RoomResult,
    Stats,
    Submit,
    Submitted,
    encode,
)

_R = TypeVar("_R", Submitted, Stats, DigestReply)


class ControlError(TransportError):
    """An agent refused a control request or did not answer in time."""


class ControlClient:
    """DEALER to an agent's control ROUTER. Room results arrive asynchronously; `results()` drains them."""

    def __init__(
        self, endpoint: str, context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveKeys | None = None
    ) -> None:
        self.endpoint = endpoint
        self.socket = open_socket(context or zmq.Context.instance(), zmq.DEALER, SMALL_FRAME, dialing(curve))
        self.socket.connect(endpoint)
        self._ids = itertools.count(1)
        self._decoder: FrameDecoder[ControlReply] = FrameDecoder(ControlReply)
        self._results: list[RoomResult] = []
        self.refusals: list[Refusal] = []
        """Refusals of `submit_nowait` requests, for the caller to drain."""
        self.rejected = 0
        self._waiting: set[int] = set()

    def close(self) -> None:
        self.socket.close(linger=0)

    def submit_nowait(self, room: int, num_pages: int, prefill_instance: str = "") -> int:
        """Send a Submit; its Submitted/Refusal reply is read by `results()`. Returns the req id."""
        req_id = next(self._ids)
        self._send(Submit(req_id, room, num_pages, prefill_instance))
        return req_id

    def submit(self, room: int, num_pages: int, prefill_instance: str = "", timeout_s: float = 5.0) -> None:
        """Submit a room and wait for the agent to accept it."""
        req_id = self.submit_nowait(room, num_pages, prefill_instance)
        self._call_reply(req_id, Submitted, timeout_s)

    def stats(self, timeout_s: float = 5.0) -> dict[str, int]:
        req_id = next(self._ids)
        self._send(GetStats(req_id))
        return self._call_reply(req_id, Stats, timeout_s).counters

    def digest(self, room: int, timeout_s: float = 5.0) -> int:
        """xxh3-64 of the pages a finished room had on that rank."""
        req_id = next(self._ids)
        self._send(Digest(req_id, room))
        return self._call_reply(req_id, DigestReply, timeout_s).digest

    def _send(self, request: Submit | GetStats | Digest) -> None:
        if not send_now(self.socket, encode(request)):
            raise ControlError(f"{self.endpoint} takes no request (no connection: a CURVE key it refused?)")

    def results(self, timeout_s: float = 0.0) -> list[RoomResult]:
        """Room results received so far (waiting up to `timeout_s` for the first one)."""
        self._read(timeout_s)
        results, self._results = self._results, []
        return results

    def wait_result(self, room: int, timeout_s: float) -> RoomResult:
        """Block until the result of `room` arrives."""
        deadline = time.monotonic() + timeout_s
        while True:
            for index, result in enumerate(self._results):
                if result.room == room:
                    return self._results.pop(index)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlError(f"no result for room {room} from {self.endpoint} within {timeout_s:.1f}s")
            self._read(left)

    def _read(self, timeout_s: float) -> list[Submitted | Stats | DigestReply | Refusal]:
        """Read what is waiting (after up to `timeout_s` for the first frame); keeps results aside."""
        replies: list[Submitted | Stats | DigestReply | Refusal] = []
        if not self.socket.poll(int(timeout_s * 1000)):
            return replies
        while True:
            try:
                frame = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return replies
            try:
                reply = self._decoder.decode(frame)
            except FrameRejected:
                self.rejected += 1
                continue
            if isinstance(reply, RoomResult):
                self._results.append(reply)
            elif isinstance(reply, Refusal) and reply.req_id not in self._waiting:
                self.refusals.append(reply)
            else:
                replies.append(reply)

    def _call_reply(self, req_id: int, expected: type[_R], timeout_s: float) -> _R:
        deadline = time.monotonic() + timeout_s
        self._waiting.add(req_id)
        try:
            while (left := deadline - time.monotonic()) > 0:
                for reply in self._read(left):
                    if isinstance(reply, Refusal) and reply.req_id == req_id:
                        raise ControlError(f"{self.endpoint} refused: {reply.message}")
                    if isinstance(reply, expected) and reply.req_id == req_id:
                        return reply
        finally:
            self._waiting.discard(req_id)
        raise ControlError(f"{self.endpoint} did not answer within {timeout_s:.1f}s")
