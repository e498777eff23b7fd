"""A decode rank that failed a room on its own, with no failure record of its own to raise.

SGLang 0.5.23 logs a rank whose own HiCache restore of the room failed as `... with exception
KVTransferError(bootstrap_room=N): Failed due to an unknown reason from another rank (HiCache local restore failed on
this rank)` at ERROR (decode.py): kvtop read the reason's start and filed the rank's own failure as an echo of an
origin never seen. Earlier versions logged such a room's line with nothing after its room (sglang #30322: `Decode
transfer failed for request rank=2 decode_req.req.rid=... decode_req.req.bootstrap_room=...`): kvtop counted it as
garbled and `check` said OK. Both are the rank's own failure, an origin.

The lines are in SGLang's shapes, with times, rooms and rids of my own.
"""

from __future__ import annotations

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import NO_REASON, FailureLine, Garbled, classify
from kvtop.sources.sglang.prefix import parse_prefix

pytestmark = pytest.mark.usefixtures("utc")

ROOM = 4793981895866140836
HEAD = (
    f"[2026-07-07 10:00:01 TP2] Decode transfer failed for request rank=2 decode_req.req.rid='3a49' "
    f"decode_req.req.bootstrap_room={ROOM}"
)
RESTORE_0523 = (
    f"{HEAD} with exception KVTransferError(bootstrap_room={ROOM}): Failed due to an unknown reason from another "
    "rank (HiCache local restore failed on this rank)"
)


def check(tmp_path, line: str):
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-07-07 10:00:01 TP2] HiCache load_back failed for rid=3a49: device_indices=0, new_indices=0, "
        f"expected decode_prefix_len=64 (l1=0, l2=0, l3=64)\n{line}\n"
    )
    return kvtop_here("check", "--sglang-log", str(log))


def test_a_rank_whose_own_hicache_restore_failed_is_the_origin_and_what_broke(tmp_path):
    result = check(tmp_path, RESTORE_0523)

    assert result.returncode == 2
    assert "incident: decode-0/TP2 fails transfers (other)" in result.stdout


def test_a_failure_line_that_ends_at_its_room_is_the_rank_s_failure_with_no_reason(tmp_path):
    line = classify(parse_prefix(HEAD), 2026)

    assert isinstance(line, FailureLine)
    assert (line.room, line.tp, line.reason) == (ROOM, 2, NO_REASON)
    assert check(tmp_path, HEAD).returncode == 2


@pytest.mark.parametrize(
    "cut",
    [
        f"{HEAD} with exception",
        f"{HEAD[:-4]} with exc",
        HEAD.replace(f"={ROOM}", "=None"),
        f"{HEAD} with exception KVTransferError(bootstrap_room=4793",  # `head -c` of a log: a phantom failure
    ],
)
def test_a_failure_line_cut_before_its_reason_is_still_garbled(cut: str):
    with pytest.raises(Garbled):
        classify(parse_prefix(cut), 2026)
