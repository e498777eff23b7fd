"""A transfer engine's glog line prints no year (`E0101 00:00:01.004117 392 tcp_transport.cpp:542] ...`): kvtop took
the year of the last time its log told, so across New Year a Mooncake error one second after SGLang's
`[2025-12-31 23:59:59 ...]` was dated 2025-01-01. The logs then spanned a year: `check` said "2 rooms failed in
8760h00m", `incidents` "from 2025-01-01 00:00:01", and the error stood a year away from the failure it caused. A
paste of glog lines alone, dated by the file's time, met the same: Mooncake's `E1210 ...` lines (the shape of
vllm-project/vllm-ascend#4866's `ascend_direct_transport.cpp:820] Failed to connect to target: ...`) read on 5
December were "past this machine's clock", set aside as impossible.

`fixtures/sglang/new-year` is our own, in the shapes of sglang#23272's prefill (`tcp_transport.cpp:542]
TcpTransport::startTransfer encountered an ASIO exception`, `Session X failed.`, `Failed to send kv chunk`): two
prefill ranks fail a room each, one second either side of midnight. A glog line is of the year that puts it nearest
its log's time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.lines import glog_year

pytestmark = pytest.mark.usefixtures("utc")

NEW_YEAR = Path(__file__).parent / "fixtures" / "sglang" / "new-year" / "prefill.log"
MIDNIGHT = 1767225600.0
"""2026-01-01 00:00:00 UTC."""


def test_a_glog_line_just_after_midnight_is_of_the_new_year():
    result = kvtop_here("check", "--sglang-log", str(NEW_YEAR))

    assert result.returncode == 2
    assert ", 2 rooms failed in 121s, " in result.stdout  # from the server_args line at 23:58:00
    assert "the last at 00:00:01: E0101 00:00:01.004117 " in result.stdout


def test_the_incidents_span_the_seconds_around_midnight_not_a_year():
    result = kvtop_here("incidents", "--json", "--sglang-log", str(NEW_YEAR))

    found = json.loads(result.stdout)["incidents"]  # the sender out of its own ports (EADDRNOTAVAIL): one incident
    assert [(incident["first_seen"], incident["last_seen"]) for incident in found] == [(MIDNIGHT - 1, MIDNIGHT + 1)]
    assert "from 2025-12-31 23:58:00 to 2026-01-01 00:00:01" in result.stderr


@pytest.mark.parametrize(
    ("line", "near", "year"),
    [
        ("E1231 23:59:59.912044   391 tcp_transport.cpp:542] x", MIDNIGHT + 2, 2025),
        ("E0101 00:00:01.004117   392 tcp_transport.cpp:542] x", MIDNIGHT - 1, 2026),
        ("E0603 20:16:59.104661 27322 worker_pool.cpp:271] x", MIDNIGHT - 180 * 86400, 2025),
        ("[rank3]:[E1231 23:59:58.441603074 ProcessGroupNCCL.cpp:2068] x", MIDNIGHT + 5, 2025),
        ("[2026-01-01 00:00:01 TP0] Session 172.20.0.9:15004 failed.", MIDNIGHT + 1, 2026),
    ],
)
def test_a_glog_line_is_of_the_year_that_puts_it_nearest_its_log_s_time(line: str, near: float, year: int):
    assert glog_year(line, near) == year


def test_a_glog_line_of_29_february_is_of_the_leap_year_beside_it():
    """Of the years around 2029-01-10 only 2028 has a 29 February."""
    assert glog_year("E0229 12:00:00.000001 7 rdma_transport.cpp:529] x", MIDNIGHT + 1105 * 86400) == 2028


def test_a_glog_line_dated_by_its_file_s_time_is_not_after_it():
    """The file's time (its mtime: no line before told one) is when its last line was written, not a line's: a glog
    line is of the latest year not past it, even when the year after is nearer."""
    written = MIDNIGHT - 26 * 86400  # 2025-12-06
    line = "E1210 03:24:54.778028 2548307 ascend_direct_transport.cpp:820] x"

    assert (glog_year(line, written), glog_year(line, written, latest=True)) == (2025, 2024)


def test_glog_lines_alone_of_a_day_after_the_file_s_time_are_of_the_year_before(tmp_path: Path):
    """Dated by the file's time (no SGLang line before them): a paste of 10 December written on 5 December is last
    year's, not "past this machine's clock"."""
    written = time.time() - 86400
    paste = tmp_path / "decode.log"
    paste.write_text(
        time.strftime("E%m%d 03:24:54.778028 2548307 ", time.localtime(written + 5 * 86400))
        + "ascend_direct_transport.cpp:820] Failed to connect to target: 172.16.100.99:25389, status: 103900\n"
    )
    os.utime(paste, (written, written))

    result = kvtop_here("status", "--sglang-log", str(paste))

    assert "a time no log's can" not in result.stdout + result.stderr
    assert "1 context line," in result.stdout


def test_a_log_of_no_role_with_an_impossible_time_is_named_by_its_file(tmp_path: Path):
    """It said "'s line dated 2099-01-01 ..." (the instance a role names was still empty)."""
    log = tmp_path / "engine.log"
    log.write_text("[2099-01-01 00:00:00 TP0] Session 10.0.0.7:15004 failed.\n")

    result = kvtop_here("status", "--sglang-log", str(log))

    assert "clock   engine.log's line dated 2099-01-01 00:00:00 tells a time no log's can" in result.stdout
