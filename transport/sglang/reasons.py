"""SGLang's failure reasons in closed classes (DOMAIN.md, "Where failures start"), for its logs and its plugin."""

from __future__ import annotations

import re

from transport.errors import ReasonClass

ANOTHER_RANK = "Failed due to an unknown reason from another rank"
"""SGLang's reason on the ranks that learnt of a failure through their instance's all-reduce."""

_CLASSES: tuple[tuple[str, tuple[str, ...], re.Pattern[str], ReasonClass], ...] = tuple(
    (pattern, literals, re.compile(pattern), reason_class)
    for pattern, literals, reason_class in (
        (
            r"\(HiCache local restore failed on this rank\)$",
            ("(HiCache local restore failed on this rank)",),
            ReasonClass.OTHER,
        ),  # 0.5.23: the rank's own, an origin
        (r"timed out after [\d.]+s in KVPoll\.Bootstrapping", ("timed out after ",), ReasonClass.TIMEOUT_BOOTSTRAP),
        (r"timed out after [\d.]+s in KVPoll\.WaitingForInput", ("timed out after ",), ReasonClass.TIMEOUT_WAITING),
        (r"timed out after [\d.]+s in KVPoll\.Transferring", ("timed out after ",), ReasonClass.TIMEOUT_TRANSFER),
        (r"timed out after [\d.]+s waiting for ", ("timed out after ",), ReasonClass.TIMEOUT_CONSENSUS),
        (
            r"^Failed to send (?:kv chunk|state components|aux data) of ",
            ("Failed to send ",),
            ReasonClass.SEND_FAILED,
        ),  # mooncake, ascend
        (
            r"^(?:send_metadata|_register_kv_args) to prefill \S+ failed",
            ("send_metadata", "_register_kv_args"),
            ReasonClass.SEND_FAILED,
        ),
        (r"^Timed out waiting for prefill completion", ("Timed out waiting",), ReasonClass.TIMEOUT_WAITING),
        (r"^KV transfer exceeded SLA \d+ms", ("KV transfer exceeded SLA ",), ReasonClass.TIMEOUT_TRANSFER),  # MoRI
        (
            r"^Decode instance could be dead, remote (?:\w+ )?session .* is not alive",
            ("Decode instance could be dead",),
            ReasonClass.PEER_LOST,
        ),  # mooncake, Mooncake, p2p
        (
            r"^(?:Lost|Losing) connection with prefill instance",
            ("Lost connection", "Losing connection"),
            ReasonClass.PEER_LOST,
        ),  # 0.5.23; early-2026
        (
            r"^Prefill server with bootstrap_addr: \S+ is healthy before, but now it is down",
            ("Prefill server with ",),
            ReasonClass.PEER_LOST,
        ),
        (r"^Lost connection with rank .* of this instance", ("Lost connection with rank ",), ReasonClass.PEER_LOST),
        (
            r"\bNIXL_ERR_REMOTE_DISCONNECT\b",
            ("NIXL_ERR_REMOTE_DISCONNECT",),
            ReasonClass.PEER_LOST,
        ),  # NIXL: the room's peer agent went away
        (
            r"^Could not fetch (?:prefill (?:parallel|server) info|bootstrap info for: )",
            ("Could not fetch ",),
            ReasonClass.BOOTSTRAP_ERROR,
        ),
        (r"^Failed to get kvcache from prefill instance", ("Failed to get kvcache",), ReasonClass.PROPAGATED),
        (
            r"^Aborted by decode(?: peer|-side abort notification)",
            ("Aborted by decode",),
            ReasonClass.PROPAGATED,
        ),  # 0.5.23 NIXL: the latter
        (rf"^{ANOTHER_RANK}", (ANOTHER_RANK,), ReasonClass.PROPAGATED),
        (
            r"^KV checksum mismatch on a peer rank",
            ("KV checksum mismatch on a peer rank",),
            ReasonClass.PROPAGATED,
        ),  # 0.5.23: another rank of it found it
        (r"^Aborted by AbortReq", ("Aborted by AbortReq",), ReasonClass.ABORTED),
        (
            r"failed its checksum|checksum mismatch|^Context corruption detected",
            ("failed its checksum", "checksum mismatch", "Context corruption detected"),
            ReasonClass.CHECKSUM,
        ),
        (r"refused the transfer request", ("refused the transfer request",), ReasonClass.REFUSED),
    )
)
"""(pattern, literals, compiled, class), first match wins: every match of a pattern holds one of its literals (at
the reason's start where the pattern is anchored there), looked for first."""
_ANCHORED = tuple(entry for entry in _CLASSES if entry[0].startswith("^"))
_BY_FIRST: dict[str, tuple[tuple[re.Pattern[str], tuple[str, ...], bool, str], ...]] = {
    first: tuple(
        (compiled, literals, anchored, str(name))
        for pattern, literals, compiled, name in _CLASSES
        if not (anchored := pattern.startswith("^")) or any(literal[0] == first for literal in literals)
    )
    for first in {literal[0] for entry in _ANCHORED for literal in entry[1]} | {""}
}
"""The patterns that may match a reason, by its first character ("": any other first character): an anchored
pattern only where one of its literals starts with that character."""


_CLASSES_KEPT = 4096
"""Reasons whose class `reason_class` keeps (a log repeats a few reasons on most of its failure lines: an echo's, a
dead prefill's); past it the kept ones are dropped together."""
_classes: dict[str, str] = {}


def reason_class(reason: str) -> str:
    """The closed-set class of a reason string (`other` for anything a backend reports)."""
    name = _classes.get(reason)
    if name is None:
        if len(_classes) >= _CLASSES_KEPT:
            _classes.clear()
        name = _classes[reason] = _class_of(reason)
    return name


def _class_of(reason: str) -> str:
    for pattern, literals, anchored, name in _BY_FIRST.get(reason[:1], _BY_FIRST[""]):
        if anchored:
            if not reason.startswith(literals):
                continue
        else:
            for literal in literals:
                if literal in reason:
                    break
            else:
                continue
        if pattern.search(reason):
            return name
    return str(ReasonClass.OTHER)
