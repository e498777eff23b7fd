"""Watches the ranks of a local cluster: reports each exit at once, restarts the rank when asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transport.harness.cluster import AgentProcess, LocalCluster
from transport.harness.workload import Router
from transport.wire import AgentInfo

RESTART_AFTER_S = 1.0
"""A rank that exited starts again this long after, so one that dies at once does not spin."""
CHECK_EVERY_S = 0.05
"""How often the ranks are looked at: an exit is reported within this long."""
STDERR_TAIL_LINES = 5
"""Lines of a lost rank's stderr said when its log folder is temporary (removed on exit: a path would lead nowhere)."""


def exit_said(agent: AgentProcess, kept: bool) -> str:
    """`rank decode-1/TP0 (pid 4242) killed by SIGKILL; stderr in PATH` when its log folder is `kept`, else its
    stderr's last lines (the temporary folder is removed on exit, its path with it)."""
    said = f"rank {agent.label} (pid {agent.process.pid}) {agent.describe_exit()}"
    if not agent.stderr_path:
        return said
    if kept:
        return f"{said}; stderr in {agent.stderr_path}"
    try:
        tail = Path(agent.stderr_path).read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
    except OSError:
        tail = []
    return f"{said}; its stderr ended: " + " | ".join(tail) if tail else f"{said}; its stderr was empty"


class Supervisor:
    """Call `check(now)` often: exits go to `report` (label, pid, exit code or signal, and its stderr: `exit_said`;
    `kept`: the log folder outlives the cluster) and to the router."""

    def __init__(
        self, cluster: LocalCluster, router: Router, report: Callable[[str], None], restart: bool, kept: bool
    ) -> None:
        self.cluster = cluster
        self.kept = kept
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
            then = f"; restarting in {RESTART_AFTER_S:g} s" if self.restart else ""
            self.report(f"{exit_said(agent, self.kept)}{then}")
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
