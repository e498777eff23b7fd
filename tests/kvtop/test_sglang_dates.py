"""A line whose time no log's can be (past this machine's clock by more than `AHEAD_MAX_S`, before `EARLIEST_TS`)
is set aside where it is read: counted and said, the line dated by the one before it, never the logs' "now" or
the start of their span. Real logs, of years ago or of a clock a bit ahead, read as written."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.prefix import stamp_seconds
from kvtop.views.times import stamp

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
NEW_ERA = FIXTURES / "new-era"
FAILURE = (
    "[{stamp} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r{room}' "
    "decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): Request {room} "
    "timed out after 300.0s in KVPoll.WaitingForInput\n"
)


def _with_line(tmp_path: Path, line: str, at: int | None) -> list[Path]:
    """The new-era fixture's logs, `line` put in its decode log before line `at` (None: at its end)."""
    lines = (NEW_ERA / "decode.log").read_bytes().splitlines(keepends=True)
    lines.insert(len(lines) if at is None else at, line.encode())
    (tmp_path / "decode.log").write_bytes(b"".join(lines))
    shutil.copy(NEW_ERA / "prefill.log", tmp_path / "prefill.log")  # not all UTF-8
    return [tmp_path / "prefill.log", tmp_path / "decode.log"]


def _read(paths: list[Path]) -> SGLangLogs:
    logs = load(paths, ClusterModel())
    logs.close()
    return logs


def _clean_span() -> tuple[float, float] | None:
    return _read([NEW_ERA / "prefill.log", NEW_ERA / "decode.log"]).told_span


@pytest.mark.parametrize(
    ("line", "at"),
    [
        (FAILURE.format(stamp="2099-01-02 03:04:30.250", room=4242), 8),  # a failure line
        ('[2099-01-02 03:05:19.250] INFO:     10.0.0.2:51240 - "POST /generate HTTP/1.1" 200 OK\n', None),  # unmarked
        (FAILURE.format(stamp="2099-01-02 03:03:00.000", room=4242), 0),  # the head's first stamp
        (FAILURE.format(stamp="1970-01-01 00:00:01.000", room=4242), 8),
    ],
    ids=["failure-2099", "last-dated-2099", "first-stamp-2099", "failure-1970"],
)
def test_a_line_dated_where_no_log_s_can_be_is_neither_now_nor_the_start(tmp_path: Path, line: str, at: int | None):
    """One line dated 2099 among a day's made every incident "ended" and every window empty; one dated 1970 put
    the span's start 56 years back."""
    logs = _read(_with_line(tmp_path, line, at))

    assert logs.told_span == _clean_span()
    assert logs.stats().misdated["decode-0"].lines == 1


def test_a_failure_line_dated_2099_is_read_at_the_time_of_the_line_before_it(tmp_path: Path):
    paths = _with_line(tmp_path, FAILURE.format(stamp="2099-01-02 03:04:30.250", room=4242), 8)

    failures = json.loads(kvtop_here("failures", *(f"--sglang-log={path}" for path in paths), "--json").stdout)

    (group,) = [group for group in failures["groups"] if group["room"] == 4242]
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(group["origin"]["ts"])) == "2026-01-02 03:04:26"


def test_status_and_check_say_a_line_dated_past_this_machine_s_clock(tmp_path: Path):
    paths = _with_line(tmp_path, FAILURE.format(stamp="2099-01-02 03:04:30.250", room=4242), 8)
    given = [f"--sglang-log={path}" for path in paths]

    status = kvtop_here("status", *given).stdout
    check = kvtop_here("check", *given)

    said = (
        "decode-0's line dated 2099-01-02 03:04:30 tells a time no log's can (past this machine's clock by more "
        "than 2 days): set aside, the line dated by the one before it"
    )
    assert f"clock   {said}" in status.splitlines()
    assert f"warning: a log's lines tell impossible times: {said}" in check.stdout
    assert status.startswith("incidents 11 in 113s, 11 ongoing: ")  # the whole span the logs read


def test_every_real_log_reads_as_written():
    """The fixtures are real servers' logs (of 2025 and 2026): none of their lines is set aside."""
    for folder in sorted(FIXTURES.iterdir()):
        logs = _read(sorted(folder.iterdir()))
        assert logs.stats().misdated == {}, folder.name


def test_a_clock_a_day_ahead_is_read_as_written(tmp_path: Path):
    """A server's clock ahead of this machine's by a day (or a timezone east of it) tells the logs' "now"."""
    ahead = time.time() + 86400
    stamps = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ahead + s)) for s in (0, 1)]
    log = tmp_path / "decode.log"
    log.write_text("".join(FAILURE.format(stamp=stamp, room=room) for room, stamp in enumerate(stamps, 1)))

    logs = _read([log])

    assert (logs.told_span, logs.stats().misdated) == ((int(ahead), int(ahead) + 1), {})


def test_a_line_dated_year_1_is_said_with_a_four_digit_year(tmp_path: Path):
    """C's %Y wrote year 1 as `1-01-02 03:04:30`: the date said looked like a time of day."""
    paths = _with_line(tmp_path, FAILURE.format(stamp="0001-01-02 03:04:30.250", room=4242), 8)
    year_1 = time.mktime(time.strptime("0001-01-02 03:04:30", "%Y-%m-%d %H:%M:%S")) + 0.25

    misdated = _read(paths).stats().misdated["decode-0"]

    assert "0001-01-02 03:04:30" in misdated.text("decode-0")
    assert stamp(year_1, dated=True) == "0001-01-02 03:04:30.250"


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-01-02 00:00:07", "2026-01-02 00:00:59", "2026-01-02 00:00:60", "2026-01-02 00:00:61",
        "2024-02-29 23:59:59", "2026-1-2 0:0:5", "2026-02-29 00:00:01", "2026-13-02 00:00:01",
        "2026-01-02 00:00:62", "2026-01-02 0:000:00", "2026-01-02 00:00:1x",
    ],
)  # fmt: skip
def test_a_stamp_reads_as_strptime_and_mktime_read_it_a_minute_read_once_or_not(stamp: str):
    """`stamp_seconds` reads a stamp's minute once and adds its seconds: what the whole stamp reads as, or the same
    ValueError (a leap second, a day or month that cannot be, another layout)."""

    def whole(text: str) -> float | type[ValueError]:
        try:
            return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))
        except ValueError:
            return ValueError

    def read(text: str) -> float | type[ValueError]:
        try:
            return stamp_seconds(text)
        except ValueError:
            return ValueError

    assert read(f"{stamp[:16]}:00") == whole(f"{stamp[:16]}:00")  # its minute read first, where it is one
    assert read(stamp) == whole(stamp)
