"""Watches the ranks of a local cluster: reports each exit at once, restarts the rank when asked."""

from __future__ import annotations

from collections.abc import Callable

from transport.harness.cluster import AgentProcess, LocalCluster
from transport.harness.workload import Router
from transport.wire import AgentInfo

RESTART_AFTER_S = 1.0
"""A rank that exited starts again this long after, so one that dies at once does not spin."""
CHECK_EVERY_S = 0.05
"""How often the ranks are looked at: an exit is reported within this long."""


class Supervisor:
    """Call `check(now)` often: exits go to `report` (label, pid, exit code or signal) and to the router."""

    def __init__(self, cluster: LocalCluster, router: Router, report: Callable[[str], None], restart: bool) -> None:
        self.cluster = cluster
        self.router = router
        self.report = report
        self.restart = restart
        self._due: dict[str, float] = {}
        """Exited ranks and when to start them again."""
        self._starting: dict[str, AgentProcess] = {}
        """Restarted ranks not registered yet."""
        self._settling: dict[str, tuple[float, AgentInfo]] = {}
        """Registered again; rooms go to them from then on. Their siblings notice the old process
        gone, and connect to the new one, only once its votes are overdue (the peer timeout)."""
        self._next_check = 0.0

    def check(self, now: float) -> None:
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        for agent in self.cluster.exits():
            self._starting.pop(agent.label, None)
            self._settling.pop(agent.label, None)
            where = f"; stderr in {agent.stderr_path}" if agent.stderr_path else ""
            then = f"; restarting in {RESTART_AFTER_S:g} s" if self.restart else ""
            self.report(f"rank {agent.label} (pid {agent.process.pid}) {agent.describe_exit()}{where}{then}")
            self.router.rank_lost(agent.label)
            if self.restart:
                self._due[agent.label] = now + RESTART_AFTER_S
        for label, due in list(self._due.items()):
            if now >= due:
                del self._due[label]
                self._starting[label] = self.cluster.restart(label)
        for label, agent in list(self._starting.items()):
            info = self.cluster.registered(agent)
            if info is not None:
                del self._starting[label]
                settle_s = self.cluster.spec.transfer.peer_timeout_s
                self._settling[label] = (now + settle_s, info)
                self.report(
                    f"rank {label} is back: pid {agent.process.pid}, restart {agent.restarts}; "
                    f"rooms again in {settle_s:g} s"
                )
        for label, (due, info) in list(self._settling.items()):
            if now >= due:
                del self._settling[label]
                self.router.rank_back(info)
