"""`kvtop bench transfer --vs-mooncake`: Mooncake Transfer Engine's TCP transport as a baseline leg.

Two processes on loopback, each with its own `TransferEngine` (P2P handshake,
TCP, as SGLang's Mooncake backend starts it on a machine without RDMA): the
receiver registers a landing buffer as big as kvtop's pools and hands its
session and address to the sender, which registers a source buffer of the same
size and writes `chunk_bytes` transfers into it, cycling through both buffers,
one credit window per `batch_transfer_sync_write` (the call SGLang makes per
chunk of pages). A write returns when the peer has the bytes, so the leg is
timed on the sender, from the second batch to the last, and afterwards the
receiver checks that its buffer holds the source's bytes.

Mooncake is an optional extra (`pip install 'kvtop[mooncake]'`, the package
`mooncake-transfer-engine-non-cuda`, which needs Debian's libibverbs1 even
for TCP): `require_mooncake` says what is missing before any leg runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from xxhash import xxh3_64_intdigest

from kvtop.bench import BenchFailed
from kvtop.bench.baselines import page_bytes, source_buffer, target_buffer
from kvtop.bench.child import Child, ChildFailed, expect
from kvtop.bench.cpu import CpuMeter, Leg
from transport.kv.memory import keep_receive_buffers
from transport.sockets import data_frame_bound

_HOST = "127.0.0.1"
_ENV = {"MC_FORCE_TCP": "1", "MOONCAKE_PROTOCOL": "tcp", "MC_LOG_LEVEL": "ERROR"}
"""TCP only; Mooncake's log lines from errors up (read when a process starts: set before spawning)."""
_TIMEOUT_S = 120.0


def require_mooncake() -> None:
    """Raise BenchFailed, saying how to install it, unless Mooncake's transfer engine imports here."""
    try:
        _engine_class()
    except ImportError as error:
        raise BenchFailed(
            f"--vs-mooncake needs Mooncake Transfer Engine, which does not import here ({error}): install the "
            "optional extra, pip install 'kvtop[mooncake]' (the PyPI package mooncake-transfer-engine-non-cuda; "
            "on Debian it also needs libibverbs1)"
        ) from None


def _engine_class() -> Any:
    from mooncake.engine import TransferEngine

    return TransferEngine


@contextlib.contextmanager
def _mooncake_env() -> Iterator[None]:
    """`_ENV` for the processes spawned inside, this process's environment as it was afterwards."""
    saved = {name: os.environ.get(name) for name in _ENV}
    os.environ.update(_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _engine() -> tuple[Any, str]:
    """A TCP transfer engine on loopback and its session id (what a peer writes to)."""
    engine = _engine_class()()
    if engine.initialize(_HOST, "P2PHANDSHAKE", "tcp", "") != 0:
        raise BenchFailed("Mooncake's transfer engine did not initialise (TCP on 127.0.0.1)")
    return engine, f"{_HOST}:{engine.get_rpc_port()}"


def _receiver(conn: Connection, chunk_bytes: int, buffer_bytes: int, window_bytes: int) -> None:
    """Register a landing buffer, tell the parent where it is, and when told, whether it holds the source.

    Runs under the allocator setting of a kvtop decode rank (as every other leg's receiving process)."""
    try:
        keep_receive_buffers(data_frame_bound(chunk_bytes, page_bytes(chunk_bytes)), window_bytes)
        engine, session = _engine()
        target = target_buffer(chunk_bytes, buffer_bytes)
        address = int(target.ctypes.data)
        if engine.register_memory(address, target.nbytes) != 0:
            raise BenchFailed("Mooncake did not register the receiver's buffer")
        conn.send((session, address))
        conn.recv()  # the sender is done
        conn.send(xxh3_64_intdigest(target.data))
    except BaseException as error:
        conn.send(ChildFailed("receiver", str(error)))
        raise


def _sender(conn: Connection, session: str, peer: int, chunk_bytes: int, total_bytes: int, window_bytes: int,
            buffer_bytes: int) -> None:  # fmt: skip
    """Write `total_bytes` into the peer's buffer in `chunk_bytes` transfers, one window per batch."""
    try:
        engine, _ = _engine()
        source = source_buffer(chunk_bytes, buffer_bytes)
        base = int(source.ctypes.data)
        if engine.register_memory(base, source.nbytes) != 0:
            raise BenchFailed("Mooncake did not register the sender's buffer")
        slots = source.nbytes // chunk_bytes
        per_batch = max(1, window_bytes // chunk_bytes)
        count = total_bytes // chunk_bytes
        for first in range(0, count, per_batch):
            offsets = [(i % slots) * chunk_bytes for i in range(first, min(count, first + per_batch))]
            lengths = [chunk_bytes] * len(offsets)
            written = engine.batch_transfer_sync_write(
                session, [base + o for o in offsets], [peer + o for o in offsets], lengths
            )
            if written != 0:
                raise BenchFailed(f"Mooncake's batch write of {len(offsets)} transfers returned {written}")
            if first == 0:
                conn.send("warm")
                conn.recv()  # timed from here
        conn.send("done")
    except BaseException as error:
        conn.send(ChildFailed("sender", str(error)))
        raise


def _expect(conn: Connection, what: str, process: mp.process.BaseProcess) -> Any:
    return expect(conn, process, what, _TIMEOUT_S, "the Mooncake leg's process")


def run_mooncake(chunk_bytes: int, total_bytes: int, window_bytes: int, buffer_bytes: int) -> Leg:
    """Seconds (wall and CPU of both processes) for Mooncake's TCP transport to write `total_bytes` on loopback
    in `chunk_bytes` transfers (module docstring); BenchFailed when it failed or landed other bytes."""
    require_mooncake()
    spawn = mp.get_context("spawn")
    to_receiver, receiver_end = spawn.Pipe()
    to_sender, sender_end = spawn.Pipe()
    receiver = Child(target=_receiver, args=(receiver_end, chunk_bytes, buffer_bytes, window_bytes))
    sender: mp.process.BaseProcess | None = None
    with _mooncake_env():
        receiver.start()
    try:
        session, peer = _expect(to_receiver, "landing buffer", receiver)
        sender = Child(
            target=_sender, args=(sender_end, session, peer, chunk_bytes, total_bytes, window_bytes, buffer_bytes)
        )
        with _mooncake_env():
            sender.start()
        _expect(to_sender, "first batch", sender)
        meter = CpuMeter(receiver.pid, sender.pid)
        meter.start()
        started = time.perf_counter()
        to_sender.send("go")
        _expect(to_sender, "last batch", sender)
        timed = meter.stop_leg(time.perf_counter() - started)
        to_receiver.send("done")
        landed = _expect(to_receiver, "digest", receiver)
    finally:
        to_receiver.close()  # a receiver still waiting for "done" (the sender failed) ends at once
        for process in (sender, receiver):
            if process is not None:
                process.join(10)
                if process.is_alive():
                    process.kill()
    source = source_buffer(chunk_bytes, buffer_bytes)
    if total_bytes >= source.nbytes and landed != xxh3_64_intdigest(source.data):
        raise BenchFailed("Mooncake's receiver holds other bytes than the sender's buffer")
    batches = -(-(total_bytes // chunk_bytes) // max(1, window_bytes // chunk_bytes))
    return timed.scaled(batches / max(1, batches - 1))
