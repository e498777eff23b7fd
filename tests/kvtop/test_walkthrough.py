"""The README's 03:00 walkthrough runs as written: each one-shot command of it, on the fixture logs it names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from kvtop_cli import kvtop

pytestmark = pytest.mark.processes

README = Path(__file__).parents[2] / "README.md"


def walkthrough() -> tuple[list[str], list[tuple[list[str], str]]]:
    """The walkthrough's `LOGS` arguments, and each `kvtop` command with the output line the README shows for it
    ("" where it shows none); `kvtop top` (the dashboard) is left out."""
    text = README.read_text()
    block = re.search(r"## At 03:00.*?```sh\n(.*?)```", text, re.S)
    assert block, "the README has no walkthrough"
    lines = block[1].splitlines()
    words = shlex.split(shlex.split(lines[0].removeprefix("LOGS="))[0])
    logs = [word if word.startswith("--") else str(README.parent / word) for word in words]  # from any folder
    commands: list[tuple[list[str], str]] = []
    for index, line in enumerate(lines[1:], start=1):
        if not line.startswith("kvtop ") or line.startswith("kvtop top "):
            continue
        args = shlex.split(line.split("#", 1)[0])[1:]
        shown = lines[index + 1] if index + 1 < len(lines) and lines[index + 1].startswith("# ") else ""
        commands.append(([arg for a in args for arg in (logs if a == "$LOGS" else [a])], shown[2:]))
    return logs, commands


def test_the_walkthrough_runs_as_the_readme_shows_it():
    logs, commands = walkthrough()
    assert logs and all(Path(path).exists() for path in logs[1::2])
    assert [args[0] for args, _ in commands] == ["check", "incidents", "failures", "events"]
    for args, shown in commands:
        done = kvtop(*args)
        assert done.returncode == (2 if args[0] == "check" else 0), done.stderr
        words = [word for word in shown.replace("...", " ").split() if word]
        assert all(word in done.stdout for word in words), (shown, done.stdout)
    failures = kvtop("failures", *logs, "--debug").stdout
    assert any(line.split()[:3:2] == ["echo", "decode-0/TP1"] for line in failures.splitlines())
