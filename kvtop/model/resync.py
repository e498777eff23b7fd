"""A snapshot asked again after a gap: what of it the model does not hold yet.

The subscriber asks an agent's snapshot again when batches of it went missing (transport.plane.subscriber), so a
view through a relay that dropped the agent for a while, or one that fell behind, ends up with what a view
that lost nothing has. That snapshot restates the agent's recent history, most of which the model applied
from batches already: its live rooms and their progress are states (applied again, nothing changes), but
finished rooms, failures, transfers and context lines would count twice. Each is kept only where the model
lacks it, and not where the model may have let it go already (older than the oldest it still keeps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtop.model.taken import as_heard
from transport.plane.events import Event, Failure, LogContext, RoomState, Snapshot, TransferDone

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.model.shapes import RankView

FailureKey = tuple[float, int, str, str]


def failure_key(ts: float, room: int, rank: str, reason: str) -> FailureKey:
    """What tells one failure from another: when, which room, which rank, why."""
    return (ts, room, rank, reason)


def unheld(model: ClusterModel, view: RankView, snapshot: Snapshot) -> list[Event]:
    """The events of `snapshot`, of an agent the model heard from in this incarnation, that it does not hold
    yet (its state in full, its history where the model lacks it), in the order a first snapshot applies."""
    events: list[Event] = [event for event in (snapshot.hello, snapshot.heartbeat) if event is not None]
    events += _unheld_rooms(model, snapshot.finished_rooms)
    events += [*snapshot.live_rooms, *snapshot.progress]
    events += _unheld_failures(model, view.label, snapshot.failures)
    events += _unheld_transfers(view, snapshot.transfers)
    events += _unheld_context(model, view.label, snapshot.context)
    return events


def _unheld_rooms(model: ClusterModel, finished: Sequence[RoomState]) -> list[RoomState]:
    """Finished rooms' states, but those of rooms the model knows nothing of and may have let go (a room it
    holds, open or retired, takes a state it has again as it is)."""
    kept = model.retired_kept_since()
    return [
        state for state in finished if state.room in model.rooms or state.room in model.finished or state.ts >= kept
    ]


def _unheld_failures(model: ClusterModel, label: str, failures: Sequence[Failure]) -> list[Failure]:
    """`label`: whose snapshot (a rank heard as taken keeps its failures under that label: kvtop.model.taken)."""
    held = model.failure_keys()
    kept = model.failures[0].ts if len(model.failures) == model.failures.maxlen else 0.0
    return [
        failure
        for failure in failures
        if failure.ts >= kept
        and failure_key(failure.ts, failure.room, as_heard(failure.rank, label, model.ranks), failure.reason)
        not in held
    ]


def _unheld_transfers(view: RankView, transfers: Sequence[TransferDone]) -> list[TransferDone]:
    if not transfers:
        return []
    times = view.transfers.window(0.0)[:, 0]
    held = set(times.tolist())
    kept = float(times.min()) if view.transfers.full else 0.0
    return [transfer for transfer in transfers if transfer.ts >= kept and transfer.ts not in held]


def _unheld_context(model: ClusterModel, label: str, context: Sequence[LogContext]) -> list[LogContext]:
    if not context:
        return []
    held = {line for owner, line in model.context if owner == label}
    kept = model.context[0][1].ts if len(model.context) == model.context.maxlen else 0.0
    return [line for line in context if line.ts >= kept and line not in held]
