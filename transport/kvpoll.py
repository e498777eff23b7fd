"""The per-room transfer state, with SGLang's `KVPoll` values and its one rule.

States only move forward; `Failed` (0) wins over everything; nothing leaves a
terminal state (`Failed` or `Success`).
"""

from __future__ import annotations

from enum import IntEnum

TERMINAL = frozenset((0, 4))
"""`Failed` and `Success` as plain ints (the hot loops of the publisher's mirror and the model test ints)."""
LOST_AFTER_S = 300.0
"""A live room with no news (state or progress) for this long is lost: its terminal state was dropped on the
way. A few minutes past the agents' default transfer timeout (60 s), after which every live room has ended."""
LOST_SWEEP_EVERY_S = 5.0
"""Finding lost rooms walks every live room: every few seconds, not on every sweep."""


class KVPoll(IntEnum):
    """A room's state as polled by the scheduler (values as in SGLang)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4

    @property
    def is_terminal(self) -> bool:
        """True for `Failed` and `Success`: the room will not change again."""
        return self._value_ in TERMINAL  # the plain ints: naming the members costs ~150 ns a call


def advance(current: KVPoll, proposed: KVPoll) -> KVPoll:
    """The state after `proposed` is offered to a room in state `current`.

    Failed wins over any live state, later states replace earlier ones, and a
    terminal state never changes.
    """
    if current.is_terminal:
        return current
    if proposed is KVPoll.Failed:
        return KVPoll.Failed
    return max(current, proposed)
