"""`kvtop top` refuses to run without a terminal on stdout (it drew escape codes into the file until killed)."""

from __future__ import annotations

from pathlib import Path

from kvtop_cli import kvtop_here


def test_top_without_a_terminal_exits_2_pointing_at_the_line_views(tmp_path: Path):
    log = tmp_path / "decode.log"
    log.write_text("[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 1, #prealloc-req: 0, #transfer-req: 0, \n")

    done = kvtop_here("top", "--sglang-log", str(log))

    assert done.returncode == 2
    assert done.stdout == ""
    assert "kvtop top: the dashboard needs a terminal on stdout; for lines: kvtop status --follow" in done.stderr
