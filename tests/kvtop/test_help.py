"""Every command's `--help`, walked in this process: each option it names is one the command takes, and every
option it takes has help."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from kvtop_cli import kvtop_here
from typer._click.core import Command  # Typer vendors Click: its classes live here
from typer.core import TyperGroup, TyperOption

from kvtop.cli.app import command_line
from kvtop.cli.sidecar_cmd import sidecar_app

NAMED = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
QUOTED = re.compile(r"`[^`]*`")
"""A command line quoted in help (`kvtop record --out`, SGLang's `--enable-metrics`) names another's options."""


def commands(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Command]]:
    """`command` and every command below it, each with the words that run it."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in sorted(command.commands.items()):
            yield from commands(sub, (*path, name))


COMMANDS = [*commands(typer.main.get_command(command_line()))]
SIDECAR = typer.main.get_command(sidecar_app)


def taken(command: Command) -> set[str]:
    """Every option name the command takes (--no-x forms and -h included)."""
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"-h", "--help"}


def named(command: Command) -> set[str]:
    """The options the command's help names (its text and its options' help, as written: Click's wrapping may
    break a name at its hyphen), leaving out quoted command lines."""
    texts = [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
    return set(NAMED.findall(QUOTED.sub("", "\n".join(texts))))


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(path) or "kvtop" for path, _ in COMMANDS])
def test_help_names_only_options_the_command_takes_and_every_option_has_help(
    path: tuple[str, ...], command: Command
) -> None:
    """`kvtop ... --help` exits 0; every --option in it is the command's own; each of its options has help."""
    shown = kvtop_here(*path, "--help")

    assert shown.returncode == 0, shown.stderr
    assert named(command) - taken(command) == set()
    assert [p.name for p in command.params if isinstance(p, TyperOption) and not p.hidden and not p.help] == []


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(path) or "kvtop" for path, _ in COMMANDS])
def test_a_repeatable_option_names_what_one_takes_not_a_python_list(path: tuple[str, ...], command: Command) -> None:
    """`--sglang-log <list[str]>` read as one list (`--sglang-log a.log,b.log`: `does not exist`) in Python's words:
    a repeatable option names what one occurrence takes, as the errors do (`--sglang-log FILE`)."""
    shown = kvtop_here(*path, "--help").stdout

    assert "<list[" not in shown


def test_the_source_options_name_what_they_take_as_the_errors_do() -> None:
    """The error of a view given no source says `--bootstrap ADDR ..., --connect EP, --sglang-log FILE, --replay
    DIR`; the help said `<str>` and `<list[str]>`."""
    shown = " ".join(kvtop_here("status", "--help").stdout.split())

    options = ("--bootstrap ADDR", "--relay ADDR", "--connect EP", "--sglang-log FILE", "--replay DIR|FILE", "--at T")
    for option in options:
        assert option in shown


def test_the_log_sidecars_help_names_only_its_own_options() -> None:
    """`kvtop agent --sglang-log FILE --help` is the sidecar's help, and names only what the sidecar takes."""
    shown = kvtop_here("agent", "--sglang-log", "x.log", "-h")

    assert shown.returncode == 0, shown.stderr
    assert "Follow one SGLang server's log" in shown.stdout
    assert named(SIDECAR) - taken(SIDECAR) == set()
    assert [p.name for p in SIDECAR.params if isinstance(p, TyperOption) and not p.help] == []


def test_h_and_version_work_from_the_top() -> None:
    """`kvtop -h` is `kvtop --help`; `kvtop --version` prints the version and exits 0."""
    from kvtop import __version__

    assert kvtop_here("-h").stdout == kvtop_here("--help").stdout
    assert kvtop_here("--version").stdout == f"kvtop {__version__}\n"


@pytest.mark.parametrize("word", sorted(typer.main.get_command(command_line()).commands))
def test_a_command_built_alone_is_the_command_of_the_whole_app(word: str) -> None:
    """`kvtop WORD ...` builds only WORD's module: that app has WORD with the same options (and subcommands) as
    the app of every command, so no command is missing from, or different in, the one a user runs."""

    def shape(command: Command) -> list[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
        return [(path, sorted(tuple(param.opts) for param in sub.params)) for path, sub in commands(command)]

    whole = typer.main.get_command(command_line()).commands[word]
    alone = typer.main.get_command(command_line(word))

    assert isinstance(alone, TyperGroup)
    assert shape(alone.commands[word]) == shape(whole)
