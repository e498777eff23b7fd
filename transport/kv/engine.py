"""`KVManager`: one rank's transfer engine, and the `KVSender`/`KVReceiver` handles.

The engine runs on one thread that owns every socket. Schedulers (any other
thread) create handles and call them; calls become commands that the engine
thread runs, woken through a pipe. Handles read room state without locks: the
engine writes it, and a state read is one attribute load.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import psutil
import zmq

from transport.bootstrap import REFRESH_S, BootstrapClient
from transport.config import Role, TransferConfig
from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, denied, stop_authenticator
from transport.errors import BootstrapError, ConfigError, KVTransferError, ReasonClass, TransportError
from transport.kv.consensus import InstanceConsensus
from transport.kv.decode import DecodeSide
from transport.kv.faults import FaultInjector, FaultKind
from transport.kv.memory import keep_receive_buffers
from transport.kv.pool import KVPool
from transport.kv.prefill import PrefillSide
from transport.kv.reasons import Reason, consensus_timeout, from_another_rank
from transport.kv.rooms import ReceiverRoom, RoomRecord, SenderRoom
from transport.kv.routes import RouteBook
from transport.kv.side import SideContext, finished_long_ago
from transport.kvpoll import KVPoll
from transport.plane.events import AgentHello, Event, Heartbeat
from transport.plane.publisher import EventPublisher, NullPublisher, Publisher
from transport.reach import why_silent
from transport.sockets import data_frame_bound
from transport.thread_names import name_os_thread
from transport.version import __version__
from transport.wire import AgentInfo, VoteEntry, cut_text

_S = TypeVar("_S")
_log = logging.getLogger(__name__)
_TICK_S = 0.05
"""Timeouts, heartbeats, liveness and the instance vote run this often."""
HEARTBEAT_S = 1.0
DEREGISTER_TIMEOUT_S = 1.0
"""How long a rank that stops waits for the bootstrap service to confirm it left the listing."""
SILENT_VOTER_S = 0.5
"""A rank of the instance that has not voted for this long (10 ticks) holds up every room of the instance."""

COUNTER_NAMES = (
    "chunks_sent", "bytes_sent", "chunks_landed", "bytes_landed", "late_chunks", "rooms_succeeded",
    "rooms_failed", "send_failures", "peers_lost", "aborts_sent", "aborts_received", "abort_acks",
    "checksum_failures", "chunks_unverified", "requests_expired", "late_failures", "stalls",
    *(f"fault_{kind}" for kind in FaultKind),
    *rejection_names(),
)  # fmt: skip


class _Handle:
    """What a sender and a receiver share: the room, its state and its failure."""

    def __init__(self, manager: KVManager, record: RoomRecord) -> None:
        self._manager = manager
        self._record = record

    @property
    def room(self) -> int:
        return self._record.room

    def poll(self) -> KVPoll:
        """The room's state now (never blocks)."""
        return self._record.state

    @property
    def bytes_done(self) -> int:
        """Bytes landed (decode) or acknowledged (prefill) so far."""
        return self._record.bytes_done

    def failure_exception(self) -> None:
        """Raise the room's `KVTransferError` if it failed; return otherwise."""
        failure = self._record.failure
        if self._record.state is KVPoll.Failed and failure is not None:
            raise failure

    @property
    def failure(self) -> KVTransferError | None:
        return self._record.failure if self._record.state is KVPoll.Failed else None

    def agreed(self) -> KVPoll:
        """The instance's state of the room: the MIN over its ranks (SGLang's all-reduce); act on this."""
        return self._record.agreed

    @property
    def agreed_failure(self) -> KVTransferError | None:
        """Why the instance failed the room: this rank's own failure, or the echo of another rank's."""
        record = self._record
        if record.agreed is not KVPoll.Failed:
            return None
        return record.failure if record.state is KVPoll.Failed else record.agreed_failure

    @property
    def failed_in(self) -> KVPoll | None:
        """The state the room was in when it failed on this rank (None if it did not fail here)."""
        return self._record.failed_in

    @property
    def reason_class(self) -> str:
        return str(self._record.reason_class) if self._record.reason_class else ""

    @property
    def agreed_reason_class(self) -> str:
        """The class of `agreed_failure` ('' when the instance did not fail the room)."""
        record = self._record
        if record.agreed is not KVPoll.Failed:
            return ""
        reason_class = record.reason_class if record.state is KVPoll.Failed else record.agreed_reason_class
        return str(reason_class or ReasonClass.OTHER)

    def release(self) -> None:
        """Forget the room on this rank; late echoes for it are ignored from now on."""
        record = self._record
        self._manager._call_soon(lambda: self._manager._release(record))


class KVSender(_Handle):
    """A prefill rank's handle on one room: hand over the pages, then poll."""

    def __init__(self, manager: KVManager, record: SenderRoom, side: PrefillSide) -> None:
        super().__init__(manager, record)
        self._side = side

    def send(self, pages: npt.ArrayLike) -> None:
        """The room's KV is ready in `pages` of this rank's pool: send it once decode asked (ConfigError for a
        page outside the pool)."""
        indices = self._manager.pool.check_pages(np.asarray(pages, dtype=np.uint32))
        record = self._record
        assert isinstance(record, SenderRoom)
        self._manager._call_soon(lambda: self._side.send(record, indices, time.monotonic()))


class KVReceiver(_Handle):
    """A decode rank's handle on one room: give the destination pages, then poll."""

    def __init__(self, manager: KVManager, record: ReceiverRoom, side: DecodeSide) -> None:
        super().__init__(manager, record)
        self._receiver_record = record
        self._side = side

    def init(self, pages: npt.ArrayLike) -> None:
        """Ask the room's prefill ranks to send its KV into `pages` of this rank's pool (ConfigError for a page
        outside the pool)."""
        indices = self._manager.pool.check_pages(np.asarray(pages, dtype=np.uint32))
        record = self._receiver_record
        self._manager._call_soon(lambda: self._side.init(record, indices, time.monotonic()))

    def abort(self) -> None:
        """Give up on the room; its prefill ranks are told (and acknowledge)."""
        record = self._receiver_record
        self._manager._call_soon(lambda: self._side.abort(record, time.monotonic()))

    @property
    def abort_acknowledged(self) -> bool:
        """True once every prefill rank of the room acknowledged our ABORT.

        Stays False when the room was aborted before its prefill ranks were known (nobody to tell).
        """
        record = self._receiver_record
        return bool(record.pairings) and len(record.abort_acks) >= len(record.pairings)


class KVManager:
    """A rank's KV pool, data sockets, instance consensus, event publisher and engine thread."""

    def __init__(
        self,
        *,
        role: Role,
        instance: str,
        rank: int,
        tp: int,
        pool: KVPool,
        bootstrap: str,
        config: TransferConfig | None = None,
        faults: FaultInjector | None = None,
        host: str = "127.0.0.1",
        control_endpoint: str = "",
        publish_events: bool = True,
        curve: CurveKeys | None = None,
    ) -> None:
        """`curve`: every socket of this rank with CURVE (it binds as the server, connects as a client)."""
        if not 0 <= rank < tp:
            raise ConfigError(f"rank {rank} is outside TP size {tp}")
        self.role = role
        self.config = config or TransferConfig()
        if role is Role.DECODE and self.config.keep_receive_buffers:
            keep_receive_buffers(data_frame_bound(self.config.chunk_bytes, pool.page_bytes), self.config.window_bytes)
        self.bootstrap = bootstrap
        self.curve = curve
        self._zmq = zmq.Context()
        self._counters = Counters(COUNTER_NAMES)
        self._commands: deque[Callable[[], None]] = deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-engine-{instance}-{rank}", daemon=True)
        self.pool = pool
        self._consensus = (
            InstanceConsensus(
                self._zmq, host, self._counters.for_socket("consensus"), self.config.peer_timeout_s, curve
            )
            if tp > 1
            else None
        )
        info = AgentInfo(
            role=role,
            instance=instance,
            rank=rank,
            tp=tp,
            page_bytes=pool.page_bytes,
            data_endpoint="",  # a prefill rank's data socket binds below, once its side exists
            control_endpoint=control_endpoint,
            pid=os.getpid(),
            host=socket.gethostname(),
            incarnation=int.from_bytes(os.urandom(6), "little"),
            consensus_endpoint=self._consensus.endpoint if self._consensus else "",
        )
        self.publisher: Publisher = (
            EventPublisher(info, host, context=self._zmq, curve=curve) if publish_events else NullPublisher(info)
        )
        data_counters = self._counters.for_socket("data")
        faults = faults or FaultInjector()
        self._ctx = SideContext(
            info, pool, self.config, faults, data_counters, self._zmq, curve, emit=self.publisher.emit
        )
        self._routes = RouteBook(self._zmq, bootstrap, self._counters.for_socket("bootstrap"), curve)
        self._watched: dict[str, Counters] = {}
        self._prefill: PrefillSide | None = None
        self._decode: DecodeSide | None = None
        self._side: PrefillSide | DecodeSide
        if role is Role.PREFILL:
            self._side = self._prefill = PrefillSide(self._ctx, host)
        else:
            self._side = self._decode = DecodeSide(self._ctx, self._routes)
        self._ctx.info = self.publisher.info = msgspec.structs.replace(
            self.publisher.info, data_endpoint=self._prefill.endpoint if self._prefill else ""
        )
        self._process = psutil.Process()
        self._next_heartbeat = 0.0
        self._next_refresh = 0.0
        self._registered = False

    @property
    def info(self) -> AgentInfo:
        """This rank's identity and endpoints, as registered."""
        return self._ctx.info

    def start(self, register_timeout_s: float = 10.0, stop: threading.Event | None = None) -> KVManager:
        """Start publishing, register with the bootstrap service and start the engine thread; `stop` set
        gives up waiting for the registration (`CallAbandoned`)."""
        publisher = self.publisher.start()
        self.emit(AgentHello(time.time(), self.info, __version__, publisher.endpoint, publisher.snapshot_endpoint))
        counters = self._counters.for_socket("bootstrap")
        with BootstrapClient(self.bootstrap, register_timeout_s, self._zmq, counters, self.curve, stop=stop) as client:
            client.register(self.info)
        self._registered = True
        self._next_refresh = time.monotonic() + REFRESH_S
        self._thread.start()
        return self

    def emit(self, event: Event) -> None:
        """Publish an event from this rank (never blocks; a no-op for a rank that publishes nothing)."""
        self._ctx.emit(event)

    def close(self, deregister: bool = True) -> None:
        """Stop the engine thread, flush and stop the publisher, close every socket (idempotent); `deregister`:
        leave the bootstrap listing (a rank that failed stays listed, so views name it gone)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._side.close()
            self._routes.close()
            if self._consensus is not None:
                self._consensus.close()
        if self._registered and deregister:
            self._deregister()
        self.publisher.close()
        os.close(self._wake_read)
        os.close(self._wake_write)
        stop_authenticator(self._zmq)
        self._zmq.term()

    def __enter__(self) -> KVManager:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def counters(self) -> dict[str, int]:
        """A snapshot of this rank's counters (rejections under `rejected_<reason>`, summed over its sockets)."""
        return self._counters.snapshot()

    def dead_thread(self) -> str | None:
        """The name of this rank's engine or publisher thread if it died (it logged why), else None."""
        if self._stop.is_set():
            return None
        threads = [self._thread, self.publisher.thread]
        return next((t.name for t in threads if t.ident is not None and not t.is_alive()), None)

    def watch_rejections(self, socket: str, counters: Counters) -> None:
        """Report the rejections counted in `counters` under `socket` in every heartbeat."""
        self._watched[socket] = counters

    def rejections(self) -> dict[str, dict[str, int]]:
        """Rejected frames by socket (data, consensus, bootstrap, events, snapshot, watched ones), then reason;
        with CURVE, `curve` (`unauthorised`): this process's handshakes of keys not on the allow-list."""
        return {
            **self._counters.rejections(),
            **self.publisher.counters.rejections(),
            **{name: counters.rejected() for name, counters in self._watched.items()},
            **({"curve": {"unauthorised": denied()}} if self.curve is not None else {}),
        }

    def _deregister(self) -> None:
        """Leave the bootstrap listing at once (best effort: an unreachable service lets the entry expire).

        A service that takes no connection is not asked: the call would wait out its whole timeout for an answer
        that cannot come. Before, every rank of a `kvtop cluster up` killed with SIGKILL (its bootstrap service
        died with it) spent that second on its way out after noticing its parent gone."""
        if why := why_silent(self.bootstrap, DEREGISTER_TIMEOUT_S / 2):
            _log.info("%s leaves without deregistering: %s", self.info.label, why)
            return
        try:
            with BootstrapClient(
                self.bootstrap, timeout_s=DEREGISTER_TIMEOUT_S, context=self._zmq, curve=self.curve
            ) as client:
                client.deregister(self.info)
        except BootstrapError:
            pass

    def sender(self, room: int) -> KVSender:
        """Start tracking `room` on this prefill rank (Bootstrapping until decode asks)."""
        prefill = self._require(self._prefill, "sender")
        attached: Future[SenderRoom] = Future()
        self._call_soon(lambda: attached.set_result(prefill.attach_sender(SenderRoom(room, time.monotonic()))))
        try:
            return KVSender(self, attached.result(timeout=5.0), prefill)
        except TimeoutError:
            raise TransportError("the engine thread did not answer within 5 s") from None

    def refuse(self, room: int, prefill_instance: str = "") -> Future[KVTransferError | None]:
        """The scheduler refused `room` on this rank (no pages): fail it here now, this rank its origin, so that the
        ranks that took it hear at once (`PrefillSide.refuse`, `DecodeSide.refuse`; a decode rank names the room's
        `prefill_instance`). Left alone, a decode rank that refused had its instance wait for its vote on the room
        for the vote timeout, and the consensus timeout named it a rank that stopped answering. The future holds the
        room's failure once the engine thread failed it (None: the room was live here after all, or decided)."""
        prefill, decode = self._prefill, self._decode
        failed: Future[KVTransferError | None] = Future()
        if prefill is not None:
            self._call_soon(
                lambda: failed.set_result(prefill.refuse(room, time.monotonic(), *self._holding_up(time.monotonic())))
            )
        else:
            receiver = self._require(decode, "receiver")
            self._call_soon(
                lambda: failed.set_result(
                    receiver.refuse(room, prefill_instance, time.monotonic(), *self._holding_up(time.monotonic()))
                )
            )
        return failed

    def _holding_up(self, now: float) -> tuple[str, float]:
        """The rank (or ranks) of this instance whose silence holds every room up, and for how long (("", 0.0) when
        none is silent): a pool that fills meanwhile fills with rooms waiting on it."""
        return self._consensus.silent(now, SILENT_VOTER_S) if self._consensus is not None else ("", 0.0)

    def receiver(self, room: int, prefill_instance: str) -> KVReceiver:
        """Start receiving `room` from the ranks of `prefill_instance` on this decode rank."""
        decode = self._require(self._decode, "receiver")
        record = ReceiverRoom(room, time.monotonic(), prefill_instance=prefill_instance)
        self._call_soon(lambda: decode.add_receiver(record, time.monotonic()))
        return KVReceiver(self, record, decode)

    def _require(self, side: _S | None, what: str) -> _S:
        if side is None:
            raise ConfigError(f"a {self.role} rank has no {what}")
        return side

    def _release(self, record: RoomRecord) -> None:
        if self._consensus is not None:
            self._consensus.remember_release(record, time.monotonic())
        self._side.release(record.room)

    def _call_soon(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            os.write(self._wake_write, b"\0")

    def _sockets(self) -> set[zmq.Socket[bytes]]:
        fixed = [self._routes.socket] + ([self._consensus.socket, self._consensus.publisher] if self._consensus else [])
        return {*fixed, *self._side.sockets()}

    def _handle(self, sock: zmq.Socket[bytes], now: float) -> None:
        if sock is self._routes.socket:
            self._routes.handle()
        elif self._consensus is not None and sock is self._consensus.socket:
            self._consensus.handle()
        elif self._consensus is not None and sock is self._consensus.publisher:
            self._consensus.serve_subscribers()
        else:
            self._side.handle(sock, now)

    def _tick(self, now: float) -> None:
        """Timeouts and liveness, the rooms long finished, the instance vote, each room's agreed state, the
        heartbeat."""
        self._side.tick(now)
        self._sweep(now)
        info = self.info
        rooms = list(self._side.rooms.values())
        consensus = self._consensus
        if consensus is not None:
            consensus.join(info, self._routes, now)
            consensus.publish(info, rooms, now)
        for record in rooms:
            if consensus is None:
                record.agreed = record.state
                continue
            if record.agreed.is_terminal:  # agreed once, for good
                continue
            agreement = consensus.agree(record, info, now)
            if agreement.state is KVPoll.Failed and agreement.failure is not None and record.state is not KVPoll.Failed:
                self._fail_by_instance(record, agreement.failure, now)
            record.agreed = agreement.state
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_S
            self._heartbeat(sum(not record.state.is_terminal for record in rooms))
        if now >= self._next_refresh:
            self._next_refresh = now + REFRESH_S
            self._routes.register(info)

    def _sweep(self, now: float) -> None:
        """Forget the rooms finished `retain_finished_s` ago that nobody released, as a release would. One its
        instance has not agreed on is failed first (`timeout_consensus`, this rank the origin) and its peers are
        told, as of any failure this rank starts: its decode ranks by a Failed status, its prefill ranks by ABORT,
        its instance by the vote kept after the release. Before, nobody was told: the peers heard only at their own
        timeouts, and a rank of the instance that missed the room from the votes failed it as a second origin."""
        for record in finished_long_ago(self._side.rooms, now, self._ctx.config.retain_finished_s):
            if not record.agreed.is_terminal:
                waited = now - record.created_at
                reason = consensus_timeout(record.room, waited, "its instance to agree", self.info.instance)
                self._side.fail_agreed(record, reason, self.info.label)  # type: ignore[arg-type]
            self._release(record)

    def _fail_by_instance(self, record: RoomRecord, entry: VoteEntry, now: float) -> None:
        """Another rank failed the room: fail it here as its echo (or, when already done here, record the echo)."""
        origin = entry.origin
        own = origin == self.info.label
        reason = (
            Reason(entry.reason, entry.reason_class or ReasonClass.OTHER, entry.suspect)
            if own
            else from_another_rank(entry.suspect, entry.origin_class)
        )
        if not record.state.is_terminal:
            self._side.fail_by_instance(record, reason, origin, now)  # type: ignore[arg-type]
        elif record.agreed_failure is None:
            self._side.fail_agreed(record, reason, origin)  # type: ignore[arg-type]

    def _heartbeat(self, inflight: int) -> None:
        """`inflight`: the rooms this rank has not ended (those it ended stay held until released or swept: not
        in flight)."""
        publisher = self.publisher
        with self._process.oneshot():
            cpu, rss = self._process.cpu_percent(), self._process.memory_info().rss
        memory = psutil.virtual_memory().percent
        self.emit(
            Heartbeat(
                time.time(),
                self.counters(),
                inflight,
                publisher.dropped,
                cpu,
                rss,
                memory,
                publisher.snapshot_endpoint,
                self.rejections(),
                registration=cut_text(self._routes.refused),
            )
        )

    def _run(self) -> None:
        """The engine loop; an exception that escapes it is logged with its traceback (`dead_thread()` tells)."""
        name_os_thread()
        try:
            self._loop()
        except Exception:
            _log.exception("the engine thread of %s died: this rank transfers nothing more", self.info.label)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        registered: set[zmq.Socket[bytes]] = set()
        side = self._side
        next_tick = 0.0
        wake_at: float | None = None
        generation = -1
        woke = time.monotonic()
        try:
            while not self._stop.is_set():
                if side.socket_generation != generation:
                    generation = side.socket_generation
                    current = self._sockets()
                    for sock in current - registered:
                        poller.register(sock, zmq.POLLIN)
                    for sock in registered - current:
                        poller.unregister(sock)
                    registered = current
                now = time.monotonic()
                deadline = min(next_tick, wake_at) if wake_at is not None else next_tick
                timeout_ms = max(0, math.ceil((deadline - now) * 1000))  # rounded up: no spinning in the last ms
                ready = dict(poller.poll(timeout_ms))
                now = time.monotonic()
                stood_still = now - woke - timeout_ms / 1000  # what neither the poll's wait nor a pass explains
                if stood_still > self._ctx.config.peer_timeout_s:  # every peer would have judged this rank gone
                    self._ctx.stalled(now)
                woke = now
                if self._wake_read in ready:
                    self._drain_wake()
                if self._commands:
                    while self._commands:
                        self._commands.popleft()()
                    # The rooms they handed in are younger than the poll: a room finished at the poll's time (its
                    # chunks landed in this pass) published negative seconds, a batch every view rejects.
                    now = time.monotonic()
                for sock in registered:
                    if sock in ready:
                        self._handle(sock, now)
                wake_at = side.pump(now)
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + _TICK_S
        finally:
            side.close()
            self._routes.close()
            if self._consensus is not None:
                self._consensus.close()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
