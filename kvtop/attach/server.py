"""The model process's local endpoint: other commands ask it for the model's state (`kvtop status --model`).

`ModelEndpoint(served).start()` binds a ROUTER on `ipc://` in the runtime folder, advertises it there
(kvtop.attach.runtime) and answers on its own thread, so the dashboard's frames never wait for it: the
model's lock is held only to fork a child that encodes a keyframe of the model frozen at that instant
(kvtop.record.forked, as the recorder's keyframes; captured under the lock where there is no fork) and to
copy the journal's newest deliveries; compressing and sending happen off the lock.

An ask that cannot be read (wrong frames, another version, no `StateQuery`, too big) is answered
`Refused` and counted by reason; every answer carries the counts. No ask ends the thread; one that dies
anyway is logged with its traceback.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Protocol, cast

import msgspec
import zmq
import zstandard

from kvtop.attach import wire
from kvtop.attach.runtime import advert_for, advertised, publish
from kvtop.record.forked import FORK_KEYFRAMES, KeyframeFailed, collect, fork_capture
from kvtop.record.keyframes import capture
from kvtop.record.segment import KEYFRAME_ZSTD_LEVEL
from transport.service import ServiceThread

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from transport.plane.events import Event

log = logging.getLogger("kvtop.model_endpoint")

POLL_MS = 100
JOURNAL_ZSTD_LEVEL = 1


class Serving(Protocol):
    """What the endpoint reads of the model process's source (`ServedModel`)."""

    @property
    def model(self) -> ClusterModel: ...
    @property
    def lock(self) -> threading.Lock: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def error(self) -> Callable[[], str]: ...
    @property
    def heard(self) -> Callable[[], bool]: ...
    @property
    def synced(self) -> Callable[[], bool]: ...
    @property
    def source(self) -> str: ...
    @property
    def bootstrap(self) -> str: ...
    @property
    def connect(self) -> tuple[str, ...]: ...


class ModelEndpoint(ServiceThread):
    """Serves `served`'s model to other commands until `close()`; `fork`: encode keyframes in a forked child."""

    def __init__(self, served: Serving, fork: bool = FORK_KEYFRAMES) -> None:
        super().__init__("kvtop-model-endpoint")
        self.served = served
        self.fork = fork
        self.endpoint = ""
        self.answered = 0
        self.refused: dict[str, int] = {}
        self._started = time.time()
        self._stack = ExitStack()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket: zmq.Socket[bytes] | None = None
        self._compressor = zstandard.ZstdCompressor(level=JOURNAL_ZSTD_LEVEL)

    def start(self) -> ModelEndpoint:
        """Bind and advertise (raises `RuntimeDirError` or `zmq.ZMQError` when it cannot), then serve."""
        served = self.served
        try:
            self.endpoint, advert_path = self._stack.enter_context(
                advertised(served.source, served.bootstrap, served.connect)
            )
            socket = self._context.socket(zmq.ROUTER)
            self._stack.callback(socket.close, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, wire.MAX_SOCKET_BYTES)
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an asker gone meanwhile is an error, not a silent drop
            socket.setsockopt(zmq.SNDTIMEO, 5000)
            socket.bind(self.endpoint)
            self._socket = socket
            publish(advert_path, advert_for(self.endpoint, served.source, served.bootstrap, served.connect))
        except BaseException:
            self._stack.close()
            raise
        return super().start()

    def close(self) -> None:
        """Stop answering, then remove the advert and the socket's file."""
        super().close()
        self._stack.close()

    def _died(self, error: Exception) -> None:
        log.exception("the model's endpoint stopped: other commands can no longer read this model")

    def _serve(self) -> None:
        socket = self._socket
        assert socket is not None
        while not self._stop.is_set():
            if not socket.poll(POLL_MS):
                continue
            frames = socket.recv_multipart()
            identity, body = frames[0], frames[1:]
            try:
                reply = self._answer(body)
            except Exception as error:  # a bug answering one ask: said to the asker, logged, and the next goes on
                log.exception("the model's endpoint could not answer an ask")
                reply = self._refuse("internal", f"the model process could not answer: {error!r}")
            try:
                socket.send_multipart([identity, *reply])
            except zmq.ZMQError as error:  # the asker left (its wait ended): nothing to tell it
                log.debug("an answer could not be sent: %s", error)

    def _answer(self, body: list[bytes]) -> list[bytes]:
        if len(body) != 2:
            return self._refuse("frames", f"an ask is 2 frames, not {len(body)}")
        version, ask = body
        if version != wire.VERSION:
            return self._refuse("version", f"this model process speaks {wire.VERSION.decode()}, not {version[:40]!r}")
        if len(ask) > wire.MAX_ASK_BYTES:
            return self._refuse("oversize", f"an ask of {len(ask)} bytes (at most {wire.MAX_ASK_BYTES})")
        try:
            query = wire.ASK_DECODER.decode(ask)
        except msgspec.DecodeError as error:
            return self._refuse("malformed", f"the ask could not be read: {error}")
        return self._state(query)

    def _refuse(self, reason: str, message: str) -> list[bytes]:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if self.refused[reason] == 1:
            log.warning("refused an ask to the model's endpoint (%s): %s", reason, message)
        return [wire.VERSION, wire.ENCODER.encode(wire.Refused(message, dict(self.refused)))]

    def _state(self, query: wire.StateQuery) -> list[bytes]:
        served, model = self.served, self.served.model
        pipe = os.pipe() if self.fork else None  # made before the lock: nothing under it lets go of the GIL
        raw = b""
        with served.lock:
            took = time.perf_counter()
            now = served.clock()
            child = fork_capture(model, now, pipe) if pipe is not None else None
            if child is None:
                raw = capture(model)
            journal, total = _journal_after(model, query.journal_after)
            journaling = model.journaling
            held = time.perf_counter() - took
        if child is not None:
            try:
                captured = collect(child)
            except KeyframeFailed as error:
                return self._refuse("keyframe", f"the model's keyframe could not be taken: {error}")
            payload, raw_len = captured.payload, captured.raw_len
        else:
            payload, raw_len = zstandard.ZstdCompressor(level=KEYFRAME_ZSTD_LEVEL).compress(raw), len(raw)
        asked = query.journal_after >= 0
        journal_raw = (
            wire.ENCODER.encode(wire.Journal(cast("list[tuple[str, list[Event]]]", journal), total)) if asked else b""
        )
        self.answered += 1
        state = wire.State(
            os.getpid(), served.source, now, max(0.0, now - self._started), served.heard(), served.synced(),
            served.error()[:4096], raw_len, journaling, total, len(journal_raw), self.answered, dict(self.refused),
            held,
        )  # fmt: skip
        packed = self._compressor.compress(journal_raw) if journal_raw else b""
        return [wire.VERSION, wire.ENCODER.encode(state), payload, packed]


def _journal_after(model: ClusterModel, after: int) -> tuple[list[tuple[str, Sequence[Event]]], int]:
    """The deliveries journaled past number `after` (at most `MAX_JOURNAL_EVENTS` events, the newest), and
    the number of the last; copied under the lock (the deliveries themselves never change)."""
    total = model.journal_total
    if after < 0 or not model.journaling:
        return [], total
    fresh = min(len(model.journal), max(0, total - after))
    taken: list[tuple[str, Sequence[Event]]] = []
    events = 0
    for label, batch in itertools.islice(reversed(model.journal), fresh):
        events += len(batch)
        if events > wire.MAX_JOURNAL_EVENTS and taken:
            break
        taken.append((label, batch))
    taken.reverse()
    return taken, total
