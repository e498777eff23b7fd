"""The ops of a recording: what the collector did to its model, in order, as typed msgspec records.

Replaying them in order into a model (`apply_op`) rebuilds the model the collector held, exactly: the
deliveries (an agent's snapshot or event batch, as the subscriber delivered it, with its arrival time;
the batch's envelope carries the agent's identity, incarnation and seq), the sweeps, the ranks the
bootstrap service listed, and the collector's own account of what it refused (`Intake`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Refused
from transport.plane.events import MAX_TS, Event, EventBatch, Snapshot
from transport.wire import AgentInfo

Time = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TS)]


class Delivered(msgspec.Struct, tag="d", array_like=True, frozen=True):
    """A delivery applied at `now` (the collector's wall clock when it arrived)."""

    now: Time
    label: str
    item: Snapshot | EventBatch
    refused: int = 0
    """Records of the frame the collector refused and left out of `item` (`Delivered.refused` of the
    subscriber): the model's rejected events count them."""


class Swept(msgspec.Struct, tag="s", array_like=True, frozen=True):
    now: Time
    held: bool = False
    """The sweep left the incidents alone (the collector before every snapshot was in)."""


class Registered(msgspec.Struct, tag="r", array_like=True, frozen=True):
    """A rank the bootstrap service listed (`ClusterModel.register`)."""

    now: Time
    agent: AgentInfo


class Expected(msgspec.Struct, tag="e", array_like=True, frozen=True):
    """An endpoint given by the operator, a rank until an agent answers there (`ClusterModel.expect`)."""

    now: Time
    label: str


class Forgot(msgspec.Struct, tag="f", array_like=True, frozen=True):
    """An expected endpoint answered as the rank it named (`ClusterModel.forget_expected`)."""

    now: Time
    label: str


class Accounted(msgspec.Struct, tag="a", array_like=True, frozen=True):
    """The collector's account as it changed: its counters, what it refused, gaps, rejected frames."""

    now: Time
    counters: dict[str, int]
    bad_entries: dict[str, str]
    bootstrap_counters: dict[str, int]
    bootstrap_refused: list[str]
    gaps: int
    rejected_frames: int
    error: str = ""
    unreachable: dict[str, str] = {}
    """Ranks, endpoints and relays the collector could not open a socket for (`Intake.unreachable`)."""
    upstream_relay: str = ""
    upstream_errors: list[str] = []
    upstream_kept: list[str] = []
    """What the relay the collector subscribed through said of its upstreams that stopped answering it
    (`Intake.upstream_relay`, `upstream_errors`, `upstream_kept`; none in recordings older than them)."""
    bootstrap_refusals: list[tuple[str, str, float]] = []
    """`bootstrap_refused`'s lines with their role and time (`Intake.bootstrap_refusals`; none in recordings older
    than them: a check on those names no refusal)."""
    bootstrap_replaced: list[str] = []
    """`Intake.bootstrap_replaced`, the service's latest named new incarnations (recordings older than it kept only
    their count: `status --replay` said `N entries taken by a new incarnation`, naming none)."""
    records_refused: dict[str, tuple[int, str]] = {}
    """`Intake.records_refused` (none in recordings older than it)."""


class Gapped(msgspec.Struct, tag="g", array_like=True, frozen=True):
    """The subscriber found `batches` event batches of one agent incarnation missing (the live `Lost` news)."""

    now: Time
    label: str
    incarnation: int
    batches: int


class Dropped(msgspec.Struct, tag="x", array_like=True, frozen=True):
    """The recorder lost `ops` ops here (its queue was full): the replay is inexact until the next keyframe."""

    now: Time
    ops: int


Op = Delivered | Swept | Registered | Expected | Forgot | Accounted | Gapped | Dropped


class Mark(msgspec.Struct, array_like=True, frozen=True):
    """A failure origin (a rank's own failure, not one it learnt of), for jump-to-origin."""

    ts: Time
    """The failure's own time (the agent's clock)."""
    arrived: Time
    """When the collector applied it: the replay time at which the model first shows it."""
    room: int
    rank: str
    reason_class: str


OPS_DECODER = msgspec.msgpack.Decoder(list[Op])
MARKS_DECODER = msgspec.msgpack.Decoder(list[Mark])


def op_time(op: Op) -> float:
    return op.now


def apply_op(model: ClusterModel, op: Op) -> list[Event] | None:
    """Apply one op as the collector did; returns the events a delivery's model accepted (None otherwise).

    A delivery the model cannot apply raises as it did live (the caller counts it, as the collector did)."""
    if type(op) is Delivered:
        model.rejected += op.refused
        return model.apply(op.label, op.item, op.now)
    if type(op) is Swept:
        model.sweep(op.now, op.held)
    elif type(op) is Accounted:
        intake = model.intake
        intake.counters, intake.bad_entries = op.counters, op.bad_entries
        intake.bootstrap_counters, intake.bootstrap_refused = op.bootstrap_counters, op.bootstrap_refused
        intake.error, intake.unreachable = op.error, op.unreachable
        intake.upstream_relay, intake.upstream_errors = op.upstream_relay, op.upstream_errors
        intake.upstream_kept = op.upstream_kept
        intake.bootstrap_refusals = [Refused(line, role, at) for line, role, at in op.bootstrap_refusals]
        intake.bootstrap_replaced = op.bootstrap_replaced
        intake.records_refused = op.records_refused
        model.gaps, model.rejected_frames = op.gaps, op.rejected_frames
    elif type(op) is Registered:
        model.register(op.agent)
    elif type(op) is Expected:
        model.expect(op.label)
    elif type(op) is Forgot:
        model.forget_expected(op.label)
    return None
