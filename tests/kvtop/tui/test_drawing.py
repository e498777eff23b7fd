"""The dashboard on a terminal whose encoding lacks its box characters: ASCII stand-ins as wide as what they stand
for, so its rows line up, where escapes (`\\u2501`, six cells each) broke every row."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from kvtop.tui.drawing import ERRORS, stand_in

DRAWN = "━╸╺│└┼▔▏▐█▇▅▁░▒▓…·—▶▼✗é字µ½ǘ"
"""What the dashboard and Textual draw with (tab underline, borders, the footer's edge, sparklines, the heat map's
shades, a cut text's end, the failure tree's arrows), and text a peer may send."""
LOGS = Path(__file__).parent.parent / "fixtures" / "sglang" / "scheduler-crash"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_what_the_encoding_lacks_is_drawn_as_wide_ascii_stand_ins(encoding: str):
    """Each character keeps its cells (a wide one two `?`, a combining one none); what the encoding has stays."""
    written = DRAWN.encode(encoding, ERRORS).decode(encoding)

    assert cell_len(written) == cell_len(DRAWN)
    assert written.startswith("---|++-||#@*_:+@~")
    assert "\\" not in written
    if encoding == "latin-1":
        assert "·" in written and "é" in written and "µ" in written
    else:
        assert written.isascii() and "e??u?u" in written


def test_box_characters_stand_in_by_their_shape():
    assert [stand_in(char) for char in "─━═┃║╸╹┌╋╭\u2571\u2572\u2573"] == list("---||-|+++/\\X")


@pytest.mark.processes
@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_the_dashboard_on_a_terminal_of_another_encoding_draws_stand_ins_not_escapes(encoding: str):
    """`kvtop top` on SGLang logs, on an 80x24 pseudo-terminal whose encoding is latin-1 (or ASCII): its screen
    has its rules and tabs as `-`, not one `\\u2501`, and `q` quits it (exit 0)."""
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    logs = [f"--sglang-log=prefill={LOGS / 'prefill.log'}", f"--sglang-log=decode={LOGS / 'decode.log'}"]
    kvtop = subprocess.Popen(
        [sys.executable, "-m", "kvtop", "top", *logs],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "PYTHONIOENCODING": encoding, "TERM": "xterm-256color"},
    )
    os.close(terminal)
    screen = bytearray()
    reader = threading.Thread(target=_read, args=(main, screen), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not ("-" * 20 in (shown := _text(screen, encoding)) and "? Help" in shown) and "\\u" not in shown:
            assert kvtop.poll() is None and time.monotonic() < deadline, shown[-2000:]
            time.sleep(0.1)
        os.write(main, b"q")
        assert kvtop.wait(30) == 0
    finally:
        if kvtop.poll() is None:
            kvtop.kill()
            kvtop.wait()
        reader.join(5)
        os.close(main)

    shown = _text(screen, encoding)
    assert "\\u" not in shown
    assert "Overview [o]" in shown and "1 rank crashed" in shown


def _text(screen: bytearray, encoding: str) -> str:
    """What the terminal shows so far, without the cursor's moves and the styles."""
    return re.sub(r"\x1b\[[0-9;?<>=$]*[A-Za-z~]", "", bytes(screen).decode(encoding))


def _read(fd: int, into: bytearray) -> None:
    """Everything the terminal receives, until it closes."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.extend(chunk)
