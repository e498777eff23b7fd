"""Output that cannot be written (a full disk: /dev/full; a character the terminal's encoding lacks) is one line on
stderr and an exit code, or the character's escape: no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster

ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts" / "decode.log"
LOST_PREFILL = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill" / "decode.log"

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


def _recording(folder: Path) -> Path:
    recorder = Recorder(folder, keyframe_events=1000, flush_s=3600.0)
    feed(recorder, ClusterModel(), SyntheticCluster(spacing_s=0.001), passes=2, rooms_per_pass=20)
    recorder.close()
    return folder


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("events", "--debug", "--sglang-log", str(ABORTS)), 0),
        (("rooms", "--sglang-log", str(ABORTS)), 0),
        (("failures", "--debug", "--json", "--sglang-log", str(ABORTS)), 0),
        (("dump", "--replay", "REC"), 0),
        (("check", "--sglang-log", str(ABORTS)), 2),
    ],
    ids=["events", "rooms", "failures", "dump", "check"],
)
def test_a_reader_that_stopped_reading_is_no_failure(tmp_path: Path, args: tuple[str, ...], code: int):
    """`kvtop events --debug --replay DIR | head -1` exited 1, silently, where `kvtop rooms ... | head -1` exited 0:
    stdout's reader gone (its pipe closed before the first line) is exit 0, silently; a check's, its verdict."""
    args = tuple(str(_recording(tmp_path / "rec")) if arg == "REC" else arg for arg in args)
    read, write = os.pipe()
    os.close(read)  # the reader had enough before kvtop wrote anything
    with os.fdopen(write, "w") as stdout:
        done = subprocess.run([sys.executable, "-m", "kvtop", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                              timeout=60)  # fmt: skip

    assert (done.returncode, [line for line in done.stderr.splitlines() if "Broken pipe" in line]) == (code, [])
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["events", "failures"])
def test_a_terminal_whose_encoding_lacks_a_character_gets_its_escape(tmp_path: Path, command: str):
    """In a latin-1 locale a reason quoting another script (an en dash, CJK) was a UnicodeEncodeError traceback,
    exit 1; now the character's escape, in the line where it stood, and exit 0."""
    log = tmp_path / "decode.log"
    lines = LOST_PREFILL.read_text().splitlines(keepends=True)
    log.write_text("".join(line.replace("Lost connection", "Lost connection \u2013 \u8fde\u63a5") for line in lines))

    done = subprocess.run(
        [sys.executable, "-m", "kvtop", command, "--sglang-log", str(log)],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "latin-1"},
    )

    assert (done.returncode, b"Traceback" in done.stderr) == (0, False)
    assert b"Lost connection \\u2013 \\u8fde\\u63a5" in done.stdout
