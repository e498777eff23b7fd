"""SGLang's failure reasons in closed classes (DOMAIN.md, "Where failures start"), for its logs and its plugin."""

from __future__ import annotations

import re

from transport.errors import ReasonClass

ANOTHER_RANK = "Failed due to an unknown reason from another rank"
"""SGLang's reason on the ranks that learnt of a failure through their instance's all-reduce."""

_CLASSES: tuple[tuple[re.Pattern[str], ReasonClass], ...] = tuple(
    (re.compile(pattern), reason_class)
    for pattern, reason_class in (
        (r"\(HiCache local restore failed on this rank\)$", ReasonClass.OTHER),  # 0.5.23: the rank's own, an origin
        (r"timed out after [\d.]+s in KVPoll\.Bootstrapping", ReasonClass.TIMEOUT_BOOTSTRAP),
        (r"timed out after [\d.]+s in KVPoll\.WaitingForInput", ReasonClass.TIMEOUT_WAITING),
        (r"timed out after [\d.]+s in KVPoll\.Transferring", ReasonClass.TIMEOUT_TRANSFER),
        (r"timed out after [\d.]+s waiting for ", ReasonClass.TIMEOUT_CONSENSUS),
        (r"^Failed to send (?:kv chunk|state components|aux data) of ", ReasonClass.SEND_FAILED),  # mooncake, ascend
        (r"^(?:send_metadata|_register_kv_args) to prefill \S+ failed", ReasonClass.SEND_FAILED),
        (r"^Timed out waiting for prefill completion", ReasonClass.TIMEOUT_WAITING),
        (r"^KV transfer exceeded SLA \d+ms", ReasonClass.TIMEOUT_TRANSFER),  # MoRI
        (
            r"^Decode instance could be dead, remote (?:\w+ )?session .* is not alive",
            ReasonClass.PEER_LOST,
        ),  # mooncake, Mooncake, p2p
        (r"^(?:Lost|Losing) connection with prefill instance", ReasonClass.PEER_LOST),  # 0.5.23; early-2026
        (r"^Prefill server with bootstrap_addr: \S+ is healthy before, but now it is down", ReasonClass.PEER_LOST),
        (r"^Lost connection with rank .* of this instance", ReasonClass.PEER_LOST),
        (r"\bNIXL_ERR_REMOTE_DISCONNECT\b", ReasonClass.PEER_LOST),  # NIXL: the room's peer agent went away
        (r"^Could not fetch (?:prefill (?:parallel|server) info|bootstrap info for: )", ReasonClass.BOOTSTRAP_ERROR),
        (r"^Failed to get kvcache from prefill instance", ReasonClass.PROPAGATED),
        (r"^Aborted by decode(?: peer|-side abort notification)", ReasonClass.PROPAGATED),  # 0.5.23 NIXL: the latter
        (rf"^{ANOTHER_RANK}", ReasonClass.PROPAGATED),
        (r"^KV checksum mismatch on a peer rank", ReasonClass.PROPAGATED),  # 0.5.23: another rank of it found it
        (r"^Aborted by AbortReq", ReasonClass.ABORTED),
        (r"failed its checksum|checksum mismatch|^Context corruption detected", ReasonClass.CHECKSUM),
        (r"refused the transfer request", ReasonClass.REFUSED),
    )
)


def reason_class(reason: str) -> str:
    """The closed-set class of a reason string (`other` for anything a backend reports)."""
    for pattern, name in _CLASSES:
        if pattern.search(reason):
            return str(name)
    return str(ReasonClass.OTHER)
