"""A local cluster on loopback: a bootstrap service and one agent process per rank.

`LocalCluster` owns every process it starts: `stop()` (or leaving the `with`
block) ends them all, SIGTERM first, SIGKILL for any that linger. Agents also
stop by themselves when this process dies, so none is ever orphaned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from transport.agent import AgentOptions, to_args
from transport.bootstrap import BootstrapClient, BootstrapServer
from transport.config import Role, TransferConfig
from transport.errors import TransportError
from transport.faults import FaultSpec
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
    """Faults per agent label prefix (e.g. "prefill-0/TP1", "decode-1", "" for every agent)."""
    log_dir: str = ""
    log_level: str = "INFO"


@dataclass(eq=False)
class AgentProcess:
    """One started rank."""

    options: AgentOptions
    process: subprocess.Popen[bytes]

    @property
    def label(self) -> str:
        return f"{self.options.instance}/TP{self.options.rank}"


class LocalCluster:
    """Start with `start()`, stop with `stop()`; `agents()` lists what registered."""

    def __init__(self, spec: ClusterSpec, host: str = "127.0.0.1") -> None:
        self.spec = spec
        self.host = host
        self.bootstrap = BootstrapServer(host=host)
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
        """Start every agent and wait until all registered."""
        self.bootstrap.start()
        for role, count, tp in (
            (Role.PREFILL, self.spec.prefill, self.spec.prefill_tp),
            (Role.DECODE, self.spec.decode, self.spec.decode_tp),
        ):
            for index in range(count):
                for rank in range(tp):
                    self.processes.append(self._spawn(self._options(role, f"{role.value}-{index}", rank, tp)))
        self.wait_registered(len(self.processes), ready_timeout_s)
        return self

    def _options(self, role: Role, instance: str, rank: int, tp: int) -> AgentOptions:
        label = f"{instance}/TP{rank}"
        faults = tuple(spec for prefix, specs in self.spec.faults.items() if label.startswith(prefix) for spec in specs)
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
        )

    def _spawn(self, options: AgentOptions) -> AgentProcess:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "transport.agent", *to_args(options)]
        stderr = subprocess.DEVNULL if options.log_file else None
        return AgentProcess(options, subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=stderr))

    def agents(self) -> list[AgentInfo]:
        """Every agent registered with the bootstrap service."""
        with BootstrapClient(self.endpoint) as client:
            return client.list_agents()

    def wait_registered(self, count: int, timeout_s: float) -> list[AgentInfo]:
        """Block until `count` live agents registered; raises with the missing ones otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = {(a.instance, a.rank, a.pid) for a in self.bootstrap.agents()}
            running = [p for p in self.processes if (p.options.instance, p.options.rank, p.process.pid) in live]
            if len(running) >= count:
                return self.bootstrap.agents()
            dead = [p.label for p in self.processes if p.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                missing = sorted({p.label for p in self.processes} - {p.label for p in running})
                self.stop()
                raise TransportError(
                    f"agents did not come up: {', '.join(missing)} (exited: {', '.join(dead) or 'none'})"
                )
            time.sleep(0.05)

    def process(self, label: str) -> AgentProcess:
        return next(p for p in self.processes if p.label == label)

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
