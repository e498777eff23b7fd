"""SGLang's log lines in its own shapes, for tests that write logs: times, ranks, rooms and reasons their own."""

from __future__ import annotations


def decode_failure(ts: str, room: int, reason: str, tp: int = 0, tags: str = "") -> str:
    """A decode scheduler's failure line for `room` on rank `tp` (`tags`: more rank tags after its TP, ` EP0`)."""
    return (
        f"[{ts} TP{tp}{tags}] Decode transfer failed for request rank={tp} decode_req.req.rid='d{room}' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}\n"
    )
