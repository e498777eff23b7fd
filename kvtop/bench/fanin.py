"""`kvtop bench fanin`: many agents' events into one collector, directly and through one relay.

The agents are the event plane only: each is transport's `EventPublisher` (its PUB, its snapshot ROUTER,
real `EventBatch` envelopes with seqs, a state mirror for snapshots) registered with a bootstrap service, their
instances in turn servers of one TP group, of two pipeline stages and of two DP replicas (`agent_info`),
fed room lifecycles (state changes, progress, transfers done, 1 % failures) and a heartbeat a second, at
`rate` events/s each. They run in a few processes for the whole bench, each process's publishers on one
`PublisherGroup` thread (a thread per agent would wake 20 times a second each, a cost one agent per host pays
once). Each leg starts one collector (kvtop's `Collector` on a `ClusterModel`, as `kvtop top` runs it, at
its GC thresholds) in this process, on the running cluster: its start to synced is a late joiner's snapshot
sync time. After a warm-up, a window measures events applied vs events the agents emitted, gaps, the
collector's CPU, RSS and open files (the relay's CPU too). Legs alternate (floor, direct, floor_relay, relay,
floor, ...); figures are medians.

The relay leg runs `kvtop relay --bootstrap ADDR` as a user does, and the collector is given its address.
`LEGS` names the configurations measured. The **floor** legs are the baseline, in the same run: the least
work that honestly takes the same frames from the same agents on the same machine (`_Floor`: one SUB, each
frame received and decoded as the collector's subscriber decodes it, events counted, seqs checked for gaps,
paced as the collector's passes; nothing applied), directly and through a relay. Each leg also measures the
agents' own CPU: on a machine of a few cores they run beside the collector (at `AGENTS_NICE`, so that the
load does not starve what is measured), and what they offer of `agents x rate` (`offered_vs_nominal`) says
whether the machine could generate the load at all.

With `curve`, `CURVE_LEGS` run too, on a second cluster whose publishers and bootstrap serve CURVE with fresh
keys, and the relay (`--curve-keys DIR`) and the collector dial with them; only the cluster of the leg being
measured emits (the other is paused), so every leg runs on the same load.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any

import psutil
import zmq

from kvtop.bench import BenchFailed
from kvtop.bench.child import Child
from kvtop.bench.cpu import cpu_seconds, thread_cpu_seconds
from kvtop.bench.report import Compare, Report, at_least, at_most
from kvtop.bench.watch import CountingModel
from kvtop.sources.live import PASS_S, Collector, tune_gc
from transport.bootstrap import MAX_ENTRIES, BootstrapClient, BootstrapServer
from transport.counters import Counters, rejection_names
from transport.curve import CurveKeys, generate, stop_authenticator
from transport.kvpoll import KVPoll
from transport.limits import size_context
from transport.plane.events import (
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    Progress,
    RoomState,
    Snapshot,
    TransferDone,
)
from transport.plane.publisher import EventPublisher, PublisherGroup
from transport.plane.subscriber import AGENT_RCVHWM, RELAY_RCVHWM
from transport.sockets import LIST_FRAME, decode_waiting_frames, open_socket
from transport.version import __version__
from transport.wire import AgentInfo, FrameDecoder

TP = 8
"""Agents per instance: a server of TP 8, of two pipeline stages of TP 4, or of two DP replicas of TP 4."""
_TICK_S = 0.01
_START_TIMEOUT_S = 120.0
_SYNC_TIMEOUT_S = 60.0
_FAILED = 0.01
_CATCH_UP_S = 20.0
_CAUGHT_UP_S = 0.5
_LOAD_MET = 0.95
"""The agents offered at least this share of `agents x rate`: else the machine could not generate the load."""
AGENTS_NICE = 10
"""The agent processes' niceness: they are the load, not what is measured. The scheduler shares a core per
runnable thread, so the agents' threads would starve the collector's one thread: at nice 10 the collector
and the relay keep their share, and what the agents could not offer on a machine too small for both shows
in `offered_vs_nominal`."""


@dataclass(frozen=True)
class Leg:
    """One configuration measured: `relay` puts one `kvtop relay` between the agents and the collector;
    `curve`: every socket of the leg (agents, bootstrap, relay, collector) with CURVE; `floor`: `_Floor`
    takes the collector's place (the baseline)."""

    name: str
    relay: bool
    curve: bool = False
    floor: bool = False


LEGS = (
    Leg("floor", relay=False, floor=True),
    Leg("direct", relay=False),
    Leg("floor_relay", relay=True, floor=True),
    Leg("relay", relay=True),
)
FLOORS = {"direct": "floor", "relay": "floor_relay"}
"""The floor leg each collector leg is compared with (`vs_floor`)."""
CURVE_LEGS = (Leg("direct_curve", relay=False, curve=True), Leg("relay_curve", relay=True, curve=True))
REPORT = Report(
    setting=("window_s", "open_files_limit"),
    compare=(
        Compare("direct.events_per_s", "direct.offered_events_per_s", "direct.applied_ratio"),
        Compare("relay.events_per_s", "relay.offered_events_per_s", "relay.applied_ratio"),
        Compare("relay.events_per_s", "direct.events_per_s", "relay_vs_direct"),
        *(
            Compare(
                f"{path}.events_per_collector_cpu_s",
                f"{floor}.events_per_collector_cpu_s",
                f"vs_floor.{path}.events_per_collector_cpu_s",
            )
            for path, floor in FLOORS.items()
        ),
        *(
            Compare(f"{path}_curve.events_per_s", f"{path}.events_per_s", f"curve_vs_plain.{path}.events_per_s")
            for path in FLOORS
        ),
    ),
    targets=tuple(
        target for path in FLOORS for target in (at_least(f"{path}.applied_ratio", 0.95), at_most(f"{path}.gaps", 0))
    ),
    table=tuple(leg.name for leg in (*LEGS, *CURVE_LEGS)),
)
"""How `measure`'s result reads: each collector leg against the offered load, its floor and plain, then the legs
side by side."""


@dataclass(frozen=True)
class Run:
    """One leg's window. A leg's runs combine field by field (`_of_runs`): the median (3 decimals unless
    `digits` says), or the worst run's where `combine` (max, min) says."""

    offered_events_per_s: float = field(metadata={"digits": 1})
    """Events the agents emitted per second (heartbeats included)."""
    events_per_s: float = field(metadata={"digits": 1})
    """Events the collector's model applied per second."""
    gaps: int = field(metadata={"combine": max})
    """Batches lost in the window, counted per (agent, incarnation) by the collector."""
    sync_s: float
    """Collector start to synced: every agent's snapshot applied, or its request timed out (a late joiner on the
    running cluster); `snapshots_missed` says how many timed out. A floor leg: its start to every agent heard."""
    snapshots_missed: int = field(metadata={"combine": max})
    agents_heard: int = field(metadata={"combine": min})
    """Agents the collector had heard from before the window (all of them, unless it fell behind)."""
    behind_s: float = field(metadata={"digits": 2})
    """At the window's end: now minus the send time of the newest batch applied (how far behind it runs)."""
    stale_batches: int = field(metadata={"combine": max})
    """Batches, since the collector started, that arrived older than the snapshot they follow (skipped)."""
    collector_cpu_cores: float
    """The collector's process (this one): its thread, ZeroMQ's I/O threads, the bench's own idle threads."""
    collector_thread_cpu_cores: float
    """The collecting thread alone (the collector's, or the floor's)."""
    collector_rss_mib: float = field(metadata={"digits": 1})
    collector_open_files: int = field(metadata={"combine": max})
    relay_cpu_cores: float | None
    agents_cpu_cores: float
    """Every agent process together: what the load itself cost the machine."""


@dataclass(frozen=True)
class LegResult:
    """Medians over a leg's runs."""

    agents: int
    nominal_events_per_s: float
    """`agents x rate`: what the agents were asked to emit."""
    offered_events_per_s: float
    offered_vs_nominal: float
    events_per_s: float
    applied_ratio: float
    gaps: int
    """The largest count of any run (target 0)."""
    sync_s: float
    snapshots_missed: int
    agents_heard: int
    behind_s: float
    stale_batches: int
    collector_cpu_cores: float
    collector_thread_cpu_cores: float
    collector_rss_mib: float
    collector_open_files: int
    relay_cpu_cores: float | None
    agents_cpu_cores: float
    events_per_collector_cpu_s: float
    """Events applied per CPU second of the collector's process: what one core would apply, on any machine."""
    load_met: bool
    """The agents offered at least 0.95 of `agents x rate` (else the machine could not generate the load)."""
    target_met: bool
    """At least 0.95 of the offered events applied, no gap, every agent heard, on the load asked (`load_met`):
    DESIGN.md's fan-in target."""
    runs: int


_BOOTSTRAPPING, _WAITING, _TRANSFERRING, _SUCCESS, _FAILED_STATE = (
    int(KVPoll.Bootstrapping), int(KVPoll.WaitingForInput), int(KVPoll.Transferring), int(KVPoll.Success),
    int(KVPoll.Failed),
)  # fmt: skip
_ROOM_BYTES = 1 << 20


def _room_events(rng: random.Random, label: str, ts: float) -> list[Event]:
    """One room's life on a decode rank, as the engine emits it (the load generator: two draws per room)."""
    room = rng.getrandbits(63)
    total = _ROOM_BYTES
    if rng.random() < _FAILED:
        return [
            RoomState(ts, room, _WAITING, _BOOTSTRAPPING, "prefill-0", total),
            RoomState(ts, room, _TRANSFERRING, _WAITING, "prefill-0", total),
            Progress(ts, room, total // 2, total),
            Failure(ts, room, label, "KV chunk failed its checksum", "checksum", "error", False, label),
            RoomState(ts, room, _FAILED_STATE, _TRANSFERRING, "prefill-0", total),
        ]
    return [
        RoomState(ts, room, _WAITING, _BOOTSTRAPPING, "prefill-0", total),
        RoomState(ts, room, _TRANSFERRING, _WAITING, "prefill-0", total),
        Progress(ts, room, total // 2, total),
        RoomState(ts, room, _SUCCESS, _TRANSFERRING, "prefill-0", total),
        TransferDone(ts, room, total, 0.01, "prefill-0"),
    ]


class FaninModel(CountingModel):
    """Counts applied events, and keeps the send time of the newest batch applied (how far behind it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.newest_sent_at = 0.0

    def apply(self, label: str, item: Snapshot | EventBatch, now: float) -> list[Event]:
        if isinstance(item, EventBatch) and item.sent_at > self.newest_sent_at:
            self.newest_sent_at = item.sent_at
        return super().apply(label, item, now)


def agent_info(index: int, incarnation: int) -> AgentInfo:
    """The bench's agent `index`, as users run theirs: instance `decode-N` takes `TP` agents in turn, a server of TP
    8, one of two pipeline stages of TP 4 (`decode-1/PP1-TP0`), one of two DP replicas of TP 4 (`decode-2/DP1-TP0`),
    so that both the collector and the floor key (and label) ranks of a stage or a replica as they do for users."""
    instance, place = divmod(index, TP)
    half, rank = divmod(place, TP // 2)
    shape = instance % 3
    return AgentInfo(
        "decode", f"decode-{instance}", place if shape == 0 else rank, TP if shape == 0 else TP // 2, 4096, "", "",
        os.getpid(), "localhost", incarnation, pp=half if shape == 1 else None, dp=half if shape == 2 else None,
    )  # fmt: skip


class _Agent:
    """One agent's event plane: a publisher (started with its process's group), and the room whose events come
    next."""

    def __init__(self, index: int, rng: random.Random, curve: CurveKeys | None) -> None:
        self.publisher = EventPublisher(agent_info(index, rng.getrandbits(63)), curve=curve)
        self.label = self.publisher.info.label
        self.emitted = 0
        self.pending: list[Event] = []
        """The current room's events still to emit, last first."""
        self.rng = rng

    @property
    def info(self) -> AgentInfo:
        return self.publisher.info

    def emit(self, count: int, heartbeat: bool) -> None:
        ts = time.time()
        publisher = self.publisher
        if heartbeat:
            publisher.emit(Heartbeat(ts, {}, 0, publisher.dropped, 0.0, 0, 0.0, publisher.snapshot_endpoint))
            count -= 1
        emit, pending = publisher.emit, self.pending
        for _ in range(count):
            if not pending:
                pending = _room_events(self.rng, self.label, ts)
                pending.reverse()
            emit(pending.pop())
        self.pending = pending
        self.emitted += count + heartbeat


def _agents_process(first: int, count: int, rate: float, bootstrap: str, curve_keys: str, conn: Connection) -> None:
    """Run agents `first`..`first+count-1` until told to stop; answer "counts" with (emitted, dropped, when:
    `time.monotonic()`, one clock for every process);
    "pause" stops emitting until "resume"; `curve_keys`: the folder every socket serves CURVE with ("": none)."""
    os.nice(AGENTS_NICE)
    size_context(zmq.Context.instance())
    curve = CurveKeys.load(curve_keys, serve=True) if curve_keys else None
    rng = random.Random(first)
    agents = [_Agent(first + i, rng, curve) for i in range(count)]
    PublisherGroup([agent.publisher for agent in agents], f"events-{first}+{count}").start()
    with BootstrapClient(bootstrap, timeout_s=10.0, curve=curve) as client:
        for agent in agents:
            client.register(agent.info)
    for agent in agents:
        publisher = agent.publisher
        publisher.emit(
            AgentHello(time.time(), agent.info, __version__, publisher.endpoint, publisher.snapshot_endpoint)
        )
    conn.send(("ready", count))
    started = time.monotonic()
    owed_before = 0
    next_heartbeat = started + 1.0
    paused = False
    try:
        while True:
            if conn.poll(_TICK_S):
                message = conn.recv()
                if message == "stop":
                    return
                if message in ("pause", "resume"):
                    paused = message == "pause"
                    started, owed_before, next_heartbeat = time.monotonic(), 0, time.monotonic() + 1.0
                    continue
                emitted = sum(agent.emitted for agent in agents)
                conn.send((emitted, sum(agent.publisher.dropped for agent in agents), time.monotonic()))
            if paused:
                continue
            now = time.monotonic()
            owed = int(rate * (now - started))
            owed_before = max(owed_before, owed - int(rate))  # a process that fell behind forgets past a second
            # of debt (its shortfall is offered_vs_nominal), or its bursts grow until it stops answering
            heartbeat = now >= next_heartbeat
            if heartbeat:
                next_heartbeat += 1.0
            if owed > owed_before or heartbeat:
                for agent in agents:
                    agent.emit(max(owed - owed_before, int(heartbeat)), heartbeat)
                owed_before = max(owed, owed_before + int(heartbeat))
    finally:
        for agent in agents:
            agent.publisher.close()
        stop_authenticator(zmq.Context.instance())


class _Agents:
    """The agent processes: started once for the whole bench."""

    def __init__(self, agents: int, processes: int, rate: float, bootstrap: str, curve_keys: str = "") -> None:
        context = mp.get_context("spawn")
        share, extra = divmod(agents, processes)
        self._workers: list[tuple[mp.process.BaseProcess, Connection]] = []
        first = 0
        for index in range(processes):
            count = share + (index < extra)
            mine, theirs = context.Pipe()
            process = Child(
                target=_agents_process,
                args=(first, count, rate, bootstrap, curve_keys, theirs),
                name=f"fanin-agents-{index}{'-curve' if curve_keys else ''}",
            )
            process.start()
            self._workers.append((process, mine))
            first += count

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for process, conn in self._workers:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise BenchFailed(f"agent process {process.name} was not up within {timeout_s:g} s")
            conn.recv()

    def cpu_s(self) -> float:
        """CPU seconds every agent process used so far."""
        total = 0.0
        for process, _ in self._workers:
            if process.pid is not None:
                total += cpu_seconds(psutil.Process(process.pid))
        return total

    def pause(self, paused: bool) -> None:
        """Stop (or start again) emitting: only the cluster a leg measures loads the machine."""
        for _, conn in self._workers:
            conn.send("pause" if paused else "resume")

    def emitted(self) -> list[tuple[int, float]]:
        """(events emitted so far, when) per agent process: each answers when its loop next looks, which on a
        saturated machine is seconds later, so each count comes with the time it was taken."""
        for _, conn in self._workers:
            conn.send("counts")
        counts = []
        for process, conn in self._workers:
            if not conn.poll(60.0):
                raise BenchFailed(f"agent process {process.name} stopped answering")
            emitted, _, when = conn.recv()
            counts.append((emitted, when))
        return counts

    def stop(self) -> None:
        for process, conn in self._workers:
            if process.is_alive():
                conn.send("stop")
        for process, _ in self._workers:
            process.join(10.0)
            if process.is_alive():
                process.kill()
                process.join()


def _offered_per_s(before: list[tuple[int, float]], after: list[tuple[int, float]]) -> float:
    """Events per second the agent processes emitted between two `emitted()` answers, each over its own span."""
    return sum((n1 - n0) / max(t1 - t0, 1e-9) for (n0, t0), (n1, t1) in zip(before, after, strict=True))


class _Floor:
    """The least work that honestly takes the agents' frames: one SUB socket (a connection per agent, or the
    relay's one, queued as the subscriber queues them), each frame received and decoded by the subscriber's
    own decoder and labelled as it labels them, events counted, each (agent, incarnation)'s seqs checked for gaps;
    passes paced as the collector's. No snapshot, no model: what any collector must spend before it applies
    anything."""

    def __init__(self, endpoints: list[str], rcvhwm: int) -> None:
        self._socket = open_socket(zmq.Context.instance(), zmq.SUB, LIST_FRAME, None)
        self._socket.rcvhwm = rcvhwm
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in endpoints:
            self._socket.connect(endpoint)
        self.lock = threading.Lock()
        self.events_applied = 0
        """Events decoded (named as the model's count, which the window reads the same way)."""
        self.gaps = 0
        self.newest_sent_at = 0.0
        self.counters = Counters(("batches", *rejection_names()))
        self._seqs: dict[tuple[str, int], int] = {}
        """(label, incarnation) -> the latest seq decoded."""
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fanin-floor", daemon=True)
        self.thread.start()

    def heard(self) -> int:
        with self.lock:
            return len({label for label, _ in self._seqs})

    def _run(self) -> None:
        decoder: FrameDecoder[EventBatch] = FrameDecoder(EventBatch)
        seqs, sock = self._seqs, self._socket
        while not self._stop.is_set():
            started = time.monotonic()
            if not sock.poll(50):
                continue
            events = gaps = 0
            newest = 0.0
            with self.lock:  # the heard count reads the seqs
                for _, batch in decode_waiting_frames(sock, decoder, self.counters, limit=10_000):
                    # the label as the subscriber makes it: a stage's or a replica's TP0 is a stream of its own
                    label = f"{batch.instance}/TP{batch.rank}" if batch.pp is None and batch.dp is None else batch.label
                    key = (label, batch.incarnation)
                    last = seqs.get(key)
                    if last is not None and batch.seq > last + 1:
                        gaps += batch.seq - last - 1
                    seqs[key] = batch.seq
                    events += len(batch.events)
                    newest = max(newest, batch.sent_at)
                self.events_applied += events
                self.gaps += gaps
                self.newest_sent_at = max(self.newest_sent_at, newest)
            self._stop.wait(PASS_S - (time.monotonic() - started))

    def close(self) -> None:
        self._stop.set()
        self.thread.join()
        self._socket.close(linger=0)


def _event_endpoints(address: str, relayed: bool) -> list[str]:
    """The event endpoints a floor connects to: every agent the bootstrap lists, or the relay's one."""
    with BootstrapClient(address, timeout_s=10.0) as client:
        listing = client.listing()
    if relayed:
        if not listing.relays:
            raise BenchFailed(f"the relay at {address} lists no relay entry")
        return [listing.relays[0].event_endpoint]
    return [agent.event_endpoint for agent in listing.agents]


def _start_relay(bootstrap: str, curve_keys: str) -> tuple[subprocess.Popen[str], str]:
    """`kvtop relay --bootstrap ADDR [--curve-keys DIR]`, as a user runs it; returns the process and the relay's
    address."""
    command = [shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop", "relay", "--bootstrap", bootstrap]
    if curve_keys:
        command += ["--curve-keys", curve_keys]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if "--relay " not in line:
        process.kill()
        _, err = process.communicate()
        raise BenchFailed(f"kvtop relay did not start: {err.strip()[-300:] or line}")
    return process, line.rsplit("--relay ", 1)[1].rstrip(")\n")


def _run_leg(
    leg: Leg, bootstrap: str, agents: _Agents, count: int, warmup_s: float, window_s: float, curve_keys: str
) -> Run:
    """`curve_keys`: the folder of a CURVE leg's cluster ("" for a plain one)."""
    relay: subprocess.Popen[str] | None = None
    address = bootstrap
    if leg.relay:
        relay, address = _start_relay(bootstrap, curve_keys)
    me = psutil.Process()
    model = FaninModel()
    curve = CurveKeys.load(curve_keys, serve=False) if curve_keys else None
    collector: Collector | None = None
    floor: _Floor | None = None
    try:
        started = time.monotonic()
        if leg.floor:
            floor = _Floor(_event_endpoints(address, leg.relay), RELAY_RCVHWM if leg.relay else AGENT_RCVHWM)
            sink: FaninModel | _Floor = floor
            lock, thread = floor.lock, floor.thread
            heard = _wait_heard(floor.heard, count)
            sync_s = time.monotonic() - started
        else:
            collector = Collector(address, model=model, curve=curve)
            collector.start(discover_timeout_s=10.0)
            if not collector.wait_synced(_SYNC_TIMEOUT_S):
                raise BenchFailed(f"{leg.name}: the collector did not sync within {_SYNC_TIMEOUT_S:g} s")
            sync_s = time.monotonic() - started
            sink, lock, thread = model, collector.lock, collector.thread
            heard = _wait_heard(lambda: _ranks_heard(collector, model), count)
        if heard < count:
            raise BenchFailed(f"{leg.name}: heard {heard} of {count} agents in {_SYNC_TIMEOUT_S:g} s")
        time.sleep(warmup_s)
        _wait_caught_up(lock, sink)
        relay_process = psutil.Process(relay.pid) if relay is not None else None
        emitted0 = agents.emitted()  # every figure below is taken at t0 and t1 (the agents count with their own times)
        with lock:
            applied0, gaps0 = sink.events_applied, sink.gaps
            t0 = time.monotonic()
        cpu0, relay_cpu0, agents_cpu0, thread_cpu0 = (
            cpu_seconds(me),
            cpu_seconds(relay_process),
            agents.cpu_s(),
            thread_cpu_seconds(me, thread),
        )
        time.sleep(window_s)
        with lock:
            applied1, gaps1 = sink.events_applied, sink.gaps
            t1 = time.monotonic()
            behind_s = time.time() - sink.newest_sent_at
            stale = model.intake.counters.get("stale_batches", 0)
            missed = model.intake.counters.get("snapshots_missed", 0)
        cpu1, relay_cpu1, agents_cpu1, thread_cpu1 = (
            cpu_seconds(me),
            cpu_seconds(relay_process),
            agents.cpu_s(),
            thread_cpu_seconds(me, thread),
        )
        emitted1 = agents.emitted()
        seconds = t1 - t0
        run = Run(
            offered_events_per_s=_offered_per_s(emitted0, emitted1),
            events_per_s=(applied1 - applied0) / seconds,
            gaps=gaps1 - gaps0,
            sync_s=sync_s,
            snapshots_missed=missed,
            agents_heard=heard,
            behind_s=behind_s,
            stale_batches=stale,
            collector_cpu_cores=(cpu1 - cpu0) / seconds,
            collector_thread_cpu_cores=(thread_cpu1 - thread_cpu0) / seconds,
            collector_rss_mib=me.memory_info().rss / 2**20,
            collector_open_files=me.num_fds(),
            relay_cpu_cores=(relay_cpu1 - relay_cpu0) / seconds if relay_process is not None else None,
            agents_cpu_cores=(agents_cpu1 - agents_cpu0) / seconds,
        )
    finally:
        if collector is not None:
            collector.close()
        if floor is not None:
            floor.close()
        if relay is not None:
            relay.terminate()
            try:
                relay.wait(10.0)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
    if relay is not None and relay.returncode != 0:
        raise BenchFailed(
            f"kvtop relay exited {relay.returncode}: {(relay.stderr.read() if relay.stderr else '')[-300:]}"
        )
    if run.events_per_s <= 0 and not run.stale_batches:
        raise BenchFailed(
            f"{leg.name}: no event batch reached the {'floor' if leg.floor else 'collector'} in the window"
        )
    return run


def _wait_caught_up(lock: threading.Lock, sink: FaninModel | _Floor) -> None:
    """Wait (up to `_CATCH_UP_S`) until the newest batch taken in is under `_CAUGHT_UP_S` old: a window that
    starts while the backlog of the sync drains counts the backlog as applied (applied > offered). One that
    never catches up is measured anyway: how far behind it runs is `behind_s`."""
    deadline = time.monotonic() + _CATCH_UP_S
    while time.monotonic() < deadline:
        with lock:
            if time.time() - sink.newest_sent_at < _CAUGHT_UP_S:
                return
        time.sleep(0.1)


def _ranks_heard(collector: Collector, model: FaninModel) -> int:
    with collector.lock:
        return sum(1 for view in model.ranks.values() if view.last_seen)


def _wait_heard(heard: Callable[[], int], count: int) -> int:
    """Wait until every agent was heard (a snapshot or a batch applied, or decoded by a floor); how many were."""
    deadline = time.monotonic() + _SYNC_TIMEOUT_S
    while True:
        now_heard = heard()
        if now_heard >= count or time.monotonic() > deadline:
            return now_heard
        time.sleep(0.1)


def _of_runs(runs: list[Run]) -> dict[str, Any]:
    """Each field of `Run` over the runs (those that have it): the worst where the field says, else the median."""
    combined: dict[str, Any] = {}
    for spec in fields(Run):
        values = [value for run in runs if (value := getattr(run, spec.name)) is not None]
        combine = spec.metadata.get("combine")
        if not values:
            combined[spec.name] = None
        elif combine is not None:
            combined[spec.name] = combine(values)
        else:
            combined[spec.name] = round(float(statistics.median(values)), spec.metadata.get("digits", 3))
    return combined


def _median(runs: list[Run], count: int, rate: float) -> LegResult:
    combined = _of_runs(runs)
    offered, applied = combined["offered_events_per_s"], combined["events_per_s"]
    nominal = count * rate
    load_met = offered >= _LOAD_MET * nominal
    return LegResult(
        **combined,
        agents=count,
        nominal_events_per_s=round(nominal, 1),
        offered_vs_nominal=round(offered / nominal, 4),
        applied_ratio=round(applied / offered, 4) if offered else 0.0,
        events_per_collector_cpu_s=round(
            statistics.median([r.events_per_s / max(r.collector_cpu_cores, 1e-9) for r in runs])
        ),
        load_met=load_met,
        target_met=bool(offered)
        and load_met
        and applied / offered >= 0.95
        and combined["gaps"] == 0
        and combined["agents_heard"] == count,
        runs=len(runs),
    )


def measure(
    agents: int,
    rate: float,
    processes: int,
    window_s: float,
    repeats: int,
    progress: Callable[[str], None],
    warmup_s: float = 3.0,
    legs: tuple[Leg, ...] = LEGS,
    curve: bool = False,
) -> dict[str, object]:
    """Every leg `repeats` times, alternating; the medians per leg, the relay/direct ratio, the file limit;
    `curve`: the `CURVE_LEGS` too, and the CURVE/plain ratios (`curve_vs_plain`)."""
    open_files = size_context(zmq.Context.instance())  # before this process opens any socket
    gc_thresholds = tune_gc()  # the collector's, as in the dashboard's model process (`kvtop top`)
    load = os.getloadavg()[0]
    legs = (*legs, *CURVE_LEGS) if curve else legs
    folder = tempfile.TemporaryDirectory(prefix="kvtop-fanin-keys-")
    keys_dir = str(generate(os.path.join(folder.name, "keys")).folder) if curve else ""
    secure = CurveKeys.load(keys_dir, serve=True) if curve else None
    processes = min(processes, agents)
    bootstraps: dict[bool, BootstrapServer] = {}
    clusters: dict[bool, _Agents] = {}
    runs: dict[str, list[Run]] = {leg.name: [] for leg in legs}
    try:
        for on in sorted({leg.curve for leg in legs}):  # agents register once: no refresh traffic
            bootstraps[on] = BootstrapServer(  # every agent registers from this host: one client
                entry_ttl_s=3600.0, curve=secure if on else None, max_per_client=MAX_ENTRIES
            ).start()
            clusters[on] = _Agents(agents, processes, rate, bootstraps[on].endpoint, keys_dir if on else "")
        for on, cluster in clusters.items():
            cluster.wait_ready(_START_TIMEOUT_S)
            cluster.pause(True)
            progress(f"{agents} agents up in {processes} processes, {rate:g} events/s each{', CURVE' if on else ''}")
        for index in range(repeats):
            for leg in legs:
                for on, cluster in clusters.items():
                    cluster.pause(on != leg.curve)
                cluster = clusters[leg.curve]
                endpoint = bootstraps[leg.curve].endpoint
                run = _run_leg(leg, endpoint, cluster, agents, warmup_s, window_s, keys_dir if leg.curve else "")
                runs[leg.name].append(run)
                progress(
                    f"{leg.name} run {index + 1}/{repeats}: {run.events_per_s:,.0f} of {run.offered_events_per_s:,.0f}"
                    f" events/s applied, {run.gaps} gaps, synced in {run.sync_s:.2f} s, collector "
                    f"{run.collector_cpu_cores:.2f} cores"
                )
    finally:
        for cluster in clusters.values():
            cluster.stop()
        for bootstrap in bootstraps.values():
            bootstrap.close()
        stop_authenticator(zmq.Context.instance())
        folder.cleanup()
        gc.set_threshold(*gc_thresholds)
    medians = {leg.name: asdict(_median(runs[leg.name], agents, rate)) for leg in legs}
    result: dict[str, object] = dict(medians)
    direct, relayed = medians.get("direct"), medians.get("relay")
    if direct is not None and relayed is not None and direct["events_per_s"]:
        result["relay_vs_direct"] = round(relayed["events_per_s"] / direct["events_per_s"], 4)
    result["vs_floor"] = {
        path: {
            field: round(medians[path][field] / medians[floor][field], 4) if medians[floor][field] else None
            for field in ("applied_ratio", "events_per_collector_cpu_s")
        }
        for path, floor in FLOORS.items()
        if path in medians and floor in medians
    }
    if curve:
        result["curve_vs_plain"] = {
            path: {
                field: round(medians[f"{path}_curve"][field] / medians[path][field], 4)
                if medians[path][field]
                else None
                for field in ("events_per_s", "events_per_collector_cpu_s", "sync_s")
            }
            for path in ("direct", "relay")
        }
    result["open_files_limit"] = open_files
    result["window_s"] = window_s
    result["load_average"] = {"start": round(load, 2), "end": [round(value, 2) for value in os.getloadavg()]}
    return result
