"""Parsed batch lines as the events a live agent would send (failure lines: `infer.to_failure`)."""

from __future__ import annotations

from kvtop.sources.sglang.lines import BatchLine
from transport.plane.events import Heartbeat


def to_heartbeat(line: BatchLine, ts: float) -> Heartbeat:
    """A batch line as the heartbeat a live agent would send: queue depths as counters, in-flight rooms."""
    inflight = line.queues.get("queue_inflight", line.queues.get("queue_transfer", 0))
    return Heartbeat(ts, dict(line.queues), inflight, 0, 0.0, 0, 0.0)
