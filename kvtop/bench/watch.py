"""A real collector, in its own process, subscribed to the ranks of a `bench transfer` run.

`bench events` measures what events cost a watched cluster: agents publishing
to a `Collector` (`kvtop.sources.live`) that decodes every batch and applies it
to a `ClusterModel`, as `kvtop top` does. A PUB with no subscriber drops its
batches before any I/O, so an unwatched run would measure nothing.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType

from kvtop.bench import BenchFailed
from kvtop.bench.child import Child
from kvtop.model.cluster import ClusterModel
from kvtop.sources.live import Collector
from transport.plane.events import Event, EventBatch, Snapshot

_SYNC_TIMEOUT_S = 30.0
_CATCH_UP_S = 10.0
"""How long the collector may take, after the transfers ended, to see every room end on every rank."""


class CountingModel(ClusterModel):
    """A cluster model that counts the events applied to it (the bench's proof that ingest happened)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_applied = 0
        self.snapshots_applied = 0

    def apply(self, label: str, item: Snapshot | EventBatch, now: float) -> list[Event]:
        accepted = super().apply(label, item, now)
        if isinstance(item, EventBatch):
            self.events_applied += len(accepted)
        else:
            self.snapshots_applied += 1
        return accepted


@dataclass(frozen=True)
class Watched:
    """What the collector did during one run."""

    events_applied: int
    snapshots_applied: int
    rooms_seen: int
    """Rooms 1..rooms that the model saw end on both ranks."""
    gaps: int
    catch_up_s: float
    """Seconds from the end of the timed transfers until the model saw every room end (or gave up)."""
    recorded_events: int = 0
    """Events its recorder wrote (`record_to` given), and the bytes of its recording."""
    recorded_bytes: int = 0

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


def rooms_ended(model: ClusterModel, rooms: int, ranks: int) -> int:
    """How many of rooms 1..`rooms` the model saw end on `ranks` ranks (open or already retired)."""
    seen = 0
    for room in range(1, rooms + 1):
        view = model.rooms.get(room)
        if view is None and (finished := model.finished.get(room)) is not None:
            view = finished.view
        seen += view is not None and len(view.codes) >= ranks and view.finished()
    return seen


def _collect(
    bootstrap: str, rooms: int, synced: EventType, settle: EventType, results: Connection, record_to: str
) -> None:
    from kvtop.record.writer import Recorder

    model = CountingModel()
    recorder = Recorder(record_to).start() if record_to else None
    collector = Collector(bootstrap, model=model, recorder=recorder).start()
    collector.wait_synced(_SYNC_TIMEOUT_S)
    synced.set()
    settle.wait(600)
    started = time.monotonic()
    seen = 0
    while time.monotonic() - started < _CATCH_UP_S:
        with collector.lock:
            seen = rooms_ended(model, rooms, 2)
        if seen == rooms:
            break
        time.sleep(0.02)
    catch_up = time.monotonic() - started
    collector.close()
    recorded = (0, 0)
    if recorder is not None:
        recorder.close()
        stats = recorder.stats()
        if stats.error:
            raise RuntimeError(stats.error)
        recorded = (stats.events, stats.bytes)
    watched = Watched(model.events_applied, model.snapshots_applied, seen, model.gaps, round(catch_up, 3), *recorded)
    results.send(watched)


class CollectorProcess:
    """`start(bootstrap)` before the timed transfers, `settle()` after them, then `result()`."""

    def __init__(self, rooms: int, record_to: str = "") -> None:
        """`record_to`: a folder the collector records to (kvtop.record), as `kvtop record` would."""
        self.rooms = rooms
        self.record_to = record_to
        context = mp.get_context("spawn")
        self._synced = context.Event()
        self._settle = context.Event()
        self._results, self._sender = context.Pipe(duplex=False)
        self._process: mp.process.BaseProcess | None = None
        self._watched: Watched | None = None

    def start(self, bootstrap: str) -> None:
        """Start the collector on the run's bootstrap address; return once it has every rank's snapshot."""
        self._process = Child(
            target=_collect,
            args=(bootstrap, self.rooms, self._synced, self._settle, self._sender, self.record_to),
            daemon=True,
        )
        self._process.start()
        deadline = time.monotonic() + _SYNC_TIMEOUT_S + 30
        while not self._synced.wait(0.1):
            if not self._process.is_alive():
                self.stop()
                raise BenchFailed("the collector process ended before it subscribed (its traceback is above)")
            if time.monotonic() > deadline:
                self.stop()
                raise BenchFailed(f"the collector did not subscribe within {_SYNC_TIMEOUT_S + 30:g} s")

    @property
    def pid(self) -> int | None:
        """The collector's process while it runs (its CPU time counts in the run's)."""
        return self._process.pid if self._process is not None else None

    def settle(self) -> None:
        """The timed transfers ended: wait until the collector saw every room end (bounded), then stop it."""
        self._settle.set()
        deadline = time.monotonic() + _CATCH_UP_S + 30
        while not self._results.poll(0.1):
            alive = self._process is not None and self._process.is_alive()
            if not alive or time.monotonic() > deadline:
                self.stop()
                raise BenchFailed("the collector process ended without reporting (its traceback is above)")
        self._watched = self._results.recv()
        self.stop()

    def stop(self) -> None:
        """End the collector process (it ends by itself once it reported; a failed run's is let go too)."""
        if self._process is not None:
            self._settle.set()
            self._process.join(_CATCH_UP_S + 5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process = None

    def result(self) -> Watched:
        """What the collector applied; raises BenchFailed when it applied no events (nothing was measured)."""
        watched = self._watched
        if watched is None:
            raise BenchFailed("the collector never reported (was the run started?)")
        if watched.events_applied == 0:
            raise BenchFailed(
                f"the collector applied no events ({watched.snapshots_applied} snapshots): "
                "the events-on run was not watched, so its cost says nothing"
            )
        return watched
