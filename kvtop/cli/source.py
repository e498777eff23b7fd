"""The source options, declared once for every command that reads a source, and the source they open with
its errors as exit codes."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from kvtop.cli.options import (
    At,
    Bootstrap,
    Connect,
    CurveKeysDir,
    Model,
    ModelAt,
    Relay,
    ReplayPath,
    SGLangLog,
    Since,
    Until,
    Wait,
    fail,
)
from kvtop.source.spec import ModelChoice, SourceSpec
from kvtop.source.when import pick
from kvtop.views.safe import terminal_safe

if TYPE_CHECKING:
    from kvtop.source.base import Source

Command = TypeVar("Command", bound=Callable[..., Any])

_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("bootstrap", Bootstrap, ""),
    ("relay", Relay, ""),
    ("connect", Connect, []),
    ("sglang_log", SGLangLog, []),
    ("replay", ReplayPath, ""),
    ("at", At, ""),
    ("since", Since, ""),
    ("until", Until, ""),
    ("model", Model, False),
    ("model_at", ModelAt, ""),
    ("wait", Wait, 2.0),
    ("curve_keys", CurveKeysDir, ""),
)
_SPAN = ("since", "until")


def reads_source(span: bool = True) -> Callable[[Command], Command]:
    """Give a command the source options (`span=False`: without --since/--until) in place of its `source`
    parameter, which receives them as one checked `SourceSpec` (a usage error when they do not fit together;
    a command's own `follow` option takes part: following needs a source that gains)."""
    options = [option for option in _OPTIONS if span or option[0] not in _SPAN]

    def wrap(command: Command) -> Command:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(command, include_extras=True)
        own = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values() if p.name != "source"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
                 for name, kind, default in options]  # fmt: skip

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            chosen = {name: given.pop(name) for name, _, _ in options}
            return command(source=spec_of(follow=bool(given.get("follow", False)), **chosen), **given)

        run.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
        return typing.cast(Command, run)

    return wrap


def spec_of(
    bootstrap: str = "",
    connect: list[str] | None = None,
    sglang_log: list[str] | None = None,
    replay: str = "",
    at: str = "",
    since: str = "",
    until: str = "",
    model: bool = False,
    model_at: str = "",
    wait: float = 2.0,
    curve_keys: str = "",
    follow: bool = False,
    relay: str = "",
) -> SourceSpec:
    """The spec the options name, checked (a usage error names the option at fault); `relay` is taken as a
    bootstrap address is, its errors naming a relay."""
    bootstrap, relay = _one_address(bootstrap, relay)
    try:
        when = pick(at, since, until)
        dashboard = ModelChoice(model_at) if model or model_at else None
        spec = SourceSpec(bootstrap or relay, tuple(connect or ()), tuple(sglang_log or ()), replay, when, dashboard,
                          wait, curve_keys, "relay" if relay else "bootstrap")  # fmt: skip
        return spec.checked(follow)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _one_address(bootstrap: str, relay: str) -> tuple[str, str]:
    """--bootstrap or --relay: the one given on the command line when the other comes from its environment
    variable (`KVTOP_BOOTSTRAP` exported, `--relay ADDR` typed); a usage error when both are given alike."""
    if not (bootstrap and relay):
        return bootstrap, relay
    from_env = {os.environ.get("KVTOP_BOOTSTRAP") == bootstrap, os.environ.get("KVTOP_RELAY") == relay}
    if from_env == {True, False}:
        return ("", relay) if os.environ.get("KVTOP_BOOTSTRAP") == bootstrap else (bootstrap, "")
    raise typer.BadParameter("give --bootstrap or --relay, not both (a relay lists the agents itself)")


@contextlib.contextmanager
def reading(spec: SourceSpec, tail: bool = False, journal: bool = False) -> Iterator[Source]:
    """`open_source` (`tail`, `journal` as it says), its errors one line on stderr: exit 1 when a cluster or a
    dashboard's model does not answer, 2 when what was given cannot be used (an unreadable log, recording or key
    folder) or several dashboards' models run and none was named."""
    from kvtop.attach.errors import ModelAmbiguous, ModelUnavailable
    from kvtop.source import SourceError, open_source
    from transport.errors import BootstrapError

    try:
        with open_source(spec, tail=tail, journal=journal) as source:
            yield source
    except (BootstrapError, ModelUnavailable) as error:
        raise fail(str(error)) from None
    except ModelAmbiguous as error:
        raise fail(str(error), 2) from None
    except SourceError as error:
        raise fail(str(error), error.code) from None


def say_what_was_heard(source: Source, follow: bool = False) -> str:
    """The source's notes on stderr; exit 1 with one line when nobody answered, 2 when a view read once finds
    nothing to show in what was given (empty logs, a recording of no agent: silence is no empty cluster; a
    followed log may still grow).

    Nobody answered, but the relay the source subscribes through said why (its upstream stopped answering it; the
    ranks it keeps from it are unheard): the view shows them. Returns the line a view read once exits 1 with after
    showing them; a followed view says it on stderr now and goes on, as one that heard them before ("" otherwise)."""
    for line in source.notes():
        typer.echo(terminal_safe(line), err=True)
    if not source.heard():
        if not source.unheard_why():
            raise fail(source.silence())
        if not follow:
            return source.silence()
        typer.echo(terminal_safe(f"kvtop: {source.silence()}"), err=True)
    elif not follow and (nothing := source.nothing_to_judge()):
        raise fail(nothing, 2)
    return ""


class SilenceSaid:
    """Says on stderr, once, that no agent answered within `wait` and what the command does meanwhile (`going_on`:
    a recorder or an exporter started before its cluster goes on; silence is said, never taken for health), and
    when the first agent does. Later, once every agent has been quiet for longer than `wait` (3 s at least, when
    the views call a rank stale: a cluster stopped, a network cut), that is said once too, with what the command
    does meanwhile (`quiet_going_on`, default `going_on`), and again when one answers."""

    def __init__(self, source: Source, wait: float, command: str, going_on: str, quiet_going_on: str = "") -> None:
        self.source, self.wait, self.command, self.going_on = source, wait, command, going_on
        self.quiet_going_on = quiet_going_on or going_on
        from kvtop.model.shapes import STALE_S  # the model is loaded by then: a source holds one

        self.quiet_after = max(wait, STALE_S)
        """Quiet this long is said: never before the views call a rank stale (a loaded machine's late heartbeat)."""
        self.started = time.monotonic()
        self.heard = False
        self.said = False
        """A silence was said, and no agent answered since."""
        self.quiet_since = 0.0
        """When the last agent was heard before the silence said (wall time)."""

    def check(self) -> None:
        if not self.heard:
            self._first_answer()
            return
        last = self.source.last_heard()
        if not last:  # a source that listens to no agent
            return
        if self.said and last > self.quiet_since:
            self.said = False
            typer.echo(f"{self.command}: an agent answered again after {last - self.quiet_since:.1f}s", err=True)
        elif not self.said and (quiet := time.time() - last) > self.quiet_after:
            self.said, self.quiet_since = True, last
            at = time.strftime("%H:%M:%S", time.localtime(last))
            typer.echo(f"{self.command}: no agent heard for {quiet:.1f}s (the last at {at}); {self.quiet_going_on}",
                       err=True)  # fmt: skip

    def _first_answer(self) -> None:
        waited = time.monotonic() - self.started
        if self.source.heard():
            self.heard = True
            if self.said:
                self.said = False
                typer.echo(f"{self.command}: an agent answered after {waited:.1f}s", err=True)
        elif not self.said and waited >= self.wait:
            self.said = True
            typer.echo(f"{self.command}: {self.source.silence()}; {self.going_on}", err=True)
