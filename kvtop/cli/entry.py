"""The `kvtop` command's entry point: a Ctrl-C while kvtop's modules load (about half a second) is one line and
the exit code a Ctrl-C gets later (130), not a traceback; `kvtop check` says UNKNOWN (exit 3) wherever a Ctrl-C
lands before its verdict.

Those handlers write and exit at once instead of raising: an exception raised from a signal handler lands in
whatever code runs then, which may turn it into another (a class body's `__set_name__` makes any exception a
RuntimeError: a traceback, exit 1) or swallow it (a library's `except BaseException` around an import: the check
then waited out its `--wait`, seen in 1 of 400 tries under load). Nothing needs closing before kvtop's modules
are loaded, nor before a check's verdict (it reads, and writes nothing but the verdict).

A service (`_SERVICES`: the agent and its log sidecar, the relay, the exporter, the recorder, the bootstrap,
a local cluster) stopped by SIGTERM while it loads exits 0 with one line, as it does once it runs: a supervisor
that stops it at once (a rollout, a test's teardown) read exit -15 otherwise. That handler stays until the
command puts its own, and nothing it opens before needs closing (sockets bound, no registration made).
"""

from __future__ import annotations

import os  # os, signal and sys only: the interpreter has them loaded, so the handlers are in place at once
import signal
import sys
from types import FrameType

_SAID = "interrupted before the source was judged"
_SAID_JSON = (
    f'{{\n  "verdict": "UNKNOWN",\n  "summary": "{_SAID}",\n'
    f'  "problems": [\n    "{_SAID}"\n  ],\n  "exit_code": 3\n}}\n'
)
"""The JSON of that verdict, as `kvtop check --json` prints it (json is not loaded yet when it may be needed)."""


def _write_and_exit(fd: int, text: str, code: int) -> None:
    """Write `text` straight to `fd` (not through `sys.stdout`, whose buffer the interrupted code may be writing)
    and end the process with `code` now."""
    try:
        os.write(fd, text.encode())
    finally:  # also when the reader went away: the exit code still tells
        os._exit(code)


_SERVICES = frozenset({("agent",), ("relay",), ("export",), ("record",), ("bootstrap",), ("cluster", "up")})
"""The commands that document SIGTERM as a clean stop (exit 0), by their words on the command line."""


def _stopped_while_loading(signum: int, frame: FrameType | None) -> None:
    _write_and_exit(2, "kvtop: stopped before it began\n", 0)


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    _write_and_exit(2, "kvtop: interrupted before it began\n", 130)


def _check_interrupted(signum: int, frame: FrameType | None) -> None:
    """`kvtop check` before its verdict: UNKNOWN on stdout, where monitoring reads it."""
    _write_and_exit(1, _SAID_JSON if "--json" in sys.argv[1:] else f"KVTOP UNKNOWN - {_SAID}\n", 3)


def main() -> None:
    """Load the command line with Ctrl-C said plainly, then run it (`kvtop.cli.app.main`). `check` keeps its
    handler until its verdict (`kvtop.cli.views.run_check` then ignores SIGINT); every other command gets Python's
    KeyboardInterrupt once loaded (a view ends cleanly on it). A service's SIGTERM exits 0 until the command
    handles it."""
    judging = sys.argv[1:2] == ["check"]
    signal.signal(signal.SIGINT, _check_interrupted if judging else _interrupted_while_loading)
    if tuple(sys.argv[1:2]) in _SERVICES or tuple(sys.argv[1:3]) in _SERVICES:
        signal.signal(signal.SIGTERM, _stopped_while_loading)
    from kvtop.cli.app import main as run_command

    if not judging:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    run_command()
