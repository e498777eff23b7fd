"""What the collector could not take in, kept beside the model so every view can show it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Intake:
    """The collector's own account (and the bootstrap service's) of what was refused on the way in."""

    counters: dict[str, int] = field(default_factory=dict)
    """The collector's counters: its subscriber's (batches, `rejected_<reason>`, `bad_entries`, ...) and
    `deliveries_failed` (a delivery the model could not apply: counted and logged, never fatal)."""
    bad_entries: dict[str, str] = field(default_factory=dict)
    """Bootstrap entries and endpoints the collector could not use: name -> why."""
    unreachable: dict[str, str] = field(default_factory=dict)
    """Ranks (labels), endpoints and relays the collector could not open a socket for, for now (its own limits:
    too many open files): name -> why. Not the rank's fault; tried again at every discovery."""
    bootstrap_counters: dict[str, int] = field(default_factory=dict)
    """The bootstrap service's counters (requests, expired, deregistered, `rejected_<reason>`)."""
    bootstrap_refused: list[str] = field(default_factory=list)
    """The service's latest refused registrations, `name: why`."""
    error: str = ""
    """Why the collector stopped, if it did (it never should: this is loud, never silence)."""
