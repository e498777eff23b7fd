"""What the collector could not take in, kept beside the model so every view can show it."""

from __future__ import annotations

from dataclasses import dataclass, field

REFUSAL_RECENT_S = 60.0
"""A refusal older than this is not said to explain a rank missing now (`status` still lists it, with its age)."""


@dataclass(frozen=True)
class Refused:
    """A registration the bootstrap service refused (`AgentList.refusals`), as this collector learned it."""

    line: str
    """`name: why (from CLIENT...)`."""
    role: str
    """The refused rank's role ("" unknown)."""
    at: float
    """When it was refused, on this machine's clock (the listing's receipt less the age the service gave)."""


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
    records_refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Ranks (labels) some of whose records failed their schema -> (how many, why the latest did): each left out
    of its batch or snapshot, whose other records were kept (`records_rejected` counts them all)."""
    bootstrap_counters: dict[str, int] = field(default_factory=dict)
    """The bootstrap service's counters (requests, expired, deregistered, `rejected_<reason>`)."""
    bootstrap_refused: list[str] = field(default_factory=list)
    """The service's latest refused registrations, `name: why`."""
    bootstrap_refusals: list[Refused] = field(default_factory=list)
    """`bootstrap_refused`'s lines with their role and time, where the service said them (none from a relay, or
    from a service that predates them)."""
    bootstrap_replaced: list[str] = field(default_factory=list)
    """The service's latest new incarnations that took a rank's entry, `name: incarnation A replaced by B ...`."""
    error: str = ""
    """Why the collector stopped, if it did (it never should: this is loud, never silence)."""
    upstream_relay: str = ""
    """The relay whose listing named `upstream_errors` ("" when none did)."""
    upstream_errors: list[str] = field(default_factory=list)
    """That relay's upstreams that stopped answering it (`AgentList.upstream_errors`), as its latest listing says."""
    upstream_kept: list[str] = field(default_factory=list)
    """The ranks it lists from the last answer of such an upstream (`AgentList.kept`): silent because of it, maybe
    alive (the views say `unheard`, not gone)."""

    def refusals_since(self, since: float, now: float) -> list[Refused]:
        """The refusals the service gave that were refused from `since` to `now` (a second of clock skew allowed
        past it), oldest first."""
        return [refused for refused in self.bootstrap_refusals if since <= refused.at <= now + 1.0]

    def refusal_explaining(self, now: float, within_s: float = REFUSAL_RECENT_S, role: str = "") -> Refused | None:
        """The latest refused registration that can explain a rank missing at `now`: refused in the `within_s`
        before it and, given a `role`, of a rank of that role (None when none can)."""
        for refused in reversed(self.refusals_since(now - within_s, now)):
            if not role or refused.role == role:
                return refused
        return None

    def upstream_down(self) -> str:
        """One line while a relay's upstream does not answer it ("" otherwise)."""
        if not self.upstream_errors:
            return ""
        return f"upstream stopped answering the relay at {self.upstream_relay}: {'; '.join(self.upstream_errors)}"

    def unheard_behind(self) -> frozenset[str]:
        """The ranks a relay keeps from an upstream that does not answer it (none while every upstream answers)."""
        return frozenset(self.upstream_kept) if self.upstream_errors else frozenset()
