"""Errors of the transport package and the closed set of failure reason classes.

Hierarchy::

    TransportError            root of everything transport raises
    ├── KVTransferError       a room failed (SGLang's exception, plus the origin)
    ├── ConfigError           a setting or fault spec that cannot work
    │   └── CurveError        a CURVE key folder that cannot be used, or a libzmq without CURVE
    ├── BootstrapError        the bootstrap service did not answer or refused
    └── FrameRejected         a frame on a socket that does not follow the wire format

`FrameRejected` never escapes a socket loop: loops count it (by `reason`) and
keep serving. The reason strings of failed rooms follow SGLang's wording where
SGLang has one (see DOMAIN.md), so operators recognise them.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonClass(StrEnum):
    """Why a room failed, as a small closed set (safe to count and filter by)."""

    TIMEOUT_BOOTSTRAP = "timeout_bootstrap"
    TIMEOUT_WAITING = "timeout_waiting"
    TIMEOUT_TRANSFER = "timeout_transfer"
    TIMEOUT_CONSENSUS = "timeout_consensus"
    """The ranks of the instance did not all vote on the room in time (one never took it)."""
    PEER_LOST = "peer_lost"
    BOOTSTRAP_ERROR = "bootstrap_error"
    """The decode rank could not reach the prefill instance's bootstrap server (SGLang: `Could not fetch prefill
    parallel info from bootstrap_addr: X`)."""
    SEND_FAILED = "send_failed"
    CHECKSUM = "checksum"
    REFUSED = "refused"
    ABORTED = "aborted"
    PROPAGATED = "propagated"
    OTHER = "other"


class TransportError(Exception):
    """Root of every error the transport package raises."""


class ConfigError(TransportError, ValueError):
    """A setting, page layout or fault spec that cannot work."""


class CurveError(ConfigError):
    """CURVE cannot be used: a key folder missing, open to others or holding a malformed key; no CURVE in libzmq."""


class BootstrapError(TransportError):
    """The bootstrap service did not answer in time or refused a request."""


class RegistrationRefused(BootstrapError):
    """The bootstrap service answered, refusing the request (not a service that did not answer)."""


class CallAbandoned(BootstrapError):
    """A call to the bootstrap service given up before its deadline: the caller was asked to stop."""


class FrameRejected(TransportError):
    """A received frame that does not follow the wire format; `reason` is its counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class KVTransferError(TransportError):
    """A room's transfer failed; rendered exactly as SGLang renders it.

    `is_from_another_rank` is SGLang's flag for a failure learnt from a peer;
    `origin` names the rank that observed the failure first (kvtop's addition,
    which makes the fold of echoes under their origin exact); `suspect` names
    what the origin rank knows most likely broke ("" when it cannot tell; kvtop's
    addition too, which makes the operator's incidents exact); `origin_class` is the
    class the origin recorded (None when this rank does not know it).
    """

    def __init__(
        self,
        bootstrap_room: int,
        failure_reason: str,
        is_from_another_rank: bool = False,
        origin: str | None = None,
        suspect: str = "",
        origin_class: ReasonClass | None = None,
    ) -> None:
        super().__init__(bootstrap_room, failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank
        self.origin = origin
        self.suspect = suspect
        self.origin_class = origin_class

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"
