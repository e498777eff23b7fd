"""`kvtop bench fanin`: many agents' events into one collector, directly and through one relay.

The agents are the event plane only: each is transport's `EventPublisher` (its PUB, its snapshot ROUTER,
real `EventBatch` envelopes with seqs, a state mirror for snapshots) registered with a bootstrap service,
fed room lifecycles (state changes, progress, transfers done, 1 % failures) and a heartbeat a second, at
`rate` events/s each. They run in a few processes for the whole bench. Each leg starts one collector (kvtop's
`Collector` on a `ClusterModel`, as `kvtop top` runs it) in this process, on the running cluster: its
start to synced is a late joiner's snapshot sync time. After a warm-up, a window measures events applied
vs events the agents emitted, gaps, the collector's CPU, RSS and open files (the relay's CPU too). Legs
alternate (direct, relay, direct, ...); figures are medians.

The relay leg runs `kvtop relay --bootstrap ADDR` as a user does, and the collector is given its address.
`LEGS` names the configurations measured. With `curve`, `CURVE_LEGS` run too, on a second cluster whose
publishers and bootstrap serve CURVE with fresh keys, and the relay (`--curve-keys DIR`) and the collector
dial with them; only the cluster of the leg being measured emits (the other is paused), so every leg runs
on the same load.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

import psutil
import zmq

from kvtop.bench import BenchFailed
from kvtop.bench.watch import CountingModel
from kvtop.sources.live import Collector
from transport.bootstrap import BootstrapClient, BootstrapServer
from transport.curve import CurveKeys, generate, stop_authenticator
from transport.events import (
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
from transport.kvpoll import KVPoll
from transport.publisher import EventPublisher
from transport.relay import MAX_SOCKETS, raise_open_files
from transport.version import __version__
from transport.wire import AgentInfo, replace_fields

TP = 8
_TICK_S = 0.01
_START_TIMEOUT_S = 120.0
_SYNC_TIMEOUT_S = 60.0
_FAILED = 0.01


@dataclass(frozen=True)
class Leg:
    """One configuration measured: `relay` puts one `kvtop relay` between the agents and the collector;
    `curve`: every socket of the leg (agents, bootstrap, relay, collector) with CURVE."""

    name: str
    relay: bool
    curve: bool = False


LEGS = (Leg("direct", relay=False), Leg("relay", relay=True))
CURVE_LEGS = (Leg("direct_curve", relay=False, curve=True), Leg("relay_curve", relay=True, curve=True))


@dataclass(frozen=True)
class Run:
    """One leg's window."""

    offered_events_per_s: float
    """Events the agents emitted per second (heartbeats included)."""
    events_per_s: float
    """Events the collector's model applied per second."""
    gaps: int
    """Batches lost in the window, counted per (agent, incarnation) by the collector."""
    sync_s: float
    """Collector start to synced: every agent's snapshot applied, or its request timed out (a late joiner on the
    running cluster); `snapshots_missed` says how many timed out."""
    snapshots_missed: int
    agents_heard: int
    """Agents the collector had heard from before the window (all of them, unless it fell behind)."""
    behind_s: float
    """At the window's end: now minus the send time of the newest batch applied (how far behind it runs)."""
    stale_batches: int
    """Batches, since the collector started, that arrived older than the snapshot they follow (skipped)."""
    collector_cpu_cores: float
    collector_rss_mib: float
    collector_open_files: int
    relay_cpu_cores: float | None


@dataclass(frozen=True)
class LegResult:
    """Medians over a leg's runs."""

    agents: int
    offered_events_per_s: float
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
    collector_rss_mib: float
    collector_open_files: int
    relay_cpu_cores: float | None
    events_per_collector_cpu_s: float
    """Events applied per CPU second of the collector's process: what one core would apply, on any machine."""
    target_met: bool
    """At least 0.95 of the offered events applied, and no gap (DESIGN.md's fan-in target)."""
    runs: int


def _room_events(rng: random.Random, label: str, ts: float) -> list[Event]:
    """One room's life on a decode rank, as the engine emits it."""
    room = rng.getrandbits(63)
    total = 1 << 20
    events: list[Event] = [
        RoomState(ts, room, int(KVPoll.WaitingForInput), int(KVPoll.Bootstrapping), "prefill-0", total),
        RoomState(ts, room, int(KVPoll.Transferring), int(KVPoll.WaitingForInput), "prefill-0", total),
        Progress(ts, room, total // 2, total),
    ]
    if rng.random() < _FAILED:
        events.append(Failure(ts, room, label, "KV chunk failed its checksum", "checksum", "error", False, label))
        events.append(RoomState(ts, room, int(KVPoll.Failed), int(KVPoll.Transferring), "prefill-0", total))
    else:
        events.append(RoomState(ts, room, int(KVPoll.Success), int(KVPoll.Transferring), "prefill-0", total))
        events.append(TransferDone(ts, room, total, 0.01, "prefill-0"))
    return events


class FaninModel(CountingModel):
    """Counts applied events, and keeps the send time of the newest batch applied (how far behind it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.newest_sent_at = 0.0

    def apply(self, label: str, item: Snapshot | EventBatch, now: float) -> list[Event]:
        if isinstance(item, EventBatch) and item.sent_at > self.newest_sent_at:
            self.newest_sent_at = item.sent_at
        return super().apply(label, item, now)


class _Agent:
    """One agent's event plane: a started publisher, and the room whose events come next."""

    def __init__(self, index: int, rng: random.Random, curve: CurveKeys | None) -> None:
        info = AgentInfo(
            "decode", f"decode-{index // TP}", index % TP, TP, 4096, "", "", os.getpid(), "localhost",
            rng.getrandbits(63),
        )  # fmt: skip
        self.publisher = EventPublisher(info, curve=curve)
        self.publisher.info = replace_fields(
            info, event_endpoint=self.publisher.endpoint, snapshot_endpoint=self.publisher.snapshot_endpoint
        )
        self.publisher.start()
        self.emitted = 0
        self.pending: list[Event] = []
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
        for _ in range(count):
            if not self.pending:
                self.pending = _room_events(self.rng, self.info.label, ts)
                self.pending.reverse()
            publisher.emit(self.pending.pop())
        self.emitted += count + heartbeat


def _agents_process(first: int, count: int, rate: float, bootstrap: str, curve_keys: str, conn: Connection) -> None:
    """Run agents `first`..`first+count-1` until told to stop; answer "counts" with (emitted, dropped);
    "pause" stops emitting until "resume"; `curve_keys`: the folder every socket serves CURVE with ("": none)."""
    raise_open_files()
    zmq.Context.instance().set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    curve = CurveKeys.load(curve_keys, serve=True) if curve_keys else None
    rng = random.Random(first)
    agents = [_Agent(first + i, rng, curve) for i in range(count)]
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
                conn.send((emitted, sum(agent.publisher.dropped for agent in agents)))
            if paused:
                continue
            now = time.monotonic()
            owed = int(rate * (now - started))
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
            process = context.Process(
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

    def pause(self, paused: bool) -> None:
        """Stop (or start again) emitting: only the cluster a leg measures loads the machine."""
        for _, conn in self._workers:
            conn.send("pause" if paused else "resume")

    def emitted(self) -> int:
        """Events every agent emitted so far (each process asked in turn)."""
        for _, conn in self._workers:
            conn.send("counts")
        total = 0
        for process, conn in self._workers:
            if not conn.poll(30.0):
                raise BenchFailed(f"agent process {process.name} stopped answering")
            emitted, _ = conn.recv()
            total += emitted
        return total

    def stop(self) -> None:
        for process, conn in self._workers:
            if process.is_alive():
                conn.send("stop")
        for process, _ in self._workers:
            process.join(10.0)
            if process.is_alive():
                process.kill()
                process.join()


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
    collector = Collector(address, model=model, curve=curve)
    try:
        started = time.monotonic()
        collector.start(discover_timeout_s=10.0)
        if not collector.wait_synced(_SYNC_TIMEOUT_S):
            raise BenchFailed(f"{leg.name}: the collector did not sync within {_SYNC_TIMEOUT_S:g} s")
        sync_s = time.monotonic() - started
        heard = _wait_heard(collector, model, count)
        if not heard:
            raise BenchFailed(f"{leg.name}: the collector heard none of {count} agents in {_SYNC_TIMEOUT_S:g} s")
        time.sleep(warmup_s)
        relay_process = psutil.Process(relay.pid) if relay is not None else None
        cpu0, relay_cpu0 = _cpu(me), _cpu(relay_process)
        with collector.lock:
            applied0, gaps0 = model.events_applied, model.gaps
        emitted0, t0 = agents.emitted(), time.monotonic()
        time.sleep(window_s)
        emitted1, t1 = agents.emitted(), time.monotonic()
        with collector.lock:
            applied1, gaps1 = model.events_applied, model.gaps
            behind_s = time.time() - model.newest_sent_at
            stale = model.intake.counters.get("stale_batches", 0)
        cpu1, relay_cpu1 = _cpu(me), _cpu(relay_process)
        seconds = t1 - t0
        with collector.lock:
            missed = model.intake.counters.get("snapshots_missed", 0)
        run = Run(
            offered_events_per_s=(emitted1 - emitted0) / seconds,
            events_per_s=(applied1 - applied0) / seconds,
            gaps=gaps1 - gaps0,
            sync_s=sync_s,
            snapshots_missed=missed,
            agents_heard=heard,
            behind_s=behind_s,
            stale_batches=stale,
            collector_cpu_cores=(cpu1 - cpu0) / seconds,
            collector_rss_mib=me.memory_info().rss / 2**20,
            collector_open_files=me.num_fds(),
            relay_cpu_cores=(relay_cpu1 - relay_cpu0) / seconds if relay_process is not None else None,
        )
    finally:
        collector.close()
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
        raise BenchFailed(f"{leg.name}: no event batch reached the collector in the window")
    return run


def _wait_heard(collector: Collector, model: FaninModel, count: int) -> int:
    """Wait until every agent was heard (a snapshot or a batch applied); how many were."""
    deadline = time.monotonic() + _SYNC_TIMEOUT_S
    while True:
        with collector.lock:
            heard = sum(1 for view in model.ranks.values() if view.last_seen)
        if heard >= count or time.monotonic() > deadline:
            return heard
        time.sleep(0.1)


def _cpu(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def _median(runs: list[Run], count: int) -> LegResult:
    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    offered = med([r.offered_events_per_s for r in runs])
    applied = med([r.events_per_s for r in runs])
    relay_cpu = [r.relay_cpu_cores for r in runs if r.relay_cpu_cores is not None]
    return LegResult(
        agents=count,
        offered_events_per_s=round(offered, 1),
        events_per_s=round(applied, 1),
        applied_ratio=round(applied / offered, 4) if offered else 0.0,
        gaps=max(r.gaps for r in runs),
        sync_s=round(med([r.sync_s for r in runs]), 3),
        snapshots_missed=max(r.snapshots_missed for r in runs),
        agents_heard=min(r.agents_heard for r in runs),
        behind_s=round(med([r.behind_s for r in runs]), 2),
        stale_batches=max(r.stale_batches for r in runs),
        collector_cpu_cores=round(med([r.collector_cpu_cores for r in runs]), 3),
        collector_rss_mib=round(med([r.collector_rss_mib for r in runs]), 1),
        collector_open_files=max(r.collector_open_files for r in runs),
        relay_cpu_cores=round(med(relay_cpu), 3) if relay_cpu else None,
        events_per_collector_cpu_s=round(med([r.events_per_s / max(r.collector_cpu_cores, 1e-9) for r in runs])),
        target_met=bool(offered)
        and applied / offered >= 0.95
        and max(r.gaps for r in runs) == 0
        and min(r.agents_heard for r in runs) == count,
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
    open_files = raise_open_files()
    zmq.Context.instance().set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # before this process opens any socket
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
            bootstraps[on] = BootstrapServer(entry_ttl_s=3600.0, curve=secure if on else None).start()
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
    medians = {leg.name: asdict(_median(runs[leg.name], agents)) for leg in legs}
    result: dict[str, object] = dict(medians)
    direct, relayed = medians.get("direct"), medians.get("relay")
    if direct is not None and relayed is not None and direct["events_per_s"]:
        result["relay_vs_direct"] = round(relayed["events_per_s"] / direct["events_per_s"], 4)
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
    return result
