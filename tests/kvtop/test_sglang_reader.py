"""The block reader: the same lines whatever the block size, and lines too long to be lines."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sglang_lines import cut_log

from kvtop.sources.sglang import reader
from kvtop.sources.sglang.lines import MARKERS
from kvtop.sources.sglang.reader import _CRASH_WORDS, _SPECIAL, MAX_LINE_BYTES, THREAD_DEATH, TRACEBACK, LogReader
from tests.conftest import wait_for

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
LOGS = sorted(FIXTURES.glob("*/*.log"))


def _read_all(path: Path, block_bytes: int) -> tuple[list[str], int, int]:
    reader = LogReader(path, block_bytes=block_bytes)
    lines = reader.read(final=True, max_bytes=1 << 40)
    reader.close()
    return lines, reader.stats.lines, reader.stats.bytes


@pytest.mark.parametrize("path", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("block_bytes", [1, 7, 64, 4096])
def test_blocks_cut_anywhere_give_the_lines_of_one_whole_read(path: Path, block_bytes: int):
    whole, whole_count, size = _read_all(path, 1 << 20)
    assert whole and whole_count == path.read_bytes().count(b"\n")
    assert _read_all(path, block_bytes) == (whole, whole_count, size)


def test_marked_lines_come_out_whole_and_in_order_and_every_line_is_counted(tmp_path: Path):
    log = tmp_path / "decode.log"
    lines = [f"[2026-01-02 00:00:{n % 60:02d} TP0] line {n} of nothing in particular" for n in range(200)]
    lines[17] = "[2026-01-02 00:00:17 TP0] Session 10.0.0.1:1234 failed."
    lines[150] = "[2026-01-02 00:00:30 TP1] Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998)"
    log.write_text("\n".join(lines) + "\n")
    marked, count, _ = _read_all(log, 97)
    assert marked == [lines[17], lines[150]]
    assert count == 200


@pytest.mark.parametrize("length", [MAX_LINE_BYTES + 10, 5 * MAX_LINE_BYTES + 10])
def test_a_line_longer_than_the_limit_is_counted_garbled_once_and_reading_goes_on(tmp_path: Path, length: int):
    """However long (a lost newline in a 1 GB file was counted as 256 garbled lines)."""
    log = tmp_path / "decode.log"
    failure = "[2026-01-02 00:00:01 TP0] Session 10.0.0.1:1234 failed."
    log.write_bytes(b"x" * length + b"\n" + failure.encode() + b"\n")
    reader = LogReader(log, block_bytes=1 << 16)
    assert reader.read(final=True, max_bytes=1 << 40) == [failure]
    assert (reader.stats.garbled, reader.stats.lines) == (1, 2)
    reader.close()


@pytest.mark.parametrize("gz", [False, True])
def test_a_last_line_without_its_newline_is_not_read_as_whole_but_counted_cut(tmp_path: Path, gz: bool):
    """A file read once whose last line has no newline: that line's end may be missing (`bootstrap_addr: 1`), so it
    is not read (it was, as if whole, into a reason naming no prefill) and is counted cut; a traceback held at the end
    still comes out whole."""
    import gzip

    log = tmp_path / "decode.log"
    whole, _ = cut_log(log)
    traceback = "\n".join(["[2026-01-02 03:04:36 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                           '  File "/x.py", line 1, in f', "ValueError: boom"])  # fmt: skip
    log.write_text(log.read_text().replace("\n", f"\n{traceback}\n"))
    if gz:
        log = log.rename(tmp_path / "decode.log.gz")
        log.write_bytes(gzip.compress(log.read_bytes()))
    reader = LogReader(log, block_bytes=64)

    assert reader.read(final=True, max_bytes=1 << 20) == [whole, traceback]
    assert (reader.stats.cut, reader.stats.lines) == (1, 4)
    reader.close()


def test_a_partial_line_waits_for_its_newline_while_following(tmp_path: Path):
    log = tmp_path / "decode.log"
    failure = "[2026-01-02 00:00:01 TP0] Session 10.0.0.1:1234 failed."
    log.write_text(failure[:30])
    reader = LogReader(log, block_bytes=16)
    assert reader.read() == []
    with log.open("a") as growing:
        growing.write(failure[30:] + "\n")
    assert reader.read() == [failure]
    assert reader.stats.lines == 1
    reader.close()


@pytest.mark.parametrize("replacement", ["fifo", "folder"])
def test_a_followed_log_replaced_by_no_regular_file_is_waited_for_as_one_not_there(tmp_path: Path, replacement):
    """A fifo in its place blocked the open for ever (a sidecar that never stopped); a folder ended the view that
    followed it (IsADirectoryError). Both are waited for, and a log back in its place is read."""
    import os

    log = tmp_path / "decode.log"
    failure = "[2026-01-02 00:00:01 TP0] Session 10.0.0.1:1234 failed."
    log.write_text(failure + "\n")
    reader = LogReader(log)
    assert reader.read() == [failure]
    log.rename(tmp_path / "decode.log.1")
    os.mkfifo(log) if replacement == "fifo" else log.mkdir()

    assert reader.read() == []
    assert reader.read() == []

    os.remove(log) if replacement == "fifo" else log.rmdir()
    log.write_text(failure.replace("10.0.0.1", "10.0.0.2") + "\n")
    assert reader.read() == [failure.replace("10.0.0.1", "10.0.0.2")]
    reader.close()


WORKER_ERROR = [
    "[2026-01-02 00:00:01 TP3] Unexpected transfer worker error for room 31",
    "Traceback (most recent call last):",
    '  File "/opt/sglang/python/sglang/srt/disaggregation/nixl/conn.py", line 611, in transfer_worker',
    "    self.send_kvcache(req, chunk)",
    "RuntimeError: post xfer failed: NIXL_ERR_BACKEND",
]


def test_a_traceback_at_the_end_of_a_followed_file_is_one_record_that_closes_once_the_file_was_quiet(
    tmp_path: Path,
):
    """Written in two chunks closer together than the quiet time, it stays one record; once the file gained
    nothing for the quiet time it comes out whole, with no later line."""
    log = tmp_path / "prefill.log"
    log.write_text("\n".join(WORKER_ERROR[:3]) + "\n")
    reader = LogReader(log)
    reader.quiet_s = 3600.0  # far longer than the pause between the two chunks
    first = reader.read()
    with log.open("a") as growing:
        growing.write("\n".join(WORKER_ERROR[3:]) + "\n")
    second = reader.read()
    reader.quiet_s = 0.2
    closed = wait_for(reader.read, 10, "the traceback out once the file was quiet")

    assert (first, second, closed) == ([WORKER_ERROR[0]], [], ["\n".join(WORKER_ERROR[1:])])
    assert (reader.read(), reader.stats.lines) == ([], 5)
    reader.close()


def test_a_log_whose_head_is_a_hole_of_nul_bytes_is_read_past_it(tmp_path: Path):
    """copytruncate with a writer that does not append leaves the file's head a hole of NULs up to where the writer
    went on: it was refused as UTF-16 LE; the hole is one garbled line and the lines after it are read."""
    log = tmp_path / "decode.log"
    failure = "[2026-01-02 00:00:01 TP0] Session 10.0.0.1:1234 failed."
    log.write_bytes(b"\0" * 4096 + b"\n" + failure.encode() + b"\n")
    reader = LogReader(log)
    reader.open()

    assert reader.read(final=True) == [failure]
    reader.close()


CRASH_SHAPES = (
    "[2025-05-28 09:43:{s:02d} TP{t}] an info line",
    "[2025-05-28 09:43:{s:02d} TP{t}] Session 10.0.0.1:1 failed.",
    "[2025-05-28 09:43:{s:02d} TP{t}] Decode batch. #running-req: 1, #token: 20, #queue-req: 0, ",
    "E0528 09:43:41.1 1 worker_pool.cpp:271] Worker: Process failed: transport retry counter exceeded",
    "ib_mlx5_dv.c:433  UCX  ERROR   something failed",
    "Fatal Python error: Segmentation fault",
    "[host:1:2:3] Caught signal 11 (Segmentation fault: x)",
    "Exception in thread Thread-5 (transfer_worker):\nTraceback (most recent call last):\n"
    '  File "/x/disaggregation/c.py", line 1, in f\nValueError: boom',
    'Traceback (most recent call last):\n  File "/x.py", line 1, in f\nKeyError: 1',
    "a plain undated line",
    "",
)


@pytest.mark.parametrize("wrapper", ["", "[pod/decode-0/sglang] "])
def test_crashes_and_the_dated_lines_before_them_come_out_the_same_however_the_file_is_cut(
    tmp_path: Path, wrapper: str
):
    """Random logs of crashes (which name no time), dated lines, glog, UCX and tracebacks: blocks of 1, 7, 64 and
    300 bytes give what one whole read gives, each dated line at most once (a review's fuzzing found 55 of 300
    logs that differed, and a line handed on twice)."""
    rng = random.Random(7)
    log = tmp_path / "decode.log"
    for _ in range(60):
        pieces = [rng.choice(CRASH_SHAPES).format(s=rng.randint(0, 59), t=rng.randint(0, 3)) for _ in range(30)]
        log.write_text("\n".join(wrapper + line for piece in pieces for line in piece.split("\n")) + "\n")
        whole = _read_all(log, 1 << 20)
        for block_bytes in (1, 7, 64, 300):
            assert _read_all(log, block_bytes) == whole, log.read_text()


def test_a_crash_after_an_undated_error_takes_the_dated_line_before_both(tmp_path: Path):
    """UCX's error, then the fatal signal: the crash took the last marked dated line's time and rank (09:00:01,
    TP0), not the line just before the error's (09:43:50, TP1)."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2025-05-28 09:00:01 TP0] Session 10.0.0.1:1 failed.\n[2025-05-28 09:43:50 TP1] Load weight end.\n"
        "ib_mlx5_dv.c:433  UCX  ERROR   mlx5dv_devx_obj_modify failed: Remote I/O error\n"
        "Fatal Python error: Segmentation fault\n"
    )
    reader = LogReader(log)

    assert reader.read(final=True)[-2:] == [
        "[2025-05-28 09:43:50 TP1] Load weight end.",
        "Fatal Python error: Segmentation fault",
    ]
    reader.close()


def test_a_followed_log_copied_and_truncated_then_written_alike_loses_no_line(tmp_path: Path):
    """logrotate's copytruncate, then lines as long as the old ones: the bytes before the read position matched the
    old (SGLang's failure lines end alike), the rotation went unseen and the new lines before it were lost."""

    def failure(second: int, room: int) -> str:
        return (
            f"[2026-03-05 09:01:0{second} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r{room}' "
            f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): Failed to "
            "get kvcache from prefill instance, it might be dead\n"
        )

    log = tmp_path / "decode.log"
    log.write_text(failure(1, 1001) + failure(2, 1002))
    reader = LogReader(log)
    first = reader.read()
    log.write_text(failure(3, 1003) + failure(4, 1004) + failure(5, 1005))  # truncated in place, written again

    again = reader.read()

    assert [line.split("bootstrap_room=")[1][:4] for line in first + again] == ["1001", "1002", "1003", "1004", "1005"]
    assert reader.stats.rotations == 1


def test_no_marker_can_hide_a_traceback_or_a_crash_from_the_scan():
    """A line is searched for a traceback or a crash only where the scan found one of their markers: no other
    marker may overlap the start of one of their words (a leftmost-first match would hide it), and each word holds
    one of those markers."""
    words = (TRACEBACK, THREAD_DEATH, *_CRASH_WORDS)
    for word in words:
        assert any(MARKERS[index] in word for index in _SPECIAL), word
    for index, marker in enumerate(MARKERS):
        if index in _SPECIAL:
            continue
        for word in words:
            assert word not in marker
            assert not any(word.startswith(marker[cut:]) for cut in range(1, len(marker))), (marker, word)


def test_a_traceback_a_record_logs_after_another_marker_comes_out_whole(tmp_path: Path):
    """`Scheduler hit an exception: Traceback ...`: the scan's first marker of the line is not the traceback's, the
    traceback's lines come out with it all the same."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-01-02 03:04:05 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/scheduler.py", line 9, in run\n'
        "KeyError: 42\n"
        "[2026-01-02 03:04:06 TP0] next\n"
    )
    lines, count, _ = _read_all(log, 1 << 20)
    assert count == 4
    assert lines == [
        "[2026-01-02 03:04:05 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/scheduler.py", line 9, in run\nKeyError: 42'
    ]


@pytest.mark.parametrize("path", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("scan_bytes", [1, 50, 4096])
def test_a_block_scanned_in_pieces_gives_the_lines_of_one_scan(
    path: Path, scan_bytes: int, monkeypatch: pytest.MonkeyPatch
):
    whole = _read_all(path, 1 << 20)
    monkeypatch.setattr(reader, "SCAN_BYTES", scan_bytes)
    assert _read_all(path, 1 << 20) == whole
