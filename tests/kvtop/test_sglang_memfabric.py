"""SGLang's `ascend` transfer backend moves KV with Ascend MemFabric, which logs its own errors in its own format
(`mf_out_logger.h`: `2026-06-12 08:10:36.118520 ERROR [pid-tid][SMEM smem_trans_entry.cpp:236 BatchSyncTransfer]
...`). kvtop read none of them: beside a failed room `check` found no transport error and `failures` showed no
likely cause, where on-call needed the engine's own word.

`fixtures/sglang/ascend-memfabric` is rebuilt from a public analysis of Ascend/sglang PR #872's NPU CI log (EPD on
Qwen3-VL-4B, TP2, MemFabric): its HYBM `IpcOpenMemory(...) failed:507899`, SMEM `session:(10.0.1.11:19347_6018)(...)
not found.` and ADAPTER `smem_trans_batch_write happen error, ret=-2000` lines, then the room 5717279478565220750
that prefill failed to send to 10.0.1.11:33137 and decode failed to get. The analysis quotes the MemFabric lines
without their time and `[pid-tid]`, and the SGLang lines without time and rid: those are ours, in the shapes
MemFabric's logger and SGLang print.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import ContextLine, classify
from kvtop.sources.sglang.prefix import parse_prefix

pytestmark = pytest.mark.usefixtures("utc")

LOGS = Path(__file__).parent / "fixtures" / "sglang" / "ascend-memfabric"
ARGS = [arg for log in sorted(LOGS.glob("*.log")) for arg in ("--sglang-log", str(log))]
SMEM = (
    "2026-06-12 08:10:36.118520 ERROR [737690-737731][SMEM smem_trans_entry.cpp:236 BatchSyncTransfer] "
    "session:(10.0.1.11:19347_6018)(0b:01:00:0a:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:93:4b:82:17) not found."
)


def test_check_finds_memfabric_s_errors_as_transport_errors():
    result = kvtop_here("check", *ARGS)

    assert result.returncode == 2
    assert "; warning: 3 transport errors in the logs, the last at 08:10:36: 2026-06-12 08:10:36.118604 ERROR " in (
        result.stdout
    )


def test_the_failed_room_shows_memfabric_s_errors_as_its_likely_cause():
    result = kvtop_here("failures", "--json", *ARGS)

    [group] = json.loads(result.stdout)["groups"]
    causes = [line["text"] for line in group["context"] if line["likely_cause"]]
    assert [cause.split("][", 1)[1][:5] for cause in causes] == ["HYBM ", "SMEM ", "ADAPT"]


def test_a_memfabric_error_line_is_a_transport_library_s_line_with_its_own_time():
    record = classify(parse_prefix(SMEM), 2026)

    assert record == ContextLine(1781251836.11852, None, "memfabric", None, SMEM)


@pytest.mark.parametrize(
    "line",
    [
        "2026-06-12 08:10:36.118520 INFO [737690-737731][SMEM smem_trans_entry.cpp:120 Init] session created.",
        "2026-06-12 08:10:36.118520 ERROR something else entirely",
    ],
)
def test_memfabric_s_lines_below_error_and_other_dated_lines_are_not_read(line: str):
    assert classify(parse_prefix(line), 2026) is None
