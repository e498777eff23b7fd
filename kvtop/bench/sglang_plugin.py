"""`kvtop bench sglang-plugin`: what the kvtop plugin adds to SGLang's own KV sender calls, in the same run.

A child process is a real SGLang 0.5.x prefill rank on the CPU (`sglang_cpu`): SGLang's `load_plugins()` loads
the kvtop plugin, which registers with a bootstrap service here, and a collector here (a `LiveSource`) listens to
what it publishes, as on a cluster. The child keeps SGLang's own functions from before the hooks were applied and
times them against the hooked ones on the same objects, legs alternated:

- `poll`: a `MooncakeKVSender` whose room waits in Bootstrapping (no decode instance), `calls` calls a leg: the
  scheduler's hot path (a poll per room per scheduler step), where the hook publishes nothing (unchanged state);
- `failure_exception`: senders aborted through SGLang's own `abort()`, one call each (SGLang raises the room's
  `KVTransferError`; hooked, the plugin publishes it as a failure first).

Figures are medians per call; "added" is hooked minus plain. The bench fails when the plugin did not hook, when
the polled room left Bootstrapping, or when the collector did not receive every hooked failure.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import multiprocessing as mp
import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from kvtop.bench import BenchFailed
from kvtop.bench.child import Child, ChildFailed, expect
from kvtop.bench.report import Compare, Report, at_most

POLLED_ROOM = 7_000_001
FIRST_FAILED_ROOM = 8_000_000
ABORTED = "Aborted by AbortReq."
"""SGLang's reason for a room its client aborted."""
_CHILD_S = 120.0
"""Seconds the child may take to start (imports alone take 10-15 s on 2 cores) or to measure."""
_RANK = "the SGLang rank"
MISSING = (
    "needs SGLang 0.5.x and Mooncake (mooncake-transfer-engine-non-cuda) in this Python: `make test-sglang` builds "
    ".venv-sglang with both; then run `.venv-sglang/bin/kvtop bench sglang-plugin`"
)


@dataclass(frozen=True)
class PluginCost:
    sglang_version: str
    calls: int
    repeats: int
    failed_rooms: int
    poll_plain_us: float
    poll_hooked_us: float
    poll_added_us: float
    failure_plain_us: float
    failure_hooked_us: float
    failure_added_us: float
    failures_collected: int

    REPORT: ClassVar[Report] = Report(
        setting=("sglang_version", "calls", "repeats", "failed_rooms"),
        compare=(
            Compare("poll_hooked_us", "poll_plain_us", "poll_added_us"),
            Compare("failure_hooked_us", "failure_plain_us", "failure_added_us"),
        ),
        targets=(at_most("poll_added_us", 2.0),),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def measure_sglang_plugin(
    calls: int, repeats: int, failed_rooms: int, progress: Callable[[str], None], wait_s: float = 10.0
) -> PluginCost:
    """Run the child rank against a bootstrap service and a collector here; its medians, once the collector
    holds every failure the hooked leg raised."""
    if not sglang_installed():
        raise BenchFailed(MISSING)
    import zmq

    from kvtop.source import SourceSpec, open_source
    from transport.bootstrap import BootstrapServer

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = BootstrapServer("", context=context).start()
    spawn = mp.get_context("spawn")
    ours, theirs = spawn.Pipe()
    child = Child(target=_rank, args=(theirs, server.endpoint, calls, repeats, failed_rooms), daemon=True)
    try:
        progress("starting an SGLang prefill rank with the kvtop plugin (imports take 10-20 s)")
        child.start()
        label, version = expect(ours, child, "registration", _CHILD_S, _RANK)
        progress(f"{label} registered (SGLang {version}); timing poll and failure_exception, plain vs hooked")
        with open_source(SourceSpec(bootstrap=server.endpoint, wait=wait_s)) as source:
            ours.send("go")
            poll, failure = expect(ours, child, "timings", _CHILD_S, _RANK)
            expected = repeats * failed_rooms
            deadline = time.monotonic() + wait_s
            while (collected := _failures_of(source, label)) < expected and time.monotonic() < deadline:
                time.sleep(0.1)
        if collected < expected:
            raise BenchFailed(f"the collector received {collected} of the {expected} failures the hooked calls raised")
        plain_poll, hooked_poll = statistics.median(poll["plain"]), statistics.median(poll["hooked"])
        plain_failure, hooked_failure = statistics.median(failure["plain"]), statistics.median(failure["hooked"])
        return PluginCost(
            version, calls, repeats, failed_rooms,
            round(plain_poll, 3), round(hooked_poll, 3), round(hooked_poll - plain_poll, 3),
            round(plain_failure, 2), round(hooked_failure, 2), round(hooked_failure - plain_failure, 2),
            collected,
        )  # fmt: skip
    finally:
        child.kill()
        child.join(10)
        server.close()
        context.destroy(linger=0)


def sglang_installed() -> bool:
    """SGLang's distribution and Mooncake's module are here (by metadata: a folder named `sglang` on the path, as
    the repository's tests/sglang, is not SGLang)."""
    try:
        importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("mooncake") is not None


def _failures_of(source: Any, label: str) -> int:
    with source.lock:
        return sum(1 for failure in source.model.failures if failure.rank == label and failure.reason == ABORTED)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(conn: Connection, bootstrap: str, calls: int, repeats: int, failed_rooms: int) -> None:
    """The child: an SGLang prefill rank with the plugin; sends (its label, SGLang's version), then on "go" the
    timings."""
    try:
        _measure(conn, bootstrap, calls, repeats, failed_rooms)
    except Exception as error:  # said to the parent, which fails naming it
        conn.send(ChildFailed("measurement", f"{type(error).__name__}: {error}"))
    conn.close()
    os._exit(0)  # SGLang's threads (bootstrap server, transfer workers) are not daemons: do not wait for them


def _measure(conn: Connection, bootstrap: str, calls: int, repeats: int, failed_rooms: int) -> None:
    from kvtop.bench.sglang_cpu import CPU_ENVIRONMENT, Pools, kv_manager, start_rank, start_transfer_engine

    os.environ.update({**CPU_ENVIRONMENT, "KVTOP_BOOTSTRAP": bootstrap, "SGLANG_PLUGINS": "kvtop"})
    warnings.simplefilter("ignore", UserWarning)  # SGLang's imports warn of CUDA-only quantization methods
    import sglang
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.common.conn import CommonKVSender, KVTransferError

    plain_poll, plain_failure = CommonKVSender.poll, CommonKVSender.failure_exception
    server_args = start_rank("prefill", 0, 1, _free_port(), _free_port(), plugins=True)
    hooked_poll, hooked_failure = CommonKVSender.poll, CommonKVSender.failure_exception
    if hooked_poll is plain_poll or hooked_failure is plain_failure:
        raise RuntimeError("SGLang's load_plugins() did not hook CommonKVSender (is kvtop installed here?)")
    start_transfer_engine()
    manager = kv_manager(server_args, Pools.make(layers=1, pages=4, page_bytes=256, aux_bytes=64), 4, 1)
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    from transport.sglang.hooks import PLUGIN

    address = f"127.0.0.1:{server_args.disaggregation_bootstrap_port}"
    if PLUGIN is None or "prefill" not in PLUGIN.ranks:
        raise RuntimeError("the kvtop plugin did not make this process a rank")
    conn.send((PLUGIN.ranks["prefill"].label, str(sglang.__version__)))
    conn.recv()

    sender = MooncakeKVSender(manager, address, POLLED_ROOM)
    hooked_poll(sender)  # the room's first state, published once; every timed call finds it unchanged
    polls: dict[str, list[float]] = {"plain": [], "hooked": []}
    for repeat in range(repeats):
        legs = [("plain", plain_poll), ("hooked", hooked_poll)]
        for leg, poll in legs if repeat % 2 == 0 else legs[::-1]:
            start = time.perf_counter_ns()
            for _ in range(calls):
                poll(sender)
            polls[leg].append((time.perf_counter_ns() - start) / calls / 1000)
    if (state := plain_poll(sender)) != KVPoll.Bootstrapping:
        raise RuntimeError(f"the polled room left Bootstrapping ({state!r}): its polls timed something else")

    failures: dict[str, list[float]] = {"plain": [], "hooked": []}
    room = FIRST_FAILED_ROOM
    for repeat in range(repeats):
        legs = [("plain", plain_failure), ("hooked", hooked_failure)]
        for leg, failure_exception in legs if repeat % 2 == 0 else legs[::-1]:
            senders = [MooncakeKVSender(manager, address, room + i) for i in range(failed_rooms)]
            room += failed_rooms
            for aborted in senders:
                aborted.abort()
            start = time.perf_counter_ns()
            for aborted in senders:
                with contextlib.suppress(KVTransferError):
                    failure_exception(aborted)
            failures[leg].append((time.perf_counter_ns() - start) / failed_rooms / 1000)
    conn.send((polls, failures))
    conn.recv()  # stays (its publisher sends the failures) until the parent, holding them all, ends it
