"""kvtop's plain option coercion (`kvtop.cli.coercion`) gives every option of every command what Typer's own
(pydantic's) gives: the same value of the same type, or the same usage error."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import typer.core
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from kvtop.cli.app import command_line
from kvtop.cli.coercion import PlainCoercion, read_plainly

SPELLINGS = ("5", "0", "-0", "007", "-3", "0.05", "2.5", "86400", "86401", "1e3", "nan", "inf", " 5", "5 ", "+5",
             "1_000", "5.", ".5", "", "abc", "0x10", "99999999999999999999", "1.00000000000000000000001",
             "0.123456789012345", "123456789012345.999999999999999", "999999999999999999")  # fmt: skip
"""What a command line may give an option (the plain reader takes some, Typer reads the others)."""
TYPED = (0, 3, -1, 0.0, 2.5, 1e9, math.inf, True, False, [], ["a", "b"], ("a",), ("a", 1), "x")
"""What a default may be."""


def plain_options() -> Iterator[tuple[str, typer.core._TyperParameter, Context]]:
    """Every option of every kvtop command that reads plainly, with the command's name and a context."""
    group = typer.main.get_command(command_line(""))
    ctx = Context(group, info_name="kvtop", help_option_names=["-h", "--help"])
    read_plainly(group, ctx)

    def walk(command: typer.core.TyperCommand, path: str) -> Iterator[tuple[str, typer.core._TyperParameter, Context]]:
        for parameter in command.get_params(ctx):
            if isinstance(parameter._runtime_param, PlainCoercion):  # type: ignore[attr-defined]
                yield path, parameter, ctx  # type: ignore[misc]
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    return walk(group, "kvtop")  # type: ignore[arg-type]


def outcome(coerce: object, value: object, parameter: typer.core._TyperParameter, ctx: Context) -> tuple[object, ...]:
    """The value (and its type, and its items' types) or the usage error a coercion gives."""
    try:
        got = coerce.coerce(value, param=parameter, ctx=ctx)  # type: ignore[attr-defined]
    except BadParameter as error:
        return ("error", error.format_message())
    items = tuple(type(item) for item in got) if isinstance(got, (list, tuple)) else ()
    return ("value", type(got), repr(got), items)


def test_every_plain_option_reads_every_spelling_as_typer_does() -> None:
    """Every plain option by every spelling and default above: no difference in value, type or error."""
    differences, checked = [], 0
    for path, parameter, ctx in plain_options():
        typers = build_runtime_param(parameter.type_descriptor)
        values: tuple[object, ...] = (*SPELLINGS, *TYPED, None, list(SPELLINGS[:3]), tuple(SPELLINGS[:2]))
        for value in values:
            ours = outcome(parameter._runtime_param, value, parameter, ctx)  # type: ignore[attr-defined]
            theirs = outcome(typers, value, parameter, ctx)
            checked += 1
            if ours != theirs:
                differences.append(f"{path} {parameter.name} {value!r}: {ours} != {theirs}")
    assert checked > 1000
    assert differences == []


def check_option(name: str) -> tuple[typer.core._TyperParameter, Context]:
    """`kvtop check`'s option `name` (its parameter's name) and a context."""
    return next((parameter, ctx) for path, parameter, ctx in plain_options()
                if path == "kvtop check" and parameter.name == name)  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value", "read"),
    [("window", "5", 5.0), ("window", "60.5", 60.5), ("window", 60, 60.0), ("max_stuck", "3", 3),
     ("bootstrap", "tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"), ("incident_class", ("a=1",), ["a=1"]),
     ("as_json", True, True), ("max_abort_rate", None, None)],
)  # fmt: skip
def test_a_plain_value_is_read_without_typers_coercion(option: str, value: object, read: object) -> None:
    """What a command line gives most (and the defaults) is read here: Typer's coercion, and pydantic with it, is
    never built."""
    parameter, ctx = check_option(option)
    coercion = parameter._runtime_param  # type: ignore[attr-defined]

    got = coercion.coerce(value, param=parameter, ctx=ctx)

    assert (got, type(got)) == (read, type(read))
    assert coercion._typers is None
