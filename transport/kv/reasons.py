"""Failure reason strings, worded as SGLang words them where SGLang has one.

Each builder returns a `Reason`: the text, its class, and the suspect, so a reason never travels without
its class. The suspect is what this rank knows most likely broke (DOMAIN.md, "Origins, suspects and
incidents"): the rank that sent a corrupt chunk, the peer whose heartbeat stopped, the rank that never
voted; "" where the rank cannot tell (the operator's side then applies the domain's rules).
"""

from __future__ import annotations

from typing import NamedTuple

from transport.errors import ReasonClass
from transport.kvpoll import KVPoll
from transport.wire import AgentInfo

CLIENT = "client"
"""The suspect of a client's abort."""
SILENCE_CLASSES = frozenset(
    (
        ReasonClass.TIMEOUT_BOOTSTRAP,
        ReasonClass.TIMEOUT_WAITING,
        ReasonClass.TIMEOUT_TRANSFER,
        ReasonClass.TIMEOUT_CONSENSUS,
        ReasonClass.PEER_LOST,
        ReasonClass.SEND_FAILED,
    )
)
"""The classes of failure a rank's own silence causes: it heard nobody, so it judged its peers gone."""


class Reason(NamedTuple):
    text: str
    reason_class: ReasonClass
    suspect: str = ""
    """A rank label (`prefill-0/TP1`), an instance (`prefill-0`), `client`, or "" (this rank cannot tell)."""
    learnt_class: ReasonClass | None = None
    """An echo's (`propagated`): the class its origin recorded, when this rank learnt it (None otherwise)."""

    @property
    def origin_class(self) -> ReasonClass | None:
        """The class the failure's origin recorded: this reason's own, or for an echo what it learnt."""
        return self.learnt_class if self.reason_class is ReasonClass.PROPAGATED else self.reason_class


_TIMEOUT_CLASS = {
    KVPoll.Bootstrapping: ReasonClass.TIMEOUT_BOOTSTRAP,
    KVPoll.WaitingForInput: ReasonClass.TIMEOUT_WAITING,
    KVPoll.Transferring: ReasonClass.TIMEOUT_TRANSFER,
}


def common_suspect(labels: set[str]) -> str:
    """One suspect for several rank labels: the rank when there is one, their instance when they share one,
    else "" (nothing in common to name)."""
    if len(labels) == 1:
        return next(iter(labels))
    instances = {label.rpartition("/")[0] for label in labels}
    return instances.pop() if len(instances) == 1 else ""


def timed_out(room: int, seconds: float, state: KVPoll, suspect: str = "") -> Reason:
    """A room that stayed too long in `state` (SGLang's timeout line); `suspect`: the peer it waited for."""
    return Reason(
        f"Request {room} timed out after {seconds:.1f}s in KVPoll.{state.name}", _TIMEOUT_CLASS[state], suspect
    )


def consensus_timeout(room: int, seconds: float, waiting_for: str, suspect: str = "") -> Reason:
    """The instance could not agree on a room: a rank never voted on it (it never took the room)."""
    text = f"Request {room} timed out after {seconds:.1f}s waiting for {waiting_for}"
    return Reason(text, ReasonClass.TIMEOUT_CONSENSUS, suspect)


def send_failed(room: int, peer: str) -> Reason:
    """Prefill could not hand a chunk to a decode peer's connection (the rank `peer`)."""
    return Reason(f"Failed to send kv chunk of {room} to {peer}", ReasonClass.SEND_FAILED, peer)


def decode_peer_dead(session: str) -> Reason:
    """Prefill lost the heartbeat of a decode peer (the rank `session`)."""
    return Reason(
        f"Decode instance could be dead, remote session {session} is not alive", ReasonClass.PEER_LOST, session
    )


def prefill_peer_lost(bootstrap_addr: str, peer: str) -> Reason:
    """Decode lost the heartbeat of a prefill peer (the rank `peer`, reached at `bootstrap_addr`)."""
    text = f"Lost connection with prefill instance (bootstrap_addr: {bootstrap_addr})"
    return Reason(text, ReasonClass.PEER_LOST, peer)


def prefill_failed(suspect: str = "", origin_class: ReasonClass | None = None) -> Reason:
    """Decode was told by prefill that the room failed (SGLang's wording): an echo, the origin names the cause
    (`suspect`: what it named; `origin_class`: the class it recorded)."""
    text = "Failed to get kvcache from prefill instance, it might be dead"
    return Reason(text, ReasonClass.PROPAGATED, suspect, origin_class)


def aborted() -> Reason:
    """The request was aborted on this rank (SGLang's wording): the client's doing."""
    return Reason("Aborted by AbortReq.", ReasonClass.ABORTED, CLIENT)


def aborted_by_peer(peer: str, suspect: str = "", origin_class: ReasonClass | None = None) -> Reason:
    """Prefill received ABORT for the room from a decode peer: an echo of the decode's failure (`suspect`: what its
    origin named; `origin_class`: the class it recorded)."""
    return Reason(f"Aborted by decode peer {peer}", ReasonClass.PROPAGATED, suspect, origin_class)


def checksum_mismatch(
    room: int, chunk: int, sender_rank: int, expected: int, actual: int, sender: str, page: int | None = None
) -> Reason:
    """A chunk landed with different bytes than the sender (the rank `sender`) checksummed, or than its page
    `page` (a position in the room's page list) had when it was written. The text names the sender's label too: a
    log of it read alone (`kvtop ... --sglang-log` on an agent's log) tells who sent it."""
    where = "" if page is None else f"page {page}: "
    return Reason(
        f"KV chunk {chunk} of room {room} from prefill rank {sender_rank} ({sender}) failed its checksum "
        f"({where}expected {expected:016x}, got {actual:016x})",
        ReasonClass.CHECKSUM,
        sender,
    )


def refused(room: int, rank: int, label: str) -> Reason:
    """Prefill (the rank `label`) refused the decode's transfer request: it is the suspect."""
    return Reason(f"Prefill rank {rank} refused the transfer request of room {room}", ReasonClass.REFUSED, label)


def pool_full(room: int, me: AgentInfo, holding_up: str = "", silent_s: float = 0.0) -> Reason:
    """The scheduler refused the room on this rank: no KV pages for it (the suspect: this rank, or `holding_up`,
    the rank of its instance whose silence filled its pool, its vote not heard for `silent_s`)."""
    text = f"{me.role.capitalize()} rank {me.rank} refused room {room}: its KV pool is full"
    if holding_up:
        text += f" (its rooms wait on the vote of {holding_up}, not heard for {silent_s:.1f}s)"
    return Reason(text, ReasonClass.REFUSED, holding_up or me.label)


def layout_mismatch(room: int, detail: str) -> Reason:
    """The two sides disagree on pages or page layout (neither side can tell which is wrong)."""
    return Reason(f"Request {room} has mismatched KV layouts: {detail}", ReasonClass.OTHER)


def rank_silent(label: str) -> Reason:
    """Another rank of this instance (`label`) stopped voting in the instance consensus."""
    return Reason(f"Lost connection with rank {label} of this instance", ReasonClass.PEER_LOST, label)


def from_another_rank(suspect: str = "", origin_class: ReasonClass | None = None) -> Reason:
    """SGLang's text for a failure learnt through the instance's all-reduce (`suspect`: what its origin named;
    `origin_class`: the class it recorded)."""
    return Reason("Failed due to an unknown reason from another rank", ReasonClass.PROPAGATED, suspect, origin_class)
