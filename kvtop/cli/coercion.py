"""Plain coercion of kvtop's options, so that a command line does not import pydantic.

Typer (0.2x) turns every option's value (its default included) into its Python type through a pydantic
`TypeAdapter`, built when the command runs: importing pydantic and building those adapters was a third of a
`kvtop check`'s start. Nearly all of kvtop's options are a `str`, a list of them, or an `int` or `float` within
bounds; `PlainCoercion` gives those their value the way pydantic would for the spellings it knows (`5`, `0.05`,
`-3`, a typed default) and hands any other value (`1e3`, `nan`, a value out of bounds, not a number) to Typer's
own coercion, built only then, so every error and every odd spelling reads exactly as Typer says it.
`tests/kvtop/test_coercion.py` holds both to the same results.

This leans on Typer's internals (`typer._coercion`, its parameters' `type_descriptor` and lazily built
`_runtime_param`): a Typer without `typer._coercion` reads every option itself (slower, same results), a parameter
without the others is left to Typer, and the test compares the two over every option of every command.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer.core

if TYPE_CHECKING:
    from typer._click import Command, Context, Parameter

try:
    from typer._coercion import build_runtime_param
except ImportError:  # a Typer without pydantic coercion (before 0.2x), or one that moved it: Typer reads every option
    build_runtime_param = None  # type: ignore[assignment]  # checked before use

_INTEGER = re.compile(r"-?[0-9]{1,18}")
_DECIMAL = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")
"""The spellings read here; any other goes to Typer (both read these alike: tests/kvtop/test_coercion.py)."""


def _flag(value: object) -> bool | None:
    return value if type(value) is bool else None


def _integer(value: object) -> int | None:
    if type(value) is int:
        return value
    if type(value) is str and _INTEGER.fullmatch(value):
        return int(value)
    return None


def _decimal(value: object) -> float | None:
    if type(value) in (int, float):
        return float(value)  # type: ignore[arg-type]  # an int or a float, checked
    if type(value) is str and _DECIMAL.fullmatch(value):
        return float(value)
    return None


def _text(value: object) -> str | None:
    return value if type(value) is str else None


def _texts(value: object) -> list[str] | None:
    if isinstance(value, (list, tuple)) and all(type(item) is str for item in value):
        return list(value)
    return None


_READERS: dict[object, Callable[[object], Any]] = {
    bool: _flag,
    int: _integer,
    float: _decimal,
    str: _text,
    list[str]: _texts,
}
"""How each plain annotation is read; None from a reader: not a spelling it knows (Typer reads it)."""


class PlainCoercion:
    """An option's coercion (Typer's `RuntimeParam` contract: `coerce(value, param, ctx)`) for a plain annotation,
    with its bounds; Typer's own, built on first need, for what it does not read."""

    def __init__(self, parameter: typer.core._TyperParameter, read: Callable[[object], Any]) -> None:
        self._parameter = parameter
        self._read = read
        info = parameter.type_descriptor.parameter_info
        self._min, self._max = info.min, info.max
        self._typers: Any = None
        """Typer's coercion of this option, once a value needed it."""

    def coerce(self, value: Any, param: Parameter, ctx: Context) -> Any:
        """`value` as the option's type, or Typer's coercion of it (its result, or its usage error)."""
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        read = self._read(value)
        if read is not None and (self._min is None or read >= self._min) and (self._max is None or read <= self._max):
            return read
        if self._typers is None:
            self._typers = build_runtime_param(self._parameter.type_descriptor)
        return self._typers.coerce(value, param=param, ctx=ctx)


def _plain_reader(parameter: Parameter) -> Callable[[object], Any] | None:
    """The reader for `parameter` when its value is a plain one (no parser, clamp, path, file or choice)."""
    descriptor = getattr(parameter, "type_descriptor", None)
    if descriptor is None or not hasattr(parameter, "_runtime_param"):
        return None
    info = descriptor.parameter_info
    if info.parser is not None or info.clamp or descriptor.is_path or descriptor.is_file or descriptor.is_choice:
        return None
    try:
        return _READERS.get(descriptor.annotation)
    except TypeError:  # an annotation that cannot be a key
        return None


def read_plainly(command: Command, ctx: Context) -> None:
    """Give `command`'s plain options (its help option included) and those of the commands below it
    `PlainCoercion`. `ctx` is the outermost command's: a command's help option is made once, with the names the
    context gives (a command's own context inherits them)."""
    for parameter in command.get_params(ctx):
        read = _plain_reader(parameter)
        if read is not None and parameter._runtime_param is None:  # type: ignore[attr-defined]  # checked above
            parameter._runtime_param = PlainCoercion(parameter, read)  # type: ignore[attr-defined, arg-type]
    if isinstance(command, typer.core.TyperGroup):
        for sub in command.commands.values():
            read_plainly(sub, ctx)


class PlainGroup(typer.core.TyperGroup):
    """kvtop's group (`typer.Typer(cls=PlainGroup)`): its commands' plain options read without pydantic."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if build_runtime_param is not None:
            read_plainly(self, ctx)
        return super().parse_args(ctx, args)
