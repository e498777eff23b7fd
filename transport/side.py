"""What the engine loop needs from a role's side (prefill or decode)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import zmq

from transport.config import TransferConfig
from transport.counters import Counters
from transport.faults import FaultInjector, FaultKind
from transport.pool import KVPool
from transport.rooms import RoomRecord
from transport.wire import AgentInfo

_Room = TypeVar("_Room", bound=RoomRecord)
RETAIN_FINISHED_S = 60.0
"""Finished rooms nobody released are dropped after this long."""
CLEARED_MEMORY = 10_000
"""How many released room ids are remembered, so late echoes for them are ignored."""


@dataclass(eq=False)
class SideContext:
    """Everything a side shares with its engine: identity, memory, settings, counters."""

    info: AgentInfo
    pool: KVPool
    config: TransferConfig
    faults: FaultInjector
    counters: Counters
    context: zmq.Context[zmq.Socket[bytes]]
    cleared: dict[int, None] = field(default_factory=dict)
    """Recently released rooms (insertion-ordered, bounded)."""

    def remember_cleared(self, room: int) -> None:
        self.cleared[room] = None
        if len(self.cleared) > CLEARED_MEMORY:
            del self.cleared[next(iter(self.cleared))]

    def inject_die(self, fault: FaultKind | None) -> None:
        """The `die` fault: this process ends at once, as a crashed rank would."""
        if fault is FaultKind.DIE:
            self.counters.add("fault_die")
            os.kill(os.getpid(), signal.SIGKILL)


class Side(Protocol):
    """A role's half of the engine; every method runs on the engine thread."""

    socket_generation: int
    """Changes whenever `sockets()` would return a different set."""

    def sockets(self) -> list[zmq.Socket[bytes]]:
        """Sockets the loop polls for input (may change between calls)."""

    def handle(self, sock: zmq.Socket[bytes], now: float) -> None:
        """Read what is waiting on `sock`."""

    def pump(self, now: float) -> float | None:
        """Send what flow control allows; returns when more could go (None: nothing pending)."""

    def tick(self, now: float) -> None:
        """Timeouts, heartbeats, liveness and retention."""

    def release(self, room: int) -> None:
        """Forget a room the scheduler is done with."""

    def close(self) -> None:
        """Close every socket."""


def sweep_finished(rooms: dict[int, _Room], ctx: SideContext, now: float) -> None:
    """Drop finished rooms older than the retention window, remembering their ids."""
    stale = [r for r, rec in rooms.items() if rec.state.is_terminal and now - rec.finished_at > RETAIN_FINISHED_S]
    for room in stale:
        del rooms[room]
        ctx.remember_cleared(room)
