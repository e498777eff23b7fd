"""Failure reason strings, worded as SGLang words them where SGLang has one.

Each builder returns `(reason, reason_class)`, so a reason never travels
without its class.
"""

from __future__ import annotations

from transport.errors import ReasonClass
from transport.kvpoll import KVPoll

Reason = tuple[str, ReasonClass]

_TIMEOUT_CLASS = {
    KVPoll.Bootstrapping: ReasonClass.TIMEOUT_BOOTSTRAP,
    KVPoll.WaitingForInput: ReasonClass.TIMEOUT_WAITING,
    KVPoll.Transferring: ReasonClass.TIMEOUT_TRANSFER,
}


def timed_out(room: int, seconds: float, state: KVPoll) -> Reason:
    """A room that stayed too long in `state` (SGLang's timeout line)."""
    return (f"Request {room} timed out after {seconds:.1f}s in KVPoll.{state.name}", _TIMEOUT_CLASS[state])


def consensus_timeout(room: int, seconds: float, waiting_for: str) -> Reason:
    """The instance could not agree on a room: a rank never voted on it (it never took the room)."""
    return (f"Request {room} timed out after {seconds:.1f}s waiting for {waiting_for}", ReasonClass.TIMEOUT_CONSENSUS)


def send_failed(room: int, peer: str) -> Reason:
    """Prefill could not hand a chunk to a decode peer's connection."""
    return (f"Failed to send kv chunk of {room} to {peer}", ReasonClass.SEND_FAILED)


def decode_peer_dead(session: str) -> Reason:
    """Prefill lost the heartbeat of a decode peer."""
    return (f"Decode instance could be dead, remote session {session} is not alive", ReasonClass.PEER_LOST)


def prefill_peer_lost(bootstrap_addr: str) -> Reason:
    """Decode lost the heartbeat of a prefill peer."""
    return (f"Lost connection with prefill instance (bootstrap_addr: {bootstrap_addr})", ReasonClass.PEER_LOST)


def prefill_failed() -> Reason:
    """Decode was told by prefill that the room failed (SGLang's wording)."""
    return ("Failed to get kvcache from prefill instance, it might be dead", ReasonClass.PROPAGATED)


def aborted() -> Reason:
    """The request was aborted on this rank (SGLang's wording)."""
    return ("Aborted by AbortReq.", ReasonClass.ABORTED)


def aborted_by_peer(peer: str) -> Reason:
    """Prefill received ABORT for the room from a decode peer."""
    return (f"Aborted by decode peer {peer}", ReasonClass.PROPAGATED)


def checksum_mismatch(room: int, chunk: int, sender_rank: int, expected: int, actual: int) -> Reason:
    """A chunk landed with different bytes than the sender checksummed."""
    return (
        f"KV chunk {chunk} of room {room} from prefill rank {sender_rank} failed its checksum "
        f"(expected {expected:016x}, got {actual:016x})",
        ReasonClass.CHECKSUM,
    )


def refused(room: int, rank: int) -> Reason:
    """Prefill refused the decode's transfer request."""
    return (f"Prefill rank {rank} refused the transfer request of room {room}", ReasonClass.REFUSED)


def pool_full(room: int, rank: int) -> Reason:
    """The scheduler refused the room on this prefill rank: no KV pages for it."""
    return (f"Prefill rank {rank} refused room {room}: its KV pool is full", ReasonClass.REFUSED)


def layout_mismatch(room: int, detail: str) -> Reason:
    """The two sides disagree on pages or page layout."""
    return (f"Request {room} has mismatched KV layouts: {detail}", ReasonClass.OTHER)


def rank_silent(label: str) -> Reason:
    """Another rank of this instance stopped voting in the instance consensus."""
    return (f"Lost connection with rank {label} of this instance", ReasonClass.PEER_LOST)


def from_another_rank() -> Reason:
    """SGLang's text for a failure learnt through the instance's all-reduce."""
    return ("Failed due to an unknown reason from another rank", ReasonClass.PROPAGATED)
