"""`kvtop bench curve`: what CURVE costs on the event plane and on KV transfers, against plain TCP in the same run.

Two pairs of legs, alternated `repeats` times, plain then CURVE; figures are medians and ratios are
CURVE over plain:

- events: one agent's `EventPublisher` fed as fast as one thread can emit room-state events, to the
  collector's `EventSubscriber` in another process, decoding every batch; events/s is what reached it in
  `event_seconds` after its first batch. The CURVE leg also runs a subscriber without keys beside it,
  which must receive nothing (else CURVE was not on and the bench fails).
- transfer: `kvtop bench transfer`'s kvtop leg (a prefill and a decode process, events on, checksums on)
  at `chunk_bytes`; the CURVE leg serves every socket with CURVE and first checks that its bootstrap
  service ignores a client without keys.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import ClassVar

import msgspec
import zmq

from kvtop.bench import BenchFailed
from kvtop.bench.child import Child
from kvtop.bench.report import Compare, Report
from kvtop.bench.transfer import check_sizes, run_kvtop
from transport.curve import CurveKeys, generate, stop_authenticator
from transport.plane.events import EventBatch, RoomState
from transport.plane.publisher import EventPublisher
from transport.plane.subscriber import EventSubscriber
from transport.wire import AgentInfo

_FIRST_BATCH_S = 10.0


@dataclass(frozen=True)
class CurveResult:
    """Medians of each leg, and CURVE over plain (1.0: CURVE costs nothing)."""

    events_per_s_plain: float
    events_per_s_curve: float
    events_ratio: float
    transfer_gbps_plain: float
    transfer_gbps_curve: float
    transfer_ratio: float
    transfer_cpu_s_per_gb_plain: float
    """CPU seconds per GB moved, both processes (`kvtop.bench.cpu`): what a shared machine bends less."""
    transfer_cpu_s_per_gb_curve: float
    transfer_cpu_ratio: float
    """Plain's CPU per GB over CURVE's: the GB/s ratio a machine the transfer saturates would show."""
    chunk_bytes: int
    room_bytes: int
    rooms: int
    repeats: int
    event_seconds: float
    runs: dict[str, list[float]]
    """Every run's figure per leg (events/s, GB/s), in the order they alternated."""

    REPORT: ClassVar[Report] = Report(
        setting=("chunk_bytes", "room_bytes", "rooms", "repeats", "event_seconds"),
        compare=(
            Compare("events_per_s_curve", "events_per_s_plain", "events_ratio"),
            Compare("transfer_gbps_curve", "transfer_gbps_plain", "transfer_ratio"),
            Compare("transfer_cpu_s_per_gb_curve", "transfer_cpu_s_per_gb_plain", "transfer_cpu_ratio"),
        ),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _agent(event_endpoint: str = "", snapshot_endpoint: str = "") -> AgentInfo:
    info = AgentInfo("prefill", "bench-events", 0, 1, 1, "", "", os.getpid(), "localhost", 1)
    return msgspec.structs.replace(info, event_endpoint=event_endpoint, snapshot_endpoint=snapshot_endpoint)


def _events_in(subscriber: EventSubscriber, timeout_s: float) -> int:
    return sum(len(d.item.events) for d in subscriber.poll(timeout_s) if isinstance(d.item, EventBatch))


def _subscribe(endpoints: tuple[str, str], curve_keys: str, seconds: float, report: Connection) -> None:
    """The collector's side, in its own process: count the events that arrive for `seconds` after the first
    batch; with keys, a subscriber without any listens beside it. Sends (events, seconds, outsider heard)."""
    keys = CurveKeys.load(curve_keys, serve=False) if curve_keys else None
    agent = _agent(*endpoints)
    subscriber = EventSubscriber(curve=keys)
    outsider = EventSubscriber() if keys is not None else None
    try:
        for sub in (subscriber, outsider):
            if sub is not None:
                sub.connect(agent)
        deadline = time.monotonic() + _FIRST_BATCH_S
        while not _events_in(subscriber, 0.1):
            if time.monotonic() > deadline:
                report.send((0, 0.0, 0))
                return
        received = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            received += _events_in(subscriber, 0.1)
        elapsed = time.perf_counter() - started
        heard = _events_in(outsider, 0.0) + outsider.counters["snapshots"] if outsider is not None else 0
        report.send((received, elapsed, heard))
    finally:
        subscriber.close()
        if outsider is not None:
            outsider.close()


def event_rate(seconds: float, curve_keys: str) -> float:
    """Events/s from one publisher (this process, fed by one thread) to a decoding subscriber in another
    process, with CURVE on both when `curve_keys` names a folder."""
    keys = CurveKeys.load(curve_keys, serve=True) if curve_keys else None
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    publisher = EventPublisher(_agent(), context=context, curve=keys)
    publisher.start()
    stop = threading.Event()

    def produce() -> None:
        room = 0
        while not stop.is_set():
            for _ in range(1000):
                room += 1
                publisher.emit(RoomState(time.time(), room, 3, 2, "decode-0", 1 << 20))
            time.sleep(0)

    producer = threading.Thread(target=produce, name="bench-producer", daemon=True)
    spawn = mp.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    endpoints = (publisher.endpoint, publisher.snapshot_endpoint)
    collector = Child(target=_subscribe, args=(endpoints, curve_keys, seconds, send), daemon=True)
    try:
        collector.start()
        producer.start()
        if not receive.poll(_FIRST_BATCH_S + seconds + 30):
            raise BenchFailed(f"the subscriber process did not report (exit code {collector.exitcode})")
        received, elapsed, outsider_heard = receive.recv()
    finally:
        stop.set()
        if producer.is_alive():
            producer.join()
        collector.join(10)
        if collector.is_alive():
            collector.kill()
        publisher.close()
        stop_authenticator(context)
        context.term()
    if not received:
        raise BenchFailed(f"no event reached the subscriber within {_FIRST_BATCH_S:g} s")
    if outsider_heard:
        raise BenchFailed("a subscriber without keys received events or a snapshot: CURVE was not on")
    return float(received / elapsed)


def measure_curve(
    chunk_bytes: int,
    room_bytes: int,
    rooms: int,
    repeats: int,
    event_seconds: float,
    progress: Callable[[str], None],
    curve_keys: str = "",
) -> CurveResult:
    """Alternate plain and CURVE legs (events, then transfer) `repeats` times; keys made in a temp folder
    unless `curve_keys` names a folder. Raises ValueError for sizes the transfer legs cannot use."""
    check_sizes(chunk_bytes, room_bytes)
    with tempfile.TemporaryDirectory(prefix="kvtop-bench-curve-") as scratch:
        folder = curve_keys or str(generate(os.path.join(scratch, "keys")).folder)
        CurveKeys.load(folder, serve=True)  # usable, or CurveError before any leg starts
        runs: dict[str, list[float]] = {"events_plain": [], "events_curve": [], "gbps_plain": [], "gbps_curve": []}
        cpu: dict[str, list[float]] = {"plain": [], "curve": []}
        total = room_bytes * rooms
        for repeat in range(repeats):
            runs["events_plain"].append(event_rate(event_seconds, ""))
            runs["events_curve"].append(event_rate(event_seconds, folder))
            for leg, keys_folder in (("plain", ""), ("curve", folder)):
                timed = run_kvtop(chunk_bytes, room_bytes, rooms, curve_keys=keys_folder)
                runs[f"gbps_{leg}"].append(total / timed.seconds / 1e9)
                cpu[leg].append(timed.cpu_seconds / total * 1e9)
            progress(
                f"run {repeat + 1}/{repeats}: events plain {runs['events_plain'][-1]:,.0f}/s, "
                f"CURVE {runs['events_curve'][-1]:,.0f}/s; transfer plain {runs['gbps_plain'][-1]:.2f} GB/s "
                f"({cpu['plain'][-1]:.2f} CPU s/GB), CURVE {runs['gbps_curve'][-1]:.2f} GB/s "
                f"({cpu['curve'][-1]:.2f} CPU s/GB)"
            )
    med = {name: statistics.median(values) for name, values in runs.items()}
    cpu_plain, cpu_curve = statistics.median(cpu["plain"]), statistics.median(cpu["curve"])
    return CurveResult(
        events_per_s_plain=round(med["events_plain"]),
        events_per_s_curve=round(med["events_curve"]),
        events_ratio=round(med["events_curve"] / med["events_plain"], 3),
        transfer_gbps_plain=round(med["gbps_plain"], 3),
        transfer_gbps_curve=round(med["gbps_curve"], 3),
        transfer_ratio=round(med["gbps_curve"] / med["gbps_plain"], 3),
        transfer_cpu_s_per_gb_plain=round(cpu_plain, 3),
        transfer_cpu_s_per_gb_curve=round(cpu_curve, 3),
        transfer_cpu_ratio=round(cpu_plain / cpu_curve, 3) if cpu_curve else 0.0,
        chunk_bytes=chunk_bytes,
        room_bytes=room_bytes,
        rooms=rooms,
        repeats=repeats,
        event_seconds=event_seconds,
        runs={name: [round(v, 3) for v in values] for name, values in runs.items()},
    )
