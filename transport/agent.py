"""One rank as a process: its KV pool and engine, plus a control socket a router drives.

The agent plays the serving engine's scheduler: on `Submit` a prefill rank
"computes" the room's KV (writes a room-specific pattern into fresh pages) and
sends it; a decode rank allocates pages and receives. When a room ends, the
agent answers the submitter with a `RoomResult` and frees the pages. Run it
with `python -m transport.agent --help` (or `kvtop agent`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import zmq

from transport.config import Role, Timeouts, TransferConfig
from transport.counters import Counters, rejection_names
from transport.engine import KVManager, KVReceiver, KVSender
from transport.errors import KVTransferError, ReasonClass
from transport.faults import FaultInjector, FaultSpec
from transport.kvpoll import KVPoll
from transport.logs import setup_agent_logging
from transport.pool import KVPool, PageIndices, PoolExhausted
from transport.sockets import SMALL_FRAME, bind, decode_routed, open_socket
from transport.wire import (
    ControlRequest,
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

_POLL_MS = 5
_DIGESTS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything that defines one rank process."""

    role: Role
    instance: str
    rank: int
    tp: int
    bootstrap: str
    num_pages: int = 4096
    page_bytes: int = 16 << 10
    host: str = "127.0.0.1"
    control_endpoint: str = ""
    transfer: TransferConfig = field(default_factory=TransferConfig)
    faults: tuple[FaultSpec, ...] = ()
    fault_seed: int | None = None
    log_file: str = ""
    log_level: str = "INFO"


@dataclass(eq=False)
class _LiveRoom:
    handle: KVSender | KVReceiver
    pages: PageIndices
    requester: bytes
    req_id: int
    started: float


class Agent:
    """The scheduler loop of one rank: serves control requests, reports finished rooms."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.log = setup_agent_logging(options.rank, options.log_level, options.log_file)
        self._zmq = zmq.Context()
        self._control = open_socket(self._zmq, zmq.ROUTER, SMALL_FRAME)
        self.control_endpoint = bind(self._control, options.control_endpoint, options.host)
        self.pool = KVPool(options.num_pages, options.page_bytes)
        self.manager = KVManager(
            role=options.role,
            instance=options.instance,
            rank=options.rank,
            tp=options.tp,
            pool=self.pool,
            bootstrap=options.bootstrap,
            config=options.transfer,
            faults=FaultInjector(options.faults, seed=options.fault_seed),
            host=options.host,
            control_endpoint=self.control_endpoint,
        )
        self._decoder: FrameDecoder[ControlRequest] = FrameDecoder(ControlRequest)
        self._rejections = Counters(rejection_names())
        self.manager.watch_rejections("control", self._rejections)
        self._live: dict[int, _LiveRoom] = {}
        self._digests: dict[int, int] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the loop to end (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Register, then serve until `stop()`; closes everything on the way out."""
        parent = os.getppid()
        try:
            self.manager.start()
            self.log.info(
                "%s rank %d of %s ready: data %s, control %s",
                self.options.role, self.options.rank, self.options.instance,
                self.manager.info.data_endpoint or "-", self.control_endpoint,
            )  # fmt: skip
            while not self._stop.is_set():
                if self._control.poll(_POLL_MS):
                    self._serve_one()
                self._report_finished()
                if os.getppid() != parent:
                    self.log.warning("parent process %d is gone; stopping", parent)
                    break
        finally:
            self.manager.close()
            self._control.close(linger=0)
            self._zmq.term()

    def counters(self) -> dict[str, int]:
        return {**self.manager.counters(), **{f"control_{k}": v for k, v in self._rejections.snapshot().items()}}

    def _serve_one(self) -> None:
        routed = decode_routed(self._control.recv_multipart(), self._decoder, self._rejections)
        if routed is None:
            return
        requester, request = routed
        self._control.send_multipart([requester, encode(self._answer(requester, request))])

    def _answer(self, requester: bytes, request: ControlRequest) -> Submitted | Stats | DigestReply | Refusal:
        if isinstance(request, GetStats):
            return Stats(request.req_id, self.counters())
        if isinstance(request, Digest):
            digest = self._digests.get(request.room)
            if digest is None:
                return Refusal(request.req_id, f"no finished room {request.room} on this rank")
            return DigestReply(request.req_id, request.room, digest)
        return self._submit(requester, request)

    def _submit(self, requester: bytes, request: Submit) -> Submitted | Refusal:
        if request.room in self._live:
            return Refusal(request.req_id, f"room {request.room} is already live on this rank")
        try:
            pages = self.pool.allocate(request.num_pages)
        except PoolExhausted as full:
            return Refusal(request.req_id, f"KV pool full: {full}")
        handle: KVSender | KVReceiver
        if self.options.role is Role.PREFILL:
            self.pool.fill_pattern(pages, seed=request.room * 1_000_003 + self.options.rank)
            handle = self.manager.sender(request.room)
            handle.send(pages)
        else:
            handle = self.manager.receiver(request.room, request.prefill_instance)
            handle.init(pages)
        self._live[request.room] = _LiveRoom(handle, pages, requester, request.req_id, time.monotonic())
        return Submitted(request.req_id, request.room)

    def _report_finished(self) -> None:
        """Answer the submitter of every room the instance agreed on (Success or Failed), free its pages."""
        for room, live in list(self._live.items()):
            handle = live.handle
            state = handle.agreed()
            if not state.is_terminal:
                continue
            failure = handle.agreed_failure
            if failure is not None:
                self._log_failure(room, failure, handle.failed_in)
            self._digests[room] = self.pool.digest(live.pages)
            if len(self._digests) > _DIGESTS_KEPT:
                del self._digests[next(iter(self._digests))]
            result = RoomResult(
                live.req_id,
                room,
                int(state),
                handle.bytes_done,
                time.monotonic() - live.started,
                failure.failure_reason if failure else "",
                handle.reason_class if handle.failure else (ReasonClass.PROPAGATED if failure else ""),
                (failure.origin or "") if failure else "",
                failure.is_from_another_rank if failure else False,
            )
            self._control.send_multipart([live.requester, encode(result)])
            handle.release()
            self.pool.release(live.pages)
            del self._live[room]

    def _log_failure(self, room: int, failure: KVTransferError, failed_in: KVPoll | None) -> None:
        """SGLang's failure line: origins at warning (prefill) or error (decode), echoes at debug."""
        prefill = self.options.role is Role.PREFILL
        early = failed_in is KVPoll.Bootstrapping
        if prefill:
            what, fields = ("Prefill bootstrap" if early else "Prefill transfer"), "req.rid='{rid}' req.bootstrap_room"
        else:
            what, fields = (
                ("Decode handshake" if early else "Decode transfer"),
                ("decode_req.req.rid='{rid}' decode_req.req.bootstrap_room"),
            )
        level = logging.WARNING if prefill else logging.ERROR
        if failure.origin and failure.origin != self.manager.info.label:
            level = logging.DEBUG
        request = fields.format(rid=f"{room:x}")
        self.log.log(
            level,
            "%s failed for request rank=%d %s=%d with exception %s",
            what,
            self.options.rank,
            request,
            room,
            failure,
        )


def parse_args(argv: list[str] | None = None) -> AgentOptions:
    """Read agent options from the command line (`python -m transport.agent --help`)."""
    parser = argparse.ArgumentParser(prog="python -m transport.agent", description="Run one KV transfer rank.")
    parser.add_argument("--role", choices=[r.value for r in Role], required=True)
    parser.add_argument("--instance", required=True, help="instance name, e.g. prefill-0")
    parser.add_argument("--rank", type=int, default=0, help="TP rank within the instance")
    parser.add_argument("--tp", type=int, default=1, help="TP size of the instance")
    parser.add_argument("--bootstrap", required=True, help="bootstrap service endpoint, tcp://HOST:PORT")
    parser.add_argument("--pages", type=int, default=4096, help="KV pool size in pages")
    parser.add_argument("--page-bytes", type=int, default=16 << 10, help="bytes per page on this rank")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind data and control sockets")
    parser.add_argument("--control", default="", help="control endpoint to bind (default: a free port)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20)
    parser.add_argument("--window-bytes", type=int, default=16 << 20)
    parser.add_argument("--bootstrap-timeout", type=float, default=300.0)
    parser.add_argument("--waiting-timeout", type=float, default=300.0)
    parser.add_argument("--transfer-timeout", type=float, default=60.0)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--peer-timeout", type=float, default=5.0)
    parser.add_argument(
        "--no-checksums", action="store_true", help="send chunks without xxh3 checksums (trust TCP's own checks)"
    )
    parser.add_argument("--fault", action="append", default=[], help="KIND[:RATE][@PEER], repeatable")
    parser.add_argument("--fault-seed", type=int, default=None)
    parser.add_argument("--log-file", default="")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    return AgentOptions(
        role=Role(args.role),
        instance=args.instance,
        rank=args.rank,
        tp=args.tp,
        bootstrap=args.bootstrap,
        num_pages=args.pages,
        page_bytes=args.page_bytes,
        host=args.host,
        control_endpoint=args.control,
        transfer=TransferConfig(
            chunk_bytes=args.chunk_bytes,
            window_bytes=args.window_bytes,
            heartbeat_s=args.heartbeat,
            peer_timeout_s=args.peer_timeout,
            timeouts=Timeouts(args.bootstrap_timeout, args.waiting_timeout, args.transfer_timeout),
            checksums=not args.no_checksums,
        ),
        faults=tuple(FaultSpec.parse(text) for text in args.fault),
        fault_seed=args.fault_seed,
        log_file=args.log_file,
        log_level=args.log_level,
    )


def to_args(options: AgentOptions) -> list[str]:
    """The command-line arguments that `parse_args` turns back into `options`."""
    transfer, timeouts = options.transfer, options.transfer.timeouts
    args = [
        "--role", options.role.value, "--instance", options.instance, "--rank", str(options.rank),
        "--tp", str(options.tp), "--bootstrap", options.bootstrap, "--pages", str(options.num_pages),
        "--page-bytes", str(options.page_bytes), "--host", options.host,
        "--chunk-bytes", str(transfer.chunk_bytes), "--window-bytes", str(transfer.window_bytes),
        "--bootstrap-timeout", str(timeouts.bootstrap_s), "--waiting-timeout", str(timeouts.waiting_s),
        "--transfer-timeout", str(timeouts.transfer_s), "--heartbeat", str(transfer.heartbeat_s),
        "--peer-timeout", str(transfer.peer_timeout_s), "--log-level", options.log_level,
    ]  # fmt: skip
    if options.control_endpoint:
        args += ["--control", options.control_endpoint]
    if options.fault_seed is not None:
        args += ["--fault-seed", str(options.fault_seed)]
    if options.log_file:
        args += ["--log-file", options.log_file]
    if not transfer.checksums:
        args.append("--no-checksums")
    for spec in options.faults:
        args += ["--fault", str(spec)]
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point: run an agent until SIGTERM/SIGINT."""
    agent = Agent(parse_args(argv))
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()


if __name__ == "__main__":
    main()
