"""`kvtop top` refuses to run without a terminal on stdout (it drew escape codes into the file until killed) or on
stdin (no key reached it: it quit only by a signal); bare `kvtop` prints status lines instead."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import threading
from pathlib import Path

import pytest
from cluster_support import KVTOP
from kvtop_cli import kvtop_here


def test_top_without_a_terminal_exits_2_pointing_at_the_line_views(tmp_path: Path):
    log = tmp_path / "decode.log"
    log.write_text("[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 1, #prealloc-req: 0, #transfer-req: 0, \n")

    done = kvtop_here("top", "--sglang-log", str(log))

    assert done.returncode == 2
    assert done.stdout == ""
    said = "kvtop top: the dashboard needs a terminal on stdin and stdout (stdin and stdout: not one); for lines: "
    assert done.stderr.startswith(said + "kvtop status --follow")


def _in_a_terminal_without_keys(*args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """`kvtop ARGS < /dev/null` with stdout (only) a terminal; its result, and what it drew on that terminal."""
    primary, secondary = pty.openpty()
    drawn: list[bytes] = []

    def drain() -> None:  # a terminal takes what is written, or the writer blocks
        with contextlib.suppress(OSError):  # EIO once every writer closed its end
            while chunk := os.read(primary, 65536):
                drawn.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run([KVTOP, *args], stdin=subprocess.DEVNULL, stdout=secondary, stderr=subprocess.PIPE,
                              text=True, timeout=timeout_s, check=False)  # fmt: skip
    finally:
        os.close(secondary)
        reader.join(10)
        os.close(primary)
    return done, b"".join(drawn)


@pytest.mark.processes
def test_top_without_a_terminal_on_stdin_exits_2_instead_of_waiting_for_keys(tmp_path: Path):
    """`kvtop top < /dev/null` in a terminal opened the dashboard, which no key could reach: only a signal quit it."""
    log = tmp_path / "decode.log"
    log.write_text("[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 1, #prealloc-req: 0, #transfer-req: 0, \n")

    done, drawn = _in_a_terminal_without_keys("top", "--sglang-log", str(log), timeout_s=30)

    assert done.returncode == 2
    assert done.stderr.startswith("kvtop top: the dashboard needs a terminal on stdin and stdout (stdin: not one)")
    assert drawn == b""


@pytest.mark.processes
def test_bare_kvtop_without_a_terminal_on_stdin_prints_status_lines(tmp_path: Path):
    """As with stdout not a terminal: the cluster runs and says how it goes in lines, not in a dashboard no key can
    quit."""
    done, drawn = _in_a_terminal_without_keys("--prefill", "1", "--decode", "1", "--tp", "1", "--duration", "2",
                                              "--fault", "none", timeout_s=120)  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert b"\x1b[?1049h" not in drawn  # the dashboard's alternate screen
    assert b"done: " in drawn
