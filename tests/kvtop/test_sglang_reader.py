"""The block reader: the same lines whatever the block size, and lines too long to be lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtop.sources.sglang.reader import MAX_LINE_BYTES, LogReader

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


def test_a_line_longer_than_the_limit_is_counted_garbled_and_reading_goes_on(tmp_path: Path):
    log = tmp_path / "decode.log"
    failure = "[2026-01-02 00:00:01 TP0] Session 10.0.0.1:1234 failed."
    log.write_bytes(b"x" * (MAX_LINE_BYTES + 10) + b"\n" + failure.encode() + b"\n")
    reader = LogReader(log, block_bytes=1 << 16)
    assert reader.read(final=True, max_bytes=1 << 40) == [failure]
    assert reader.stats.garbled == 1
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
