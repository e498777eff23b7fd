"""A local cluster on loopback: a bootstrap service and one agent process per rank.

`LocalCluster` owns every process it starts: `stop()` (or leaving the `with`
block) ends them all, SIGTERM first, SIGKILL for any that linger. Agents also
stop by themselves when this process dies, so none is ever orphaned. `exits()`
reports each rank that ended by itself, once; `restart()` starts it again (a new
process, so a new incarnation). Each agent's stderr goes to
`LOG_DIR/<instance>-TP<rank>.stderr` (appended across restarts), or to this
process's stderr when there is no log folder, so a crashing agent's traceback
is kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from transport.bootstrap import BootstrapClient, BootstrapServer
from transport.config import Role, TransferConfig
from transport.curve import CurveKeys, exposure_problem
from transport.errors import ConfigError, TransportError
from transport.harness.agent import AgentOptions, child_args
from transport.harness.targets import plan_faults
from transport.kv.faults import FaultSpec
from transport.signals import held
from transport.wire import AgentInfo

_STOP_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The shape of a local cluster and what every agent gets."""

    prefill: int = 1
    decode: int = 1
    prefill_tp: int = 1
    decode_tp: int = 1
    num_pages: int = 4096
    page_bytes: int = 16 << 10
    """Bytes per page on a rank of TP size 1 (a rank of TP t holds 1/t of it)."""
    transfer: TransferConfig = field(default_factory=TransferConfig)
    faults: dict[str, tuple[FaultSpec, ...]] = field(default_factory=dict)
    """Faults per target: "" (every agent), a role, an instance ("decode-1") or a rank ("prefill-0/TP1");
    see `transport.harness.targets`."""
    log_dir: str = ""
    log_level: str = "INFO"
    curve_keys: str = ""
    """A CURVE key folder (`transport.curve`) for the bootstrap service and every agent; "" for plain TCP."""
    insecure: bool = False
    """Bind a host beyond loopback without CURVE anyway."""
    environment: dict[str, dict[str, str]] = field(default_factory=dict)
    """Environment variables of some agents beyond the cluster's own, by rank label (a test runs one under
    libfaketime to skew its clock)."""

    def ranks(self) -> list[tuple[Role, str, int, int]]:
        """(role, instance, rank, tp) of every agent, prefill first."""
        return [
            (role, f"{role.value}-{index}", rank, tp)
            for role, count, tp in (
                (Role.PREFILL, self.prefill, self.prefill_tp),
                (Role.DECODE, self.decode, self.decode_tp),
            )
            for index in range(count)
            for rank in range(tp)
        ]

    def fault_plan(self) -> dict[str, tuple[FaultSpec, ...]]:
        """The faults of each agent label; raises `ConfigError` for a fault that would reach nobody."""
        return plan_faults([(role, f"{instance}/TP{rank}") for role, instance, rank, _ in self.ranks()], self.faults)


@dataclass(eq=False)
class AgentProcess:
    """One started rank."""

    options: AgentOptions
    process: subprocess.Popen[bytes]
    stderr_path: str = ""
    """Where its stderr goes ("" for this process's stderr)."""
    restarts: int = 0
    reported: bool = False
    """Its exit was returned by `exits()` already."""

    @property
    def label(self) -> str:
        return f"{self.options.instance}/TP{self.options.rank}"

    def describe_exit(self) -> str:
        """How it ended, e.g. `exited with code 1` or `killed by SIGKILL`."""
        code = self.process.returncode
        if code is None:
            return "running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"


class LocalCluster:
    """Start with `start()`, stop with `stop()`; `agents()` lists what registered."""

    def __init__(self, spec: ClusterSpec, host: str = "127.0.0.1") -> None:
        """Raises `ConfigError` (`CurveError`) for a bind beyond loopback without CURVE or a bad key folder."""
        self.spec = spec
        self.host = host
        self._faults = spec.fault_plan()
        problem = exposure_problem([host], bool(spec.curve_keys), spec.insecure)
        if problem:
            raise ConfigError(problem)
        self.curve = CurveKeys.load(spec.curve_keys, serve=True) if spec.curve_keys else None
        """The keys every socket of the cluster uses (None: plain TCP)."""
        self.bootstrap = BootstrapServer(host=host, curve=self.curve)
        self.processes: list[AgentProcess] = []

    @property
    def endpoint(self) -> str:
        """The bootstrap address: the one address that lists every agent."""
        return self.bootstrap.endpoint

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self, ready_timeout_s: float = 30.0) -> LocalCluster:
        """Start every agent and wait until all registered; whatever ends the start early (a timeout, a Ctrl-C)
        stops what it started first (a `with` block's exit never runs when its start raised)."""
        try:
            if self.spec.log_dir:
                Path(self.spec.log_dir).mkdir(parents=True, exist_ok=True)
            self.bootstrap.start()
            for role, instance, rank, tp in self.spec.ranks():
                with held(signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    self.processes.append(self._spawn(self._options(role, instance, rank, tp)))
            self.wait_registered(len(self.processes), ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _options(self, role: Role, instance: str, rank: int, tp: int) -> AgentOptions:
        faults = self._faults.get(f"{instance}/TP{rank}", ())
        log_file = str(Path(self.spec.log_dir) / f"{instance}.log") if self.spec.log_dir else ""
        return AgentOptions(
            role=role,
            instance=instance,
            rank=rank,
            tp=tp,
            bootstrap=self.endpoint,
            num_pages=self.spec.num_pages,
            page_bytes=self.spec.page_bytes // tp,
            host=self.host,
            transfer=self.spec.transfer,
            faults=faults,
            log_file=log_file,
            log_level=self.spec.log_level,
            curve_keys=self.spec.curve_keys,
            insecure=self.spec.insecure,
        )

    def _spawn(self, options: AgentOptions, restarts: int = 0) -> AgentProcess:
        label = f"{options.instance}/TP{options.rank}"
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **self.spec.environment.get(label, {})}
        command = [sys.executable, "-m", "transport.harness.agent", *child_args(options)]
        if not self.spec.log_dir:
            return AgentProcess(options, subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL), "", restarts)
        path = str(Path(self.spec.log_dir) / f"{options.instance}-TP{options.rank}.stderr")
        with open(path, "ab") as stderr:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=stderr)
        return AgentProcess(options, process, path, restarts)

    def agents(self) -> list[AgentInfo]:
        """Every agent registered with the bootstrap service."""
        with BootstrapClient(self.endpoint, curve=self.curve) as client:
            return client.list_agents()

    def wait_registered(self, count: int, timeout_s: float) -> list[AgentInfo]:
        """Block until `count` live agents registered; raises with the missing ones otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = {(a.instance, a.rank, a.pid) for a in self.bootstrap.agents()}
            running = [p for p in self.processes if (p.options.instance, p.options.rank, p.process.pid) in live]
            if len(running) >= count:
                return self.bootstrap.agents()
            dead = [p for p in self.processes if p.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                missing = sorted({p.label for p in self.processes} - {p.label for p in running})
                exited = "; ".join(
                    f"{p.label} {p.describe_exit()}" + (f", see {p.stderr_path}" if p.stderr_path else "") for p in dead
                )
                self.stop()
                raise TransportError(f"agents did not come up: {', '.join(missing)} (exited: {exited or 'none'})")
            time.sleep(0.05)

    def process(self, label: str) -> AgentProcess:
        return next(p for p in self.processes if p.label == label)

    def exits(self) -> list[AgentProcess]:
        """The ranks that ended since the last call (each returned once), so a supervisor can report them."""
        ended = [p for p in self.processes if not p.reported and p.process.poll() is not None]
        for agent in ended:
            agent.reported = True
        return ended

    def restart(self, label: str) -> AgentProcess:
        """Start an exited rank again with the same options: a new process, so a new incarnation."""
        index = next(i for i, p in enumerate(self.processes) if p.label == label)
        old = self.processes[index]
        if old.process.poll() is None:
            raise TransportError(f"{label} (pid {old.process.pid}) is still running")
        with held(signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.processes[index] = self._spawn(old.options, old.restarts + 1)
        return self.processes[index]

    def registered(self, agent: AgentProcess) -> AgentInfo | None:
        """The bootstrap entry of this very process, once it registered."""
        key = (agent.options.instance, agent.options.rank, agent.process.pid)
        return next((a for a in self.bootstrap.agents() if (a.instance, a.rank, a.pid) == key), None)

    def kill(self, label: str) -> None:
        """SIGKILL one rank, as a crash would."""
        process = self.process(label).process
        process.send_signal(signal.SIGKILL)
        process.wait(_STOP_GRACE_S)

    def stop(self) -> None:
        """End every agent (SIGTERM, then SIGKILL after a grace period) and the bootstrap service."""
        for agent in self.processes:
            if agent.process.poll() is None:
                agent.process.terminate()
        deadline = time.monotonic() + _STOP_GRACE_S
        for agent in self.processes:
            try:
                agent.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait()
        self.bootstrap.close()
