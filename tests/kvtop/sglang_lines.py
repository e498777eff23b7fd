"""SGLang's log lines in its own shapes, for tests that write logs: times, ranks, rooms and reasons their own."""

from __future__ import annotations

import datetime
import re
from pathlib import Path


def decode_failure(ts: str, room: int, reason: str, tp: int = 0, tags: str = "") -> str:
    """A decode scheduler's failure line for `room` on rank `tp` (`tags`: more rank tags after its TP, ` EP0`)."""
    return (
        f"[{ts} TP{tp}{tags}] Decode transfer failed for request rank={tp} decode_req.req.rid='d{room}' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}\n"
    )


def cut_log(path: Path) -> tuple[str, str]:
    """Write a decode log copied while its server wrote it: a whole failure line, then one cut inside its address
    (`bootstrap_addr: 1` of `10.0.0.5:8998`); the whole line (without its newline) and the cut one."""
    lost = "Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998)"
    whole = decode_failure("2026-01-02 03:04:35", 5555, lost)
    written = decode_failure("2026-01-02 03:04:36", 5556, lost)
    cut = written[: written.index("bootstrap_addr: 1") + len("bootstrap_addr: 1")]
    path.write_text(whole + cut)
    return whole.rstrip("\n"), cut


def prefill_failure(ts: str, room: int, reason: str, tp: int = 0) -> str:
    """A prefill scheduler's failure line for `room` on rank `tp`."""
    return (
        f"[{ts} TP{tp}] Prefill transfer failed for request rank={tp} req.rid='p{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): {reason}\n"
    )


def shifted(text: str, seconds: float) -> str:
    """`text` with every SGLang stamp (`[2026-01-02 03:04:05.250`) moved by `seconds`: a log whose server's clock
    is that far off (its other stamps, glog's and UCX's, as they were)."""

    def move(stamp: re.Match[str]) -> str:
        try:
            moved = datetime.datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S") + datetime.timedelta(seconds=seconds)
        except ValueError:  # a garbled stamp (month 13) stays garbled
            return stamp[0]
        return f"[{moved:%Y-%m-%d %H:%M:%S}"

    return _STAMP.sub(move, text)


_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
