"""A headless view's side of a dashboard's model: find the model process (`choose`), ask it for the
model's state (`fetch`) and rebuild the model from it, so the view prints what it would on that model.

Errors, each one line for the user::

    ModelUnavailable    no dashboard's model runs (that one), it did not answer in time, or its answer
                        could not be read (views exit 1; `kvtop check` says CRITICAL, as for a cluster
                        that does not answer)
    ModelAmbiguous      several run and none was named (a usage error: name one with --model-at)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import zmq
import zstandard

from kvtop.attach import wire
from kvtop.attach.errors import ModelAmbiguous, ModelUnavailable
from kvtop.attach.runtime import RuntimeDirError, running, runtime_dir

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from transport.plane.events import Event

RETRY_S = 0.05
"""An answer from a model whose agents' snapshots are not all in yet is asked again this often."""


@dataclass
class Attached:
    """A dashboard's model as it was when asked, rebuilt here, with what its model process said beside it."""

    endpoint: str
    state: wire.State
    model: ClusterModel
    journal: list[tuple[str, list[Event]]] = field(default_factory=list)
    """The journal's deliveries asked for (after the last ask's `state.journal_total`), oldest first."""
    with_journal: bool = False
    """Whether the journal was asked for (asking again brings what it gained since)."""


def choose(which: str, bootstrap: str = "", connect: tuple[str, ...] = ()) -> str:
    """The endpoint of the model to read: `which` is an `ipc://` or `tcp://` endpoint, a model process's
    pid, or "" for the one that runs (the one whose source is `bootstrap`/`connect`, when given)."""
    if "://" in which:
        return which
    try:
        adverts, unreadable = running(runtime_dir(create=False))
    except RuntimeDirError as error:
        raise ModelUnavailable(str(error)) from None
    if which:
        found = [advert for advert in adverts if str(advert.pid) == which]
        if not found:
            pids = ", ".join(str(advert.pid) for advert in adverts) or "none"
            raise ModelUnavailable(f"no dashboard's model runs as pid {which} (running: {pids})")
        return found[0].endpoint
    found = [
        advert
        for advert in adverts
        if (not bootstrap or advert.bootstrap == bootstrap) and (not connect or set(advert.connect) == set(connect))
    ]
    if not found:
        of = " of " + " ".join([bootstrap, *connect]).strip() if bootstrap or connect else ""
        others = f" ({len(adverts)} of other sources run)" if adverts else ""
        damaged = f"; unreadable: {'; '.join(unreadable)}" if unreadable else ""
        raise ModelUnavailable(f"no dashboard's model{of} is running{others}{damaged}")
    if len(found) > 1:
        listed = ", ".join(f"{advert.pid} ({advert.source})" for advert in found)
        raise ModelAmbiguous(f"{len(found)} dashboards' models run: name one with --model-at PID ({listed})")
    return found[0].endpoint


def fetch(endpoint: str, timeout_s: float, journal_after: int = -1) -> Attached:
    """The model `endpoint` serves, once its agents' snapshots are in or `timeout_s` passed (as a view's own
    collector waits); `journal_after` >= 0 also brings the journal's deliveries past that number."""
    deadline = time.monotonic() + timeout_s
    query = wire.ENCODER.encode(wire.StateQuery(journal_after))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    try:
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, 2 * wire.MAX_FRAME_BYTES + wire.MAX_STATE_BYTES)
        socket.connect(endpoint)
        while True:
            state, keyframe, journal = _ask(socket, query, endpoint, deadline, timeout_s)
            if state.synced or time.monotonic() + RETRY_S >= deadline:
                break
            time.sleep(RETRY_S)
    finally:
        socket.close(0)
    journaled = _journal(journal, state, endpoint)
    return Attached(endpoint, state, _model(keyframe, state, endpoint), journaled, journal_after >= 0)


def _ask(
    socket: zmq.Socket[bytes], query: bytes, endpoint: str, deadline: float, timeout_s: float
) -> tuple[wire.State, bytes, bytes]:
    """One ask and its answer's frames, checked."""
    late = ModelUnavailable(f"the dashboard's model at {endpoint} did not answer within {timeout_s:g}s")
    try:
        socket.send_multipart([wire.VERSION, query], flags=zmq.NOBLOCK)
    except zmq.Again:
        raise late from None
    if not socket.poll(max(0, round((deadline - time.monotonic()) * 1000))):
        raise late
    frames = socket.recv_multipart()
    if not frames or frames[0] != wire.VERSION:
        raise ModelUnavailable(f"the dashboard's model at {endpoint} speaks another version ({frames[0][:40]!r})")
    if len(frames[1]) > wire.MAX_STATE_BYTES:
        raise ModelUnavailable(f"the dashboard's model at {endpoint} sent {len(frames[1])} bytes of state")
    try:
        answer = wire.ANSWER_DECODER.decode(frames[1])
    except msgspec.DecodeError as error:
        raise ModelUnavailable(f"the dashboard's model at {endpoint} sent an unreadable answer: {error}") from None
    if isinstance(answer, wire.Refused):
        raise ModelUnavailable(f"the dashboard's model at {endpoint} refused: {answer.reason}")
    if len(frames) != 4 or max(len(frames[2]), len(frames[3])) > wire.MAX_FRAME_BYTES:
        raise ModelUnavailable(f"the dashboard's model at {endpoint} sent {len(frames)} frames, not a state")
    return answer, frames[2], frames[3]


def _unpacked(data: bytes, raw_len: int, what: str, endpoint: str) -> bytes:
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len)
    except zstandard.ZstdError as error:
        raise ModelUnavailable(f"the {what} from {endpoint} cannot be decompressed: {error}") from None
    if len(raw) != raw_len:
        raise ModelUnavailable(f"the {what} from {endpoint} is {len(raw)} bytes, not {raw_len}")
    return raw


def _model(keyframe: bytes, state: wire.State, endpoint: str) -> ClusterModel:
    from kvtop.record.keyframes import restore

    raw = _unpacked(keyframe, state.raw_len, "model's keyframe", endpoint)
    try:
        return restore(raw)
    except (msgspec.DecodeError, ValueError) as error:
        raise ModelUnavailable(f"the model's keyframe from {endpoint} cannot be read: {error}") from None


def _journal(packed: bytes, state: wire.State, endpoint: str) -> list[tuple[str, list[Event]]]:
    if not state.journal_raw_len:
        return []
    raw = _unpacked(packed, state.journal_raw_len, "model's journal", endpoint)
    try:
        journal = wire.JOURNAL_DECODER.decode(raw)
    except msgspec.DecodeError as error:
        raise ModelUnavailable(f"the model's journal from {endpoint} cannot be read: {error}") from None
    return journal.deliveries
