"""Fault injection: which rooms of an agent get which fault.

A spec reads `KIND[:RATE][@PEER]`, e.g. `corrupt:0.05`, `stall`, `die:0.01`,
`drop:1@decode-1`. RATE is the probability per room (default 1); PEER limits
the fault to links whose peer is that instance (`decode-1`) or that rank
(`decode-1/TP0`). Every fault makes the real code path fail; none fabricates
an event.

- drop:    the sender skips one chunk of the room (the receiver times out in Transferring)
- delay:   each chunk of the room waits `delay_s` before it is sent
- corrupt: one chunk's bytes are altered after checksumming (the receiver's checksum fails)
- refuse:  the prefill rank refuses the decode's transfer request
- stall:   the sender stops after half of the room's chunks (nobody says why)
- die:     the process kills itself with SIGKILL while sending or landing the room

Only `die` acts on a decode rank; the others are the sender's and act on prefill
ranks (`ROLE_KINDS`); a fault given to a role that cannot act on it is refused.
A room's decision holds until the room ends (`forget`), however many rooms
start meanwhile.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from transport.config import Role
from transport.errors import ConfigError


class FaultKind(StrEnum):
    DROP = "drop"
    DELAY = "delay"
    CORRUPT = "corrupt"
    REFUSE = "refuse"
    STALL = "stall"
    DIE = "die"


ROLE_KINDS: dict[Role, frozenset[FaultKind]] = {
    Role.PREFILL: frozenset(FaultKind),
    Role.DECODE: frozenset({FaultKind.DIE}),
}
"""The fault kinds each role acts on: a decode rank sends no chunks, so it can only die."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One kind of fault, its rate per room, and an optional peer filter."""

    kind: FaultKind
    rate: float = 1.0
    peer: str = ""

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Read `KIND[:RATE][@PEER]`; raises `ConfigError` with the accepted forms."""
        body, _, peer = text.partition("@")
        kind_text, _, rate_text = body.partition(":")
        try:
            kind = FaultKind(kind_text.strip().lower())
        except ValueError:
            kinds = ", ".join(k.value for k in FaultKind)
            raise ConfigError(f"unknown fault kind {kind_text!r} in {text!r}; kinds: {kinds}") from None
        try:
            rate = float(rate_text) if rate_text else 1.0
        except ValueError:
            raise ConfigError(f"fault rate {rate_text!r} in {text!r} is not a number") from None
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"fault rate {rate} in {text!r} is outside [0, 1]")
        return cls(kind=kind, rate=rate, peer=peer.strip())

    def __str__(self) -> str:
        return f"{self.kind}:{self.rate:g}" + (f"@{self.peer}" if self.peer else "")

    def hits_peer(self, peer: str) -> bool:
        """Whether this fault applies on the link to `peer` (a rank label such as `decode-1/TP0`)."""
        return not self.peer or self.peer in (peer, peer.partition("/")[0])


def check_role(specs: tuple[FaultSpec, ...], role: Role) -> None:
    """Raise `ConfigError` for a fault that a rank of `role` cannot act on."""
    for spec in specs:
        if spec.kind not in ROLE_KINDS[role]:
            kinds = ", ".join(sorted(ROLE_KINDS[role]))
            raise ConfigError(
                f"fault {spec} cannot act on a {role} rank: it acts only on {kinds} (the others act on the sender)"
            )


class FaultInjector:
    """Decides once per (room, peer) which configured fault, if any, hits it, until the room ends.

    Used by one thread (the engine's). Memory is bounded by the live rooms: the engine calls
    `forget` when a room is released, swept or expires.
    """

    def __init__(self, specs: tuple[FaultSpec, ...] = (), seed: int | None = None, delay_s: float = 0.2) -> None:
        self.specs = specs
        self.delay_s = delay_s
        self._rng = random.Random(seed)
        self._decided: dict[int, dict[str, FaultKind | None]] = {}

    def __bool__(self) -> bool:
        return bool(self.specs)

    @property
    def rooms_decided(self) -> int:
        """How many rooms hold a decision now (the live rooms that asked)."""
        return len(self._decided)

    def pick(self, room: int, peer: str = "") -> FaultKind | None:
        """The fault for this room on the link to `peer` (the same answer every time until `forget`)."""
        if not self.specs:
            return None
        decided = self._decided.setdefault(room, {})
        if peer not in decided:
            decided[peer] = next(
                (spec.kind for spec in self.specs if spec.hits_peer(peer) and self._rng.random() < spec.rate), None
            )
        return decided[peer]

    def forget(self, room: int) -> None:
        """The room ended: drop its decisions (a later room with the same id draws afresh)."""
        self._decided.pop(room, None)
