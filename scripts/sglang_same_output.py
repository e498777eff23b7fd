"""Whether two trees of kvtop read the SGLang fixture logs alike: `kvtop failures --json` and `kvtop incidents
--json` on every folder under tests/kvtop/fixtures/sglang (its logs together), and on any more logs given, run
with each tree's code (`PYTHONPATH`), compared byte for byte (stdout, stderr, exit status). Prints each
difference; exits 1 on any. For a change to the log reader that must read nothing differently. Not part of the
tests.

    git archive 63a7042 | tar -x -C /tmp/before
    .venv/bin/python scripts/sglang_same_output.py /tmp/before .
    .venv/bin/python scripts/sglang_same_output.py /tmp/before . --log decode=/tmp/decode.log
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "kvtop" / "fixtures" / "sglang"
COMMANDS = ("failures", "incidents")


def _run(tree: Path, command: str, logs: list[str]) -> tuple[bytes, bytes, int]:
    arguments = [item for log in logs for item in ("--sglang-log", log)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(  # in the tree: `-m` puts the working folder before PYTHONPATH
        [sys.executable, "-m", "kvtop", command, "--json", *arguments],
        capture_output=True, env=env, timeout=600, cwd=tree,
    )  # fmt: skip
    return done.stdout, done.stderr, done.returncode


def _absolute(log: str) -> str:
    """ROLE=FILE (or FILE) with FILE absolute: the commands run in each tree."""
    role, _, path = log.rpartition("=")
    return f"{role}={Path(path).resolve()}" if role else str(Path(path).resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=lambda text: Path(text).resolve(), help="the tree of the code before")
    parser.add_argument("after", type=lambda text: Path(text).resolve(), help="the tree of the code after")
    parser.add_argument("--log", action="append", default=[], help="one more log (ROLE=FILE) to read alone")
    options = parser.parse_args()
    cases = [sorted(str(log) for log in folder.glob("*.log")) for folder in sorted(FIXTURES.iterdir())]
    cases += [[_absolute(log)] for log in options.log]
    differ = 0
    for logs in cases:
        for command in COMMANDS:
            before, after = _run(options.before, command, logs), _run(options.after, command, logs)
            if before != after:
                differ += 1
                print(f"DIFFERS: {command} on {' '.join(logs)} (exit {before[2]} -> {after[2]})")
    print(f"{len(cases) * len(COMMANDS)} outputs compared, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
