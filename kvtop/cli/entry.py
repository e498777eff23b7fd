"""The `kvtop` command's entry point: a Ctrl-C while kvtop's modules load (about half a second) is one line and
the exit code a Ctrl-C gets later (130; `kvtop check`: its UNKNOWN verdict, 3), not a traceback."""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType

_SAID = "interrupted before the source was judged"


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    args = sys.argv[1:]
    if args[:1] != ["check"]:
        print("kvtop: interrupted before it began", file=sys.stderr)
        raise SystemExit(130)
    if "--json" in args:
        print(json.dumps({"verdict": "UNKNOWN", "summary": _SAID, "problems": [_SAID], "exit_code": 3}, indent=2))
    else:
        print(f"KVTOP UNKNOWN - {_SAID}")
    raise SystemExit(3)


def main() -> None:
    """Load the command line with Ctrl-C said plainly, then run it (`kvtop.cli.app.main`)."""
    signal.signal(signal.SIGINT, _interrupted_while_loading)
    from kvtop.cli.app import main as run_command

    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_command()
