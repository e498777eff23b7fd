"""One-shot reads of a live cluster: every agent's snapshot, plus what it publishes meanwhile."""

from __future__ import annotations

import time

from kvtop.fold import Observed
from transport.bootstrap import BootstrapClient
from transport.events import EventBatch, Failure, Snapshot
from transport.subscriber import EventSubscriber


def observed(failure: Failure, role: str) -> Observed:
    """A failure event as the fold sees it."""
    return Observed(
        failure.ts,
        failure.room,
        failure.rank,
        role,
        failure.reason,
        failure.reason_class,
        failure.origin,
        failure.level,
    )


def recent_failures(bootstrap: str, wait_s: float) -> tuple[list[Observed], int]:
    """Failures the agents listed by `bootstrap` remember (their snapshots), plus those published while
    waiting for every snapshot (at most `wait_s`). Returns them and how many agents answered."""
    with BootstrapClient(bootstrap, timeout_s=wait_s) as client:
        agents = client.list_agents()
    roles = {agent.label: agent.role for agent in agents}
    subscriber = EventSubscriber()
    failures: list[Observed] = []
    answered: set[str] = set()
    try:
        for agent in agents:
            subscriber.connect(agent)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not subscriber.synced():
            for delivered in subscriber.poll(0.05):
                item = delivered.item
                role = roles.get(delivered.label, "")
                if isinstance(item, Snapshot):
                    answered.add(delivered.label)
                    failures.extend(observed(f, role) for f in item.failures)
                elif isinstance(item, EventBatch):
                    failures.extend(observed(e, role) for e in item.events if isinstance(e, Failure))
    finally:
        subscriber.close()
    return failures, len(answered)
