"""One rank as a process: its KV pool and engine, plus a control socket a router drives.

The agent plays the serving engine's scheduler: on `Submit` a prefill rank
"computes" the room's KV (writes a room-specific pattern into fresh pages) and
sends it; a decode rank allocates pages and receives. When a room ends, the
agent answers the submitter with a `RoomResult` and frees the pages. Run it
with `python -m transport.harness.agent --help` (or `kvtop agent`); a harness passes
every option as one JSON argument instead (`child_args`).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from transport.bootstrap import BootstrapClient
from transport.config import LOG_LEVELS, Role, Timeouts, TransferConfig
from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, exposure_problem, serving, stop_authenticator
from transport.errors import BootstrapError, CallAbandoned, ConfigError, KVTransferError
from transport.harness.logs import setup_agent_logging
from transport.kv.engine import KVManager, KVReceiver, KVSender
from transport.kv.faults import FaultInjector, FaultSpec, check_role
from transport.kv.pool import KVPool, PageIndices, PoolExhausted
from transport.kvpoll import KVPoll
from transport.registration import MAX_PAGE_BYTES, MAX_TP, endpoint_problem, instance_problem
from transport.signals import STOP_SIGNALS, ignore
from transport.sockets import SMALL_FRAME, bind, bind_problem, decode_routed, open_socket
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
_LOOKUP_TIMEOUT_S = 1.0
_ENGINE_ANSWER_S = 5.0
"""How long the control thread waits for the engine thread to fail a room it refused (as long as the engine's own
calls wait for it)."""
"""How long a Submit naming a prefill instance not seen yet waits for the bootstrap service."""
OPTIONS_JSON = "--options-json"
"""Its one argument after it holds every option as JSON (`child_args`), in place of the flags."""
SUBMIT_REFUSALS = ("pages", "instance", "live", "pool_full")
"""Why a Submit is refused, each counted as `control_refused_<why>`."""


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
    curve_keys: str = ""
    """A key folder (`transport.curve`): every socket of the rank with CURVE; "" for plain TCP."""
    insecure: bool = False
    """Bind beyond loopback without CURVE anyway."""

    def __post_init__(self) -> None:
        check_role(self.faults, self.role)
        problem = exposure_problem([self.host, self.control_endpoint], bool(self.curve_keys), self.insecure)
        problem = problem or _identity_problem(self) or _start_problem(self)
        if problem:
            raise ConfigError(problem)


def _identity_problem(options: AgentOptions) -> str:
    """What the bootstrap service would refuse of this rank's entry (`registration.agent_problem`), in its
    words, before the rank starts ("" when nothing)."""
    if problem := instance_problem(options.instance):
        return f"--instance: {problem}"
    if not 1 <= options.tp <= MAX_TP or not 0 <= options.rank < options.tp:
        return f"--rank/--tp: rank {options.rank} of TP {options.tp} (TP 1 to {MAX_TP}, 0 <= rank < TP)"
    if not 0 < options.page_bytes <= MAX_PAGE_BYTES:
        return f"--page-bytes: page size {options.page_bytes} B (1 to {MAX_PAGE_BYTES})"
    return ""


def _start_problem(options: AgentOptions) -> str:
    """Why the rank could not start with these options ("" when it can): an address, level or log file
    that cannot be used, or a KV pool this machine cannot hold."""
    if problem := endpoint_problem(options.bootstrap):
        return f"--bootstrap: {problem}"
    if options.control_endpoint and (problem := bind_problem(options.control_endpoint)):
        return f"--control: {problem}"
    if options.log_level.upper() not in LOG_LEVELS:
        return f"--log-level {options.log_level!r} (expected one of {', '.join(LOG_LEVELS)})"
    return _log_file_problem(options.log_file) or _pool_problem(options.num_pages, options.page_bytes)


def _log_file_problem(path: str) -> str:
    """Why the rank cannot append its log to `path` ("" when it can, or when it logs to stderr)."""
    if not path:
        return ""
    file = Path(path)
    if file.is_dir():
        return f"--log-file {path} is a folder (give a file in it)"
    if not file.parent.is_dir():
        return f"--log-file {path}: no folder {file.parent}"
    if not os.access(file if file.exists() else file.parent, os.W_OK):
        return f"--log-file {path} cannot be written"
    return ""


def _pool_problem(num_pages: int, page_bytes: int) -> str:
    """Why a KV pool of `num_pages` pages of `page_bytes` cannot be allocated: more bytes than this machine's
    memory ("" otherwise, or where the system does not say how much it has)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return ""
    if 0 < memory < num_pages * page_bytes:
        pool = f"{num_pages} pages of {page_bytes} B ({num_pages * page_bytes / (1 << 30):.1f} GiB)"
        return f"--pages/--page-bytes: a KV pool of {pool} is more than this machine's memory ({memory >> 30} GiB)"
    return ""


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
        self.curve = CurveKeys.load(options.curve_keys, serve=True) if options.curve_keys else None
        self._zmq = zmq.Context()
        self._control = open_socket(self._zmq, zmq.ROUTER, SMALL_FRAME, serving(self.curve))
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
            curve=self.curve,
        )
        self._decoder: FrameDecoder[ControlRequest] = FrameDecoder(ControlRequest)
        self._rejections = Counters(rejection_names())
        self._refusals = Counters(SUBMIT_REFUSALS)
        self._prefill_instances: set[str] = set()
        """Prefill instances the bootstrap service listed (a decode Submit must name one)."""
        self.manager.watch_rejections("control", self._rejections)
        self._live: dict[int, _LiveRoom] = {}
        self._submits_refused = 0
        self._digests: dict[int, int] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the loop to end (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Register, then serve until `stop()`; closes everything on the way out.

        Returns the exit status: 0 when stopped, 1 when a thread of this rank died (logged with its
        traceback): a rank that cannot transfer ends rather than hang. An exception of this loop is
        logged the same way, then raised. Only a rank that stops cleanly leaves the bootstrap listing: one that
        failed stays listed until its entry expires, so every view names it gone.
        """
        parent = os.getppid()
        clean = False
        try:
            self.manager.start(stop=self._stop)
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
                dead = self.manager.dead_thread()
                if dead is not None:
                    self.log.error("thread %s died (its traceback is above); this rank exits with status 1", dead)
                    return 1
            clean = True
            return 0
        except CallAbandoned:  # stopped while registering: nothing to deregister
            return 0
        except BootstrapError as error:  # an answer (none, or a refusal), not a bug: its line, no traceback
            self.log.error("%s cannot register: %s", self.manager.info.label, error)
            raise
        except Exception:
            self.log.exception("the agent loop of %s died", self.manager.info.label)
            raise
        finally:
            self.manager.close(deregister=clean)
            self._control.close(linger=0)
            stop_authenticator(self._zmq)
            self._zmq.term()

    def counters(self) -> dict[str, int]:
        """The engine's counters, the control socket's rejections (`control_rejected_*`) and refusals
        (`control_refused_*`), the pool now and the Submits this rank refused (`submits_refused`, all reasons)."""
        control = {**self._rejections.snapshot(), **{f"refused_{k}": v for k, v in self._refusals.snapshot().items()}}
        pool = {
            "pool_pages": self.pool.num_pages,
            "pool_free_pages": self.pool.free_pages,
            "rooms_live": len(self._live),
            "submits_refused": self._submits_refused,
        }
        return {**self.manager.counters(), **{f"control_{k}": v for k, v in control.items()}, **pool}

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
        answer = self._submit(requester, request)
        if isinstance(answer, Refusal):
            self._submits_refused += 1
        return answer

    def _refuse(self, request: Submit, why: str, message: str) -> Refusal:
        self._refusals.add(why)
        return Refusal(request.req_id, message)

    def _submit(self, requester: bytes, request: Submit) -> Submitted | Refusal:
        if request.room in self._live:
            return self._refuse(request, "live", f"room {request.room} is already live on this rank")
        if not 0 < request.num_pages <= self.pool.num_pages:
            message = f"num_pages {request.num_pages} is outside 1..{self.pool.num_pages} (this rank's pool)"
            return self._refuse(request, "pages", message)
        unknown = self._unknown_instance(request.prefill_instance)
        if unknown:
            return self._refuse(request, "instance", unknown)
        try:
            pages = self.pool.allocate(request.num_pages)
        except PoolExhausted as full:  # the room fails here: the ranks that took it must not wait for this one
            self._log_refused(request.room, self.manager.refuse(request.room, request.prefill_instance))
            return self._refuse(request, "pool_full", f"KV pool full: {full}")
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

    def _unknown_instance(self, instance: str) -> str:
        """Why `instance` cannot be this Submit's prefill instance, or "" when it can."""
        if self.options.role is Role.PREFILL:
            if instance in ("", self.options.instance):
                return ""
            return f"prefill instance {instance!r} is not this rank's ({self.options.instance})"
        if instance in self._prefill_instances:
            return ""
        try:
            with BootstrapClient(self.options.bootstrap, _LOOKUP_TIMEOUT_S, self._zmq, curve=self.curve) as client:
                agents = client.list_agents()
        except BootstrapError as error:
            return f"cannot check prefill instance {instance!r}: {error}"
        self._prefill_instances = {a.instance for a in agents if a.role == Role.PREFILL}
        if instance in self._prefill_instances:
            return ""
        known = ", ".join(sorted(self._prefill_instances)) or "none"
        return f"unknown prefill instance {instance!r}; the bootstrap service lists: {known}"

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
                handle.agreed_reason_class,
                (failure.origin or "") if failure else "",
                failure.is_from_another_rank if failure else False,
            )
            self._control.send_multipart([live.requester, encode(result)])
            handle.release()
            self.pool.release(live.pages)
            del self._live[room]

    def _log_refused(self, room: int, failed: Future[KVTransferError | None]) -> None:
        """The failure line of a room refused here, as SGLang logs a room that failed before its transfer began
        (`Prefill bootstrap failed ...`, `Decode handshake failed ...`): a log read with `--sglang-log` names it."""
        try:
            failure = failed.result(timeout=_ENGINE_ANSWER_S)
        except TimeoutError:
            self.log.error("room %d refused here, but the engine thread did not fail it within %.0f s", room,
                           _ENGINE_ANSWER_S)  # fmt: skip
            return
        if failure is not None:
            self._log_failure(room, failure, KVPoll.Bootstrapping)

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
    """Read agent options from the command line (`python -m transport.harness.agent --help`), or from the one JSON
    object of `child_args` (decoded with its type: a bad value is a usage error, as a bad flag is)."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == [OPTIONS_JSON]:
            if len(argv) != 2:
                parser.error(f"{OPTIONS_JSON} takes one JSON argument and no flags")
            options = msgspec.json.decode(argv[1], type=AgentOptions)
        else:
            options = _options(parser.parse_args(argv))
        if options.curve_keys:
            CurveKeys.load(options.curve_keys, serve=True)  # a bad key folder is a usage error, at start
        return options
    except (ConfigError, msgspec.MsgspecError) as error:
        parser.error(str(error))


def _parser() -> argparse.ArgumentParser:
    transfer, timeouts = TransferConfig(), Timeouts()
    parser = argparse.ArgumentParser(
        prog="python -m transport.harness.agent",
        description="Run one KV transfer rank (`kvtop agent` takes the same options). A harness passes every "
        f"option as one JSON object instead: {OPTIONS_JSON} JSON, alone.",
        epilog="Exit status: 0 when stopped (SIGTERM, SIGINT, SIGHUP, or its parent went away); 1 when a thread of "
        "the rank died (logged with its traceback) or it could not start; 2 for bad usage.",
        formatter_class=_ShownDefaults,
    )
    add = parser.add_argument
    add("--role", choices=[r.value for r in Role], required=True, help="which side this rank serves")
    add("--instance", required=True, help="instance name, unique in the cluster, e.g. prefill-0")
    add("--bootstrap", required=True, help="bootstrap service endpoint, tcp://HOST:PORT")
    add("--rank", type=int, default=0, help="TP rank within the instance")
    add("--tp", type=int, default=1, help="TP size of the instance")
    add("--pages", type=int, default=4096, help="KV pool size in pages")
    add("--page-bytes", type=int, default=16 << 10, help="bytes per page on this rank")
    add("--host", default="127.0.0.1", help="address to bind data and control sockets")
    add("--control", default="", help="control endpoint to bind (none: a free port on --host)")
    add("--chunk-bytes", type=int, default=transfer.chunk_bytes, help="bytes per data frame")
    add("--window-bytes", type=int, default=transfer.window_bytes, help="unacknowledged bytes per link")
    add("--bootstrap-timeout", type=float, default=timeouts.bootstrap_s, help="seconds a room may bootstrap")
    add("--waiting-timeout", type=float, default=timeouts.waiting_s, help="seconds a room may wait for input")
    add("--transfer-timeout", type=float, default=timeouts.transfer_s, help="seconds without transfer progress")
    add("--heartbeat", type=float, default=transfer.heartbeat_s, help="seconds between heartbeats on each link")
    add(
        "--peer-timeout",
        type=float,
        default=transfer.peer_timeout_s,
        help="seconds until a silent peer is lost; also how long a rank of this instance may go without "
        "voting on a room this rank took before the room fails (timeout_consensus)",
    )
    add(
        "--no-checksums",
        action="store_true",
        help="send chunks without page digests or xxh3 checksums (trust TCP's own checks)",
    )
    add("--fault", action="append", default=[], help="KIND[:RATE][@PEER], repeatable (a decode rank takes only die)")
    add("--fault-seed", type=int, default=None, help="seed of the fault dice (none: a different run every time)")
    add("--log-file", default="", help="file for the SGLang-format log (none: stderr)")
    add("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO", help="lowest level logged")
    add(
        "--curve-keys",
        default="",
        metavar="DIR",
        help="CURVE key folder (kvtop keys generate DIR): every socket of this rank encrypted and open only to "
        "clients in DIR/allowed",
    )
    add("--insecure", action="store_true", help="bind a --host or --control beyond loopback without --curve-keys")
    return parser


class _ShownDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except the empty ones (the help says what empty means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        empty = action.default in ("", None, False, [])
        return action.help if empty else super()._get_help_string(action)


def _options(args: argparse.Namespace) -> AgentOptions:
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
        curve_keys=args.curve_keys,
        insecure=args.insecure,
    )


def child_args(options: AgentOptions) -> list[str]:
    """The arguments that start a rank process with `options` (how a harness starts one): one JSON object."""
    return [OPTIONS_JSON, msgspec.json.encode(options).decode()]


def serve(options: AgentOptions) -> int:
    """Run a rank until SIGTERM, SIGINT or SIGHUP (returns 0), or until one of its threads dies (returns 1); a fatal
    signal dumps every thread's stack to stderr."""
    faulthandler.enable()
    agent = Agent(options)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: agent.stop())
    try:
        return agent.run()
    finally:
        ignore(*STOP_SIGNALS)  # stopped: a late signal must not kill the interpreter's exit (-15)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `serve` the options of the command line (`parse_args`), exit with its status."""
    sys.exit(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
