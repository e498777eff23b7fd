"""A transfer engine that failed to start: the rank dies before it serves a room, and says why first.

The shape is a public report's (SGLang issue #10748, 2025-09: on Ascend, MemFabric's own `error PID pid[PID]
[BM devmm_ioctl.cpp:122] svm advise failed ...` ... `[SMEM smem_trans.cpp:44] hybm core init failed: -3` lines, then
SGLang's `Ascend Transfer Engine initialization failed.`, which it logs just before it raises; the report's paste
ends there). The fixture's times, pid and rank are made up. Before, kvtop read none of those lines: `check` said
UNKNOWN ("no rank named in what was read") where the decode had died at start.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import ContextLine, classify
from kvtop.sources.sglang.prefix import parse_prefix

pytestmark = pytest.mark.usefixtures("utc")

DECODE = Path(__file__).parent / "fixtures" / "sglang" / "ascend-init" / "decode.log"


def test_check_is_critical_naming_the_rank_whose_engine_failed_and_memfabric_s_words():
    result = kvtop_here("check", "--sglang-log", str(DECODE))

    assert result.returncode == 2
    assert result.stdout.startswith(
        "KVTOP CRITICAL - decode-0/TP1 crashed at 11:02:07 (Ascend Transfer Engine initialization failed.); "
        "warning: 4 transport errors in the logs, the last at 11:02:07: 2026-03-02 11:02:07.204479 error 40417 "
    )


def test_memfabric_s_2025_error_line_is_a_transport_library_s_line_with_its_own_time():
    """MemFabric's console format before 2026: lowercase level, `PID pid[PID] ` where `[pid-tid]` stands now."""
    line = "2026-03-02 11:02:07.204470 error 40417 pid[40417] [SMEM smem_trans.cpp:44] hybm core init failed: -3"

    assert classify(parse_prefix(line), 2026) == ContextLine(1772449327.20447, None, "memfabric", None, line)
