"""The agent side of the event plane: a PUB socket fed through a bounded queue, and snapshots.

`emit()` is called on the transfer path and never blocks: events go to a
bounded deque; when it is full the oldest event is dropped and counted (the
count travels in every heartbeat). One thread owns both sockets: every
`batch_interval_s` (or `batch_max` events) it publishes one `EventBatch` with
the next seq, and applies the batch to a small mirror of the agent's state, so
a `Snapshot` always matches the seq it names. Fewer than `batch_min` events
wait one more interval (Kafka's linger): every message costs its publisher, the
I/O threads and the collector about the same whatever it holds, and at 1024
agents of 200 events/s, 10-event batches would be 20k messages a second. A
`PublisherGroup` runs many publishers of one process on one such thread, where
a thread each would wake 20 times a second per publisher. A rank that publishes
nothing holds a `NullPublisher`: the same calls, no sockets, no thread. A live
room whose terminal state the queue dropped would stay
live in every snapshot: after `lost_after_s` without news the mirror drops it,
counted in `counters["rooms_lost"]`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Protocol

import msgspec
import zmq

from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, serving
from transport.kvpoll import LOST_AFTER_S, LOST_SWEEP_EVERY_S, TERMINAL
from transport.plane.events import (
    EVENT_SCHEMA,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    LogContext,
    Progress,
    RoomState,
    Snapshot,
    SnapshotRequest,
    TransferDone,
)
from transport.plane.frame_budget import FRAME_BUDGET, fit_snapshot
from transport.service import ServiceThread
from transport.sockets import SMALL_FRAME, bind, decode_routed, open_publisher, open_socket, serve_subscriptions
from transport.wire import AgentInfo, FrameDecoder, encode

_log = logging.getLogger(__name__)
FINISHED_KEPT = 512
"""Finished rooms and failures a snapshot carries (the recent past, bounded)."""


class StateMirror:
    """What a snapshot holds, kept up to date from the events as they are published."""

    def __init__(self, lost_after_s: float = LOST_AFTER_S) -> None:
        self.lost_after_s = lost_after_s
        self.lost = 0
        """Live rooms dropped as lost (no news for `lost_after_s`)."""
        self.hello: AgentHello | None = None
        self.heartbeat: Heartbeat | None = None
        self.live: dict[int, RoomState] = {}
        self.progress: dict[int, Progress] = {}
        self.finished: deque[RoomState] = deque(maxlen=FINISHED_KEPT)
        self.failures: deque[Failure] = deque(maxlen=FINISHED_KEPT)
        self.transfers: deque[TransferDone] = deque(maxlen=FINISHED_KEPT)
        self.context: deque[LogContext] = deque(maxlen=FINISHED_KEPT)

    def apply_batch(self, events: list[Event]) -> None:
        """Apply a batch's events in order, as `apply` one at a time. The kinds a transfer emits by the
        thousand are told apart by their exact type, on locals (the publisher's thread pays this per event)."""
        live, progress, finished, transfers = self.live, self.progress, self.finished, self.transfers
        for event in events:
            if type(event) is RoomState:
                if event.state in TERMINAL:  # plain ints: a KVPoll member per event cost ~0.3 us
                    live.pop(event.room, None)
                    progress.pop(event.room, None)
                    finished.append(event)
                else:
                    live[event.room] = event
            elif type(event) is Progress:
                if event.room in live:
                    progress[event.room] = event
            elif type(event) is TransferDone:
                transfers.append(event)
            else:
                self.apply(event)

    def apply(self, event: Event) -> None:
        if isinstance(event, RoomState):
            if event.state in TERMINAL:
                self.live.pop(event.room, None)
                self.progress.pop(event.room, None)
                self.finished.append(event)
            else:
                self.live[event.room] = event
        elif isinstance(event, Failure):
            self.failures.append(event)
        elif isinstance(event, Progress) and event.room in self.live:
            self.progress[event.room] = event
        elif isinstance(event, TransferDone):
            self.transfers.append(event)
        elif isinstance(event, Heartbeat):
            self.heartbeat = event
        elif isinstance(event, AgentHello):
            self.hello = event
        elif isinstance(event, LogContext):
            self.context.append(event)

    def retire_lost(self, now: float) -> int:
        """Drop the live rooms with no state or progress since `lost_after_s` before `now`; how many."""
        cutoff = now - self.lost_after_s
        progress = self.progress
        lost = [
            room
            for room, state in self.live.items()
            if state.ts < cutoff and (room not in progress or progress[room].ts < cutoff)
        ]
        for room in lost:
            del self.live[room]
            progress.pop(room, None)
        self.lost += len(lost)
        return len(lost)

    @property
    def history_since(self) -> float:
        """The three histories are complete from this time on: a full one starts at its oldest entry
        (0: none is full, nothing was dropped). Computed per snapshot, not per event."""
        histories: tuple[deque[RoomState] | deque[Failure] | deque[TransferDone], ...] = (
            self.finished,
            self.failures,
            self.transfers,
        )
        return max((history[0].ts for history in histories if len(history) == history.maxlen), default=0.0)


class Publisher(Protocol):
    """What a rank asks of its event publisher: an `EventPublisher`, or a `NullPublisher`."""

    info: AgentInfo
    endpoint: str
    snapshot_endpoint: str
    dropped: int
    counters: Counters

    @property
    def thread(self) -> threading.Thread: ...

    def start(self) -> Publisher: ...

    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


class NullPublisher:
    """A publisher for a rank nobody watches: no endpoints, no thread, every event discarded."""

    def __init__(self, info: AgentInfo) -> None:
        self.info = info
        self.endpoint = ""
        self.snapshot_endpoint = ""
        self.dropped = 0
        self.counters = Counters(())
        self.thread = threading.Thread(name=f"events-{info.label}-off")
        """Never started, so never dead."""

    def start(self) -> NullPublisher:
        return self

    def emit(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


class EventPublisher:
    """Publishes an agent's events; `emit()` from any thread, `close()` to stop."""

    def __init__(
        self,
        info: AgentInfo,
        host: str = "127.0.0.1",
        queue_size: int = 65_536,
        batch_interval_s: float = 0.05,
        batch_max: int = 1024,
        batch_min: int = 16,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        sndhwm: int = 10_000,
        lost_after_s: float = LOST_AFTER_S,
        curve: CurveKeys | None = None,
    ) -> None:
        """`batch_min`: fewer queued events wait one more `batch_interval_s` (so an event leaves within two);
        `lost_after_s`: seconds without news after which a live room leaves the snapshots as lost;
        `curve`: serve both sockets with CURVE (only allowed clients get events or snapshots). `info` is
        kept with this publisher's two endpoints filled in."""
        self._context = context or zmq.Context.instance()
        self._pub = open_publisher(self._context, serving(curve))
        self._pub.sndhwm = sndhwm
        self.endpoint = bind(self._pub, "", host)
        self._snapshots = open_socket(self._context, zmq.ROUTER, SMALL_FRAME, serving(curve))
        self.snapshot_endpoint = bind(self._snapshots, "", host)
        self.info = msgspec.structs.replace(
            info, event_endpoint=self.endpoint, snapshot_endpoint=self.snapshot_endpoint
        )
        self._queue: deque[Event] = deque(maxlen=queue_size)
        self._interval = batch_interval_s
        self._batch_max = batch_max
        self._batch_min = min(batch_min, batch_max)
        self._lingered = False
        """A small batch waited one interval already: the next interval publishes it, however small."""
        self.seq = 0
        """The seq of the last batch published."""
        self.dropped = 0
        self.counters = Counters(
            ("batches", "events", "snapshots", "snapshot_entries_cut", "rooms_lost", *rejection_names())
        )
        """Rejections are kept per socket: `events` (what subscribers send the PUB), `snapshot` (requests)."""
        self._event_counts = self.counters.for_socket("events")
        self._snapshot_counts = self.counters.for_socket("snapshot")
        self._mirror = StateMirror(lost_after_s)
        self._decoder: FrameDecoder[SnapshotRequest] = FrameDecoder(SnapshotRequest)
        self._group: PublisherGroup | None = None

    def start(self) -> EventPublisher:
        """Publish on a thread of its own."""
        PublisherGroup([self], f"events-{self.info.label}").start()
        return self

    @property
    def thread(self) -> threading.Thread:
        """The thread that publishes (its owner checks that it is alive)."""
        if self._group is None:
            raise RuntimeError(f"the publisher of {self.info.label} was never started")
        return self._group.thread

    def emit(self, event: Event) -> None:
        """Queue an event; never blocks (drops the oldest queued event when full, and counts it)."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(event)

    def close(self) -> None:
        """Publish what is queued, then stop (within one batch interval); a group's publishers stop together."""
        if self._group is not None:
            self._group.close()
        self._pub.close(linger=0)
        self._snapshots.close(linger=0)

    def _tick(self) -> None:
        """A batch interval passed: publish what is queued, unless it is fewer than `batch_min` events that have
        not waited an interval yet (they wait for the next one)."""
        queued = len(self._queue)
        if queued >= self._batch_min or (queued and self._lingered):
            self._flush()
        else:
            self._lingered = queued > 0

    def _flush(self) -> None:
        """Publish every queued event, `batch_max` a batch."""
        self._lingered = False
        while self._queue:
            self._publish()

    def _publish(self) -> None:
        queue = self._queue
        popleft = queue.popleft
        self._send([popleft() for _ in range(min(len(queue), self._batch_max))])  # `emit` only adds: they are there

    def _send(self, events: list[Event]) -> None:
        """Publish `events` as the next batch, or as two halves when its frame would pass `FRAME_BUDGET` (every
        event is bounded where it is made: a single one always fits, a batch of big ones may not)."""
        info = self.info
        batch = EventBatch(EVENT_SCHEMA, info.role, info.instance, info.rank, info.incarnation, self.seq + 1,
                           time.time(), events, info.pp or None, info.dp)  # fmt: skip
        frame = encode(batch)
        if len(frame) > FRAME_BUDGET and len(events) > 1:
            half = len(events) // 2
            self._send(events[:half])
            self._send(events[half:])
            return
        self._mirror.apply_batch(events)
        self.seq += 1
        self._pub.send(frame)
        self.counters.add("batches")
        self.counters.add("events", len(events))

    def _serve_snapshot(self) -> None:
        routed = decode_routed(self._snapshots.recv_multipart(), self._decoder, self._snapshot_counts)
        if routed is None:
            return
        requester, request = routed
        mirror = self._mirror
        snapshot = Snapshot(
            request.req_id,
            EVENT_SCHEMA,
            self.info.incarnation,
            self.seq,
            mirror.hello,
            mirror.heartbeat,
            list(mirror.live.values()),
            list(mirror.finished),
            list(mirror.failures),
            list(mirror.progress.values()),
            list(mirror.transfers),
            mirror.history_since,
            list(mirror.context),
            time.time(),
        )
        frame, cut = fit_snapshot(snapshot)
        self._snapshots.send_multipart([requester, frame])
        self.counters.add("snapshots")
        self.counters.add("snapshot_entries_cut", cut)


class PublisherGroup(ServiceThread):
    """One thread that publishes for one or more publishers of a process: it polls all their sockets, and
    every batch interval (the shortest of theirs) publishes what each has queued (a small batch waits one
    more), or sooner where a queue holds `batch_max` when a socket wakes it. `EventPublisher.start` makes a
    group of one. `close()` publishes what is queued, then stops (within one batch interval)."""

    def __init__(self, publishers: list[EventPublisher], name: str = "events") -> None:
        if not publishers:
            raise ValueError("a publisher group needs at least one publisher")
        if any(publisher._group is not None for publisher in publishers):
            raise ValueError("a publisher is in one group only")
        super().__init__(name)
        self.publishers = publishers
        for publisher in publishers:
            publisher._group = self

    def _died(self, error: Exception) -> None:
        labels = ", ".join(publisher.info.label for publisher in self.publishers[:4])
        more = f" and {len(self.publishers) - 4} more" if len(self.publishers) > 4 else ""
        _log.exception("the event publisher of %s%s died: its events stop here", labels, more)

    def _serve(self) -> None:
        """The publishing loop."""
        publishers = self.publishers
        poller = zmq.Poller()
        owners: dict[zmq.Socket[bytes], EventPublisher] = {}
        for publisher in publishers:
            for sock in (publisher._pub, publisher._snapshots):
                poller.register(sock, zmq.POLLIN)
                owners[sock] = publisher
        interval = min(publisher._interval for publisher in publishers)
        every = min(LOST_SWEEP_EVERY_S, *(publisher._mirror.lost_after_s / 2 for publisher in publishers))
        now = time.monotonic()
        deadline, next_lost_sweep = now + interval, now + every
        while True:
            stopping = self._stop.is_set()
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not stopping and (ready := poller.poll(wait_ms)):  # nearly always [] (the interval passed)
                woken = []
                for sock, _ in ready:
                    publisher = owners[sock]
                    if sock is publisher._pub:
                        serve_subscriptions(sock, publisher._event_counts)
                    else:
                        publisher._serve_snapshot()
                    woken.append(publisher)
                if time.monotonic() < deadline:
                    for publisher in woken:
                        if len(publisher._queue) >= publisher._batch_max:
                            publisher._flush()
                    continue
            for publisher in publishers:
                if stopping:
                    publisher._flush()
                else:
                    publisher._tick()
            now = time.monotonic()
            if now >= next_lost_sweep:
                next_lost_sweep = now + every
                wall = time.time()
                for publisher in publishers:
                    publisher.counters.add("rooms_lost", publisher._mirror.retire_lost(wall))
            deadline = now + interval
            if stopping:
                return
