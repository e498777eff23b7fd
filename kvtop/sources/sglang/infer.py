"""Origin inference: a failure line becomes a `Failure` event whose origin is itself, or unknown (an echo).

SGLang logs only a boolean "from another rank", so kvtop infers from the
reason text (DOMAIN.md, "How failures propagate"):

- `Failed due to an unknown reason from another rank` is an echo inside its
  instance (`is_from_another_rank`): the fold hangs it under its instance's
  origin;
- decode's `Failed to get kvcache from prefill instance, it might be dead`
  and prefill's `Aborted by decode peer ...` are echoes of the other side's
  origin in the same room;
- `Aborted by AbortReq.` is the rank's own record of a client's abort, on
  either side (DOMAIN.md, the abort origin): an origin of class `aborted`,
  which the fold makes one failure of the room across every rank that
  printed it;
- every other reason is an origin of its own class; the fold still merges
  ranks of one instance that report the same class at about the same time,
  and makes a prefill failure that follows a decode timeout or abort an echo
  of it (`Observed.inferred`).

With nothing to explain an echo, the fold shows it under "origin unknown".
"""

from __future__ import annotations

from kvtop.sources.sglang.lines import FailureLine
from transport.plane.events import Failure, Level
from transport.sglang.reasons import ANOTHER_RANK, reason_class


def to_failure(line: FailureLine, label: str, ts: float) -> Failure | None:
    """The failure event a failure line stands for, with its inferred origin (None: the line has no room)."""
    if line.room is None:
        return None
    name = reason_class(line.reason)
    echo = name == "propagated"
    from_another_rank = echo and line.reason.startswith(ANOTHER_RANK)  # not a rank's own HiCache restore failure
    origin = "" if echo else label
    inferred = Level.DEBUG if echo else Level.WARNING if line.role == "prefill" else Level.ERROR
    level = line.level or str(inferred)  # a line that states its level was logged at it (DOMAIN.md)
    return Failure(ts, line.room, label, line.reason, name, level, from_another_rank, origin)
