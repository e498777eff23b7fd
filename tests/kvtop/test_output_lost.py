"""Output that cannot be written (a full disk: /dev/full) is one line on stderr and an exit code, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts" / "decode.log"

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's"),
]


@pytest.mark.parametrize(("command", "code"), [("status", 1), ("check", 3)])
def test_a_full_disk_under_stdout_is_one_line_and_exit_1_or_unknown_for_a_check(command: str, code: int):
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "kvtop", command, "--sglang-log", str(ABORTS)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )

    assert done.returncode == code
    assert done.stderr.splitlines()[-1] == "kvtop: cannot write its output: No space left on device"
    assert "Traceback" not in done.stderr
