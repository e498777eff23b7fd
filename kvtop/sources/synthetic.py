"""A synthetic cluster's event batches: deterministic, shaped like real agents' (for `bench ui` and test fixtures).

Every room runs the real state sequence on every rank of its prefill and
decode instance; a few fail the way real ones do (a checksum origin on one
decode rank, echoes on its instance and on the prefill side), a few stay open
and some of those stall.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from transport.kv.reasons import from_another_rank
from transport.kvpoll import KVPoll
from transport.plane.events import (
    EVENT_SCHEMA,
    AgentHello,
    Event,
    EventBatch,
    Failure,
    Heartbeat,
    Progress,
    RoomState,
    TransferDone,
)
from transport.wire import AgentInfo

_FLOW = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring)


@dataclass(frozen=True)
class SyntheticCluster:
    """`prefill` x `decode` instances of `tp` ranks each; rooms `spacing_s` apart from `start`."""

    prefill: int = 2
    decode: int = 2
    tp: int = 2
    start: float = 1_780_000_000.0
    spacing_s: float = 0.01
    failure_rate: float = 0.05
    open_rate: float = 0.02
    stuck_rate: float = 0.3
    """Of the open rooms, the share whose progress stopped long ago."""
    room_bytes: int = 1 << 20
    seed: int = 7

    def labels(self, role: str) -> list[str]:
        count = self.prefill if role == "prefill" else self.decode
        return [f"{role}-{i}/TP{r}" for i in range(count) for r in range(self.tp)]

    def hello(self) -> list[tuple[str, EventBatch]]:
        """Each rank's hello and first heartbeat, as its first batch."""
        batches: list[tuple[str, EventBatch]] = []
        for role in ("prefill", "decode"):
            for label in self.labels(role):
                instance, _, rank = label.rpartition("/TP")
                agent = AgentInfo(role, instance, int(rank), self.tp, 16384, "", "", 1000 + len(batches), "node-0", 1)
                events: list[Event] = [
                    AgentHello(self.start, agent, "synthetic", "", ""),
                    Heartbeat(self.start, {"rooms_done": 0}, 0, 0, 12.5, 200 << 20, 40.0),
                ]
                batches.append((label, _batch(label, 1, self.start, events)))
        return batches

    def rooms(self, count: int, first: int = 0) -> list[tuple[str, EventBatch]]:
        """Batches (one per rank per call) holding every event of rooms `first` .. `first + count`."""
        rng = random.Random(self.seed + first)
        per_rank: dict[str, list[Event]] = {label: [] for role in ("prefill", "decode") for label in self.labels(role)}
        for index in range(first, first + count):
            self._room(rng, index, per_rank)
        ts = self.start + (first + count) * self.spacing_s
        return [(label, _batch(label, 2 + first, ts, events)) for label, events in per_rank.items() if events]

    def _room(self, rng: random.Random, index: int, per_rank: dict[str, list[Event]]) -> None:
        room = rng.getrandbits(62)
        ts = self.start + index * self.spacing_s
        prefill, decode = f"prefill-{rng.randrange(self.prefill)}", f"decode-{rng.randrange(self.decode)}"
        ranks = [(prefill, r, "") for r in range(self.tp)] + [(decode, r, prefill) for r in range(self.tp)]
        fate = rng.random()
        failed = fate < self.failure_rate
        still_open = not failed and fate < self.failure_rate + self.open_rate
        culprit = f"{decode}/TP{rng.randrange(self.tp)}"
        if still_open and rng.random() < self.stuck_rate:
            ts -= 600.0  # it started ten minutes ago and stopped moving
        for instance, rank, peer in ranks:
            label = f"{instance}/TP{rank}"
            events = per_rank[label]
            previous = KVPoll.Bootstrapping
            for step, state in enumerate(_FLOW):
                events.append(RoomState(ts + step * 0.001, room, int(state), int(previous), peer, self.room_bytes))
                previous = state
            if peer:
                done = self.room_bytes if not still_open else self.room_bytes // 3
                events.append(Progress(ts + 0.004, room, done, self.room_bytes))
            if still_open:
                continue
            end = ts + 0.01
            if failed:
                events.append(self._failure(end, room, label, culprit, peer))
                events.append(RoomState(end, room, int(KVPoll.Failed), int(previous), peer, self.room_bytes))
            else:
                events.append(RoomState(end, room, int(KVPoll.Success), int(previous), peer, self.room_bytes))
                events.append(TransferDone(end, room, self.room_bytes, 0.01, peer or decode))

    @staticmethod
    def _failure(ts: float, room: int, label: str, culprit: str, peer: str) -> Failure:
        if label == culprit:  # its prefill peer of the same rank sent the corrupt chunk: the origin names it
            sender = f"{peer}/TP{label.rpartition('/TP')[2]}"
            return Failure(ts, room, label, "KV chunk 3 failed its checksum", "checksum", "error", False, label, sender)
        echo = from_another_rank()
        return Failure(ts + 0.002, room, label, echo.text, str(echo.reason_class), "debug", True, culprit)


def _batch(label: str, seq: int, ts: float, events: list[Event]) -> EventBatch:
    instance, _, rank = label.rpartition("/TP")
    role = instance.rpartition("-")[0]
    return EventBatch(EVENT_SCHEMA, role, instance, int(rank), 1, seq, ts, events)
