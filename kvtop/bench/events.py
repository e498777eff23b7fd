"""`kvtop bench events`: the cost of publishing events on a watched cluster's transfer path, and a publisher's rate.

Transfer legs alternate with events on and off (the same rooms and sizes; the
ratio of medians is the cost). With events on, a `Collector` in its own process
(`kvtop.bench.watch`) subscribes to both ranks before anything moves, decodes
every batch and applies it to a `ClusterModel`, as `kvtop top` would: a PUB
with no subscriber drops its batches before any I/O, so an unwatched run would
measure nothing. A run whose collector applied no events fails the bench. With
events off, the ranks publish nothing and nobody watches. The rate leg emits
room-state events from one thread as fast as it can while the publisher batches
them to a subscriber that decodes every batch; events/s is what reached it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

import zmq

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_most
from kvtop.bench.transfer import run_kvtop
from kvtop.bench.watch import CollectorProcess, Watched
from transport.plane.events import EventBatch, RoomState
from transport.plane.publisher import EventPublisher
from transport.wire import AgentInfo, FrameDecoder

_RATE_SECONDS = 2.0


@dataclass(frozen=True)
class EventsResult:
    gbps_events_on: float
    gbps_events_off: float
    cost: float
    """1 - on/off: the fraction of transfer throughput that events cost (0.03 = 3 %)."""
    events_per_s: float
    events_dropped: int
    repeats: int
    rooms: int
    """Rooms per transfer run."""
    events_applied: int
    """Events the collector applied in the events-on run that applied the fewest."""
    rooms_seen: int
    """Rooms the collector's model saw end on both ranks, in the run that saw the fewest (of `rooms`)."""
    gaps: int
    """Batches the collector missed, over all runs."""
    catch_up_s: float
    """The longest the collector took, after a run's transfers ended, to see every room end."""
    cpu_s_per_gb_events_on: float
    """Median CPU seconds per GB moved with events on: both ranks and the collector (`kvtop.bench.cpu`)."""
    cpu_s_per_gb_events_off: float
    cpu_cost: float | None
    """1 - off/on of CPU per GB: the share of the work that events and their collector add, whatever share
    of a shared machine's cores the runs got."""

    REPORT: ClassVar[Report] = Report(
        setting=("rooms", "repeats"),
        compare=(
            Compare("gbps_events_on", "gbps_events_off", "cost"),
            Compare("cpu_s_per_gb_events_on", "cpu_s_per_gb_events_off", "cpu_cost"),
        ),
        targets=(at_most("cost", 0.03),),
    )

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def publisher_rate(seconds: float = _RATE_SECONDS) -> tuple[float, int]:
    """Events/s delivered from one publisher to one decoding subscriber, and how many were dropped."""
    info = AgentInfo("prefill", "bench", 0, 1, 1, "", "", 0, "localhost", 1)
    context = zmq.Context()
    publisher = EventPublisher(info, context=context).start()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
    stop = threading.Event()

    def produce() -> None:
        room = 0
        while not stop.is_set():
            for _ in range(1000):
                room += 1
                publisher.emit(RoomState(time.time(), room, 3, 2, "prefill-0", 1 << 20))
            time.sleep(0)

    time.sleep(0.3)  # let the subscription reach the publisher (PUB drops what no one subscribed to)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    received = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        if sub.poll(100):
            received += len(decoder.decode(sub.recv()).events)
    elapsed = time.perf_counter() - started
    stop.set()
    producer.join()
    publisher.close()
    sub.close(linger=0)
    context.term()
    if not received:
        raise BenchFailed(f"no event reached the subscriber in {seconds:g} s")
    return received / elapsed, publisher.dropped


def measure_events(
    chunk_bytes: int, room_bytes: int, rooms: int, repeats: int, progress: Callable[[str], None]
) -> EventsResult:
    """Alternate watched events-on and events-off transfer runs, then the publisher rate.

    Raises BenchFailed when a watched run's collector applied no events."""
    on: list[float] = []
    off: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    watched: list[Watched] = []
    total = room_bytes * rooms
    for repeat in range(repeats):
        collector = CollectorProcess(rooms)
        watched_run = run_kvtop(chunk_bytes, room_bytes, rooms, publish_events=True, watcher=collector)
        watched.append(collector.result())
        unwatched = run_kvtop(chunk_bytes, room_bytes, rooms, publish_events=False)
        on.append(total / watched_run.seconds / 1e9)
        off.append(total / unwatched.seconds / 1e9)
        cpu_on.append(watched_run.cpu_seconds / total * 1e9)
        cpu_off.append(unwatched.cpu_seconds / total * 1e9)
        seen = watched[-1]
        progress(
            f"run {repeat + 1}/{repeats}: events on {on[-1]:.2f} GB/s (collector applied {seen.events_applied:,} "
            f"events, saw {seen.rooms_seen}/{rooms} rooms end, {seen.gaps} gaps; {cpu_on[-1]:.2f} CPU s/GB), "
            f"off {off[-1]:.2f} GB/s ({cpu_off[-1]:.2f} CPU s/GB)"
        )
    rate, dropped = publisher_rate()
    progress(f"publisher: {rate:,.0f} events/s reached the subscriber ({dropped:,} dropped at the queue)")
    gbps_on, gbps_off = statistics.median(on), statistics.median(off)
    return EventsResult(
        gbps_events_on=round(gbps_on, 3),
        gbps_events_off=round(gbps_off, 3),
        cost=round(1 - gbps_on / gbps_off, 4),
        events_per_s=round(rate),
        events_dropped=dropped,
        repeats=repeats,
        rooms=rooms,
        events_applied=min(w.events_applied for w in watched),
        rooms_seen=min(w.rooms_seen for w in watched),
        gaps=sum(w.gaps for w in watched),
        catch_up_s=max(w.catch_up_s for w in watched),
        cpu_s_per_gb_events_on=round(statistics.median(cpu_on), 3),
        cpu_s_per_gb_events_off=round(statistics.median(cpu_off), 3),
        cpu_cost=round(1 - statistics.median(cpu_off) / statistics.median(cpu_on), 4) if any(cpu_on) else None,
    )
