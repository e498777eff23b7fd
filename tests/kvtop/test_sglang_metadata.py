"""A decode's metadata check: SGLang aborts the request (HTTP 500) when the metadata that landed for it is another
room's (`Context corruption detected`) or missing after the readiness gate; the line is the room's only record.

The lines are the SGLang Ascend FAQ's (docs.sglang.io, "Error message": a decode rank's, Mooncake); before, kvtop
counted them as context only, and `check` said OK beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import METADATA_CHECK, FailureLine, classify
from kvtop.sources.sglang.prefix import parse_prefix

BATCH = (
    "[2026-04-07 13:24:13 TP0] Decode batch, #running-req: 10, #token: 485248, token usage: 0.94, pre-allocated "
    "usage: 0.51, #prealloc-req: 1, #transfer-req: 12, #retracted-req: 0, npu graph: True, gen throughput "
    "(token/s): 259.82, #queue-req: 0\n"
)
CORRUPTION = (
    "[2026-04-07 13:24:13 TP0] Context corruption detected: Request 3b5dcfe1575d4e1f9b18c953de878a93 "
    "(bootstrap_room=7451500070298748792) received metadata from bootstrap_room=4125156593077881415. Metadata buffer "
    "index: 1. This indicates metadata buffer index collision.\n"
)


def test_another_room_s_metadata_is_a_failure_of_the_room_it_landed_for():
    line = classify(parse_prefix(CORRUPTION), 2026)

    assert isinstance(line, FailureLine)
    assert (line.what, line.role, line.rid, line.room) == (
        METADATA_CHECK, "decode", "3b5dcfe1575d4e1f9b18c953de878a93", 7451500070298748792,
    )  # fmt: skip


def test_metadata_missing_after_the_readiness_gate_is_a_failure_too():
    line = classify(
        parse_prefix(
            "[2026-04-07 13:24:14 TP1] Metadata unexpectedly not ready after readiness gate: request abc, "
            "bootstrap_room=42, metadata_buffer_index=3"
        ),
        2026,
    )

    assert isinstance(line, FailureLine)
    assert (line.tp, line.room, line.role) == (1, 42, "decode")


def test_a_corruption_is_an_incident_naming_the_room_whose_metadata_landed(tmp_path: Path):
    log = tmp_path / "decode.log"
    log.write_text(BATCH + CORRUPTION)

    check = kvtop_here("check", "--sglang-log", str(log))
    incidents = json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]

    assert check.returncode == 2
    assert [(i["suspect_text"], i["kind"], i["evidence"]) for i in incidents] == [
        (
            "the prefill side of decode-0",
            "corrupt",
            ["room 4125156593077881415's metadata landed in its buffer (metadata buffer index collision)"],
        )
    ]
