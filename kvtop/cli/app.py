"""`kvtop`: one Typer app. Commands parse their options and hand off; heavy imports stay lazy.

Exit codes: 0 success (a reader of stdout that stopped reading, `| head -1`,
included); 1 the work ran but failed (a benchmark whose rooms
failed, a cluster that did not come up, a view no agent answered, a dashboard
that failed); 2 bad usage
(unknown option, bad value). `kvtop check` uses Nagios codes instead: 0 OK,
1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments included).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import math
import os
import sys

import typer
from typer._click.exceptions import BadParameter, ClickException, NoSuchOption, UsageError  # Typer vendors Click

from kvtop.cli.coercion import PlainGroup
from kvtop.cli.options import INTERRUPTED, INTERRUPTION_SAID, quiet_stdout

HELP = ["-h", "--help"]
"""Every command's help options (subcommands inherit them from the app's context)."""

_MODULES = ("bench_cmds", "local_cmds", "agent_cmd", "views", "top_cmd", "export_cmd", "relay_cmd", "record_cmd",
            "keys_cmd")  # fmt: skip
"""The modules of kvtop's commands (each has `register(app)`), in the order `kvtop --help` lists their commands."""
_HOME = {
    "bench": "bench_cmds",
    "cluster": "local_cmds",
    "bootstrap": "local_cmds",
    "agent": "agent_cmd",
    **dict.fromkeys(("incidents", "status", "ranks", "rooms", "events", "failures", "check"), "views"),
    "top": "top_cmd",
    "export": "export_cmd",
    "relay": "relay_cmd",
    "record": "record_cmd",
    "dump": "record_cmd",
    "keys": "keys_cmd",
}
"""The module that registers each command (or group of commands) by its word on the command line."""


def command_line(word: str = "") -> typer.Typer:
    """kvtop's Typer app. Given the command's word (`check`, `cluster`), only that command's module is imported
    and registered, so `kvtop check` loads and builds its own command, not thirty and the bench, the recorder and
    bare kvtop's options with them; every command for anything else (bare `kvtop`, its options, `--help`, a word
    that names no command)."""
    app = typer.Typer(
        help="top for KV transfers: watch, triage and check prefill/decode disaggregated serving clusters.\n\n"
        "With no command, kvtop starts an embedded local cluster (prefill and decode agents on loopback, "
        "a workload and a few injected faults) and opens the dashboard on it.",
        invoke_without_command=True,
        no_args_is_help=False,
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": HELP},
        cls=PlainGroup,
    )
    home = _HOME.get(word)
    for module in (home,) if home else _MODULES:
        importlib.import_module(f"kvtop.cli.{module}").register(app)
    if home not in (None, "local_cmds"):  # bare kvtop's callback: a group of one command is still `kvtop WORD`
        app.callback()(_one_command)
    return app


def _one_command() -> None:
    """The group's callback when only one command's module is registered: no options of its own."""


NAGIOS_UNKNOWN = 3
_SOURCE_OPTIONS = ("--sglang-log", "--bootstrap", "--connect", "--replay")
"""What the views read from; bare `kvtop` starts a cluster of its own and takes none of them."""


def usage_hint(error: UsageError, args: list[str]) -> str:
    """What the user most likely meant, for three mistakes Click's words do not explain ("" for any other)."""
    if (
        isinstance(error, NoSuchOption)
        and error.option_name in _SOURCE_OPTIONS
        and not (error.ctx and error.ctx.parent)
    ):
        return (
            f"Hint: {error.option_name} is a view's: kvtop top {error.option_name} ... opens the dashboard on it "
            f"(kvtop status, failures, incidents, check ... too); kvtop alone starts a local cluster."
        )
    if "unexpected extra argument" in error.message and "--sglang-log" in args:
        return "Hint: one file per --sglang-log: --sglang-log a.log --sglang-log b.log (a shell glob gives several)."
    if error.message == "No such command 'sidecar'.":
        return "Hint: the log sidecar is kvtop agent --sglang-log FILE (its options: add --help)."
    return ""


def say_not_a_number(error: UsageError) -> None:
    """`--wait nan` is no number, not one past a bound: Typer's check of bounds said `Input should be less than or
    equal to 86400` (NaN fails every comparison). A validator's words (`--role middle`) lose pydantic's prefix."""
    errors = getattr(error.__cause__, "errors", None)  # Typer's BadParameter is raised from Pydantic's error
    given = errors()[0].get("input") if callable(errors) else None
    if isinstance(error, BadParameter) and isinstance(given, str) and _is_nan(given):
        error.message = f"{given!r} is not a number"
    elif isinstance(error, BadParameter):  # a validator's own words, without pydantic's `Value error, ` before them
        error.message = error.message.removeprefix("Value error, ")


def _is_nan(text: str) -> bool:
    try:
        return math.isnan(float(text))
    except ValueError:
        return False


def main() -> None:
    """Console entry point: exits with the code the command returned; usage errors exit 2, except for
    `kvtop check`, whose bad arguments are UNKNOWN (3)."""
    # kvtop does no linear algebra: idle OpenBLAS threads only compete for the cores that move KV.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    writable_anywhere()
    sys.exit(run(sys.argv[1:]))


def writable_anywhere() -> None:
    """A character the terminal's encoding lacks is written as its escape (`\\u2013`), not a traceback (exit 1): in a
    latin-1 locale a log's reason quoting any other script broke `kvtop events` (an ASCII locale never did: Click
    writes UTF-8 there)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def run(args: list[str]) -> int:
    """Run `kvtop ARGS`; returns the exit code (Click's standalone handling, with check's usage errors at 3)."""
    try:
        if (sidecar := _sidecar_args(args)) is not None:  # the log sidecar (`kvtop agent --sglang-log FILE ...`)
            from kvtop.cli.sidecar_cmd import main as sidecar_main

            return sidecar_main(sidecar)
        code = command_line(args[0] if args else "")(args, prog_name="kvtop", standalone_mode=False)
    except SystemExit as stop:
        if not _reader_went_away(stop.__context__):  # Typer's exit 1 when stdout's reader went away
            raise
        return _reader_gone(args)
    except UsageError as error:
        say_not_a_number(error)
        error.show()
        if hint := usage_hint(error, args):
            typer.echo(hint, err=True)
        if error.ctx is None or error.ctx.command.name != "check":
            return error.exit_code
        from kvtop.cli.views import print_verdict
        from kvtop.views.check import Thresholds, unknown

        return print_verdict(unknown(f"bad arguments: {error.format_message()}"), Thresholds(), "--json" in args)
    except ClickException as error:
        error.show()
        return error.exit_code
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        return 1
    except KeyboardInterrupt:  # before Typer ran the command (the sidecar's, its modules imported)
        return _interrupted(args)
    except OSError as error:
        if _reader_went_away(error):  # the sidecar's output
            return _reader_gone(args)
        if error.errno not in _OUTPUT_LOST:
            raise
        return _output_lost(error, 3 if args[:1] == ["check"] else 1)
    code = int(code) if isinstance(code, int) else 0
    if code == INTERRUPTED and (args[:1] == ["check"] or not INTERRUPTION_SAID.is_set()):
        return _interrupted(args)  # Typer's exit for a Ctrl-C it caught (in a command's start): it said nothing
    return code


def _sidecar_args(args: list[str]) -> list[str] | None:
    """The sidecar's arguments when `args` ask for it (`kvtop.cli.agent_cmd.sidecar_args`), else None."""
    if args[:1] != ["agent"]:
        return None
    from kvtop.cli.agent_cmd import sidecar_args

    return sidecar_args(args)


def _interrupted(args: list[str]) -> int:
    """Ctrl-C before the command began its work: one line (`check`: its UNKNOWN verdict, where monitoring reads
    it), no traceback; exit 130 (`check`: 3)."""
    from kvtop.cli.views import print_verdict

    if args[:1] != ["check"]:
        typer.echo("kvtop: interrupted before it began", err=True)
        return INTERRUPTED
    from kvtop.views.check import Thresholds, unknown

    return print_verdict(unknown("interrupted before the source was judged"), Thresholds(), "--json" in args)


_OUTPUT_LOST = (errno.ENOSPC, errno.EIO, errno.EDQUOT)
"""What writing the output raises when it cannot go on: a full disk or quota, a terminal that went away."""


def _reader_went_away(error: BaseException | None) -> bool:
    """Whether `error` is stdout's reader gone (`kvtop events | head -1`: a broken pipe)."""
    return isinstance(error, OSError) and error.errno == errno.EPIPE


def _reader_gone(args: list[str]) -> int:
    """stdout's reader had what it wanted: not kvtop's failure, so 0, silently (`check`: UNKNOWN when it goes
    before the verdict was written; `print_verdict` keeps the verdict's code once it was judged)."""
    quiet_stdout()
    return 3 if args[:1] == ["check"] else 0


def _output_lost(error: OSError, code: int) -> int:
    """Say that the output could not be written (on stderr, if it can take it), keep the interpreter's last flush
    of stdout from raising again; returns `code` (1, or a check's UNKNOWN: never a verdict it did not give)."""
    quiet_stdout()
    with contextlib.suppress(OSError):
        typer.echo(f"kvtop: cannot write its output: {error.strerror}", err=True)
    return code


if __name__ == "__main__":
    main()
