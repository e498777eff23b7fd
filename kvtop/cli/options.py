"""Options and helpers shared by the `kvtop` commands (Annotated types, address checks, errors)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.source.stdin import piped

if TYPE_CHECKING:
    from kvtop.sources.sglang import SGLangLogs
    from transport.curve import CurveKeys


def _print_version(value: bool) -> None:
    if value:
        from kvtop import __version__

        typer.echo(f"kvtop {__version__}")
        raise typer.Exit()


Version = Annotated[
    bool, typer.Option("--version", is_eager=True, callback=_print_version, help="Print kvtop's version and exit.")
]

# Shared by bare `kvtop` and `kvtop cluster up`.
Prefill = Annotated[int, typer.Option(min=1, max=8, help="Prefill instances.")]
Decode = Annotated[int, typer.Option(min=1, max=8, help="Decode instances.")]
Tp = Annotated[int, typer.Option(min=1, max=8, help="TP size of every instance (ranks per instance).")]
MAX_WAIT_S = 86_400.0
"""The longest --wait: a day (an answer awaited longer is no answer; a poll cannot wait forever)."""
MAX_INTERVAL_S = 3_600.0
"""The longest pause between frames or status lines: an hour."""
MAX_SPAN_S = 366 * 86_400.0
"""The longest span an option names (a window, a duration, how long a room may sit): a year, a log's longest."""
INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C before it showed anything (a shell's, for SIGINT)."""

Rate = Annotated[float, typer.Option(min=0.1, max=1e6, help="Rooms started per second.")]
Faults = Annotated[
    list[str],
    typer.Option(
        metavar="SPEC",
        help="Inject faults: [TARGET=]KIND[:RATE][@PEER], e.g. prefill-0/TP1=corrupt:0.1, decode=die:0.01, "
        "drop:0.1@decode-1 or stall:0.05 (every agent that can act on it). TARGET and PEER are a role, an "
        "instance (prefill-0) or a rank (prefill-0/TP1); one that matches no agent exits 2. RATE is per room; "
        "kinds: drop, delay, corrupt, refuse, stall (act on prefill ranks), die (any rank). Repeatable; "
        "'none' for no faults. Default: corrupt:0.02 on prefill-0/TP0, stall:0.01 on prefill-1 (if there is one).",
    ),
]
Duration = Annotated[
    float | None, typer.Option(min=0.1, max=MAX_SPAN_S, help="Stop after this many seconds (default: until Ctrl-C).")
]
LogDir = Annotated[
    str,
    typer.Option(
        metavar="DIR",
        help="Folder for the agents' SGLang-format logs, one file per instance, and each agent's stderr "
        "(<instance>-TP<rank>.stderr, tracebacks included) (default: a temporary folder, removed on exit).",
    ),
]
BootstrapTimeout = Annotated[
    float, typer.Option(min=0.1, max=MAX_WAIT_S, help="Seconds a room may stay in Bootstrapping.")
]
WaitingTimeout = Annotated[
    float, typer.Option(min=0.1, max=MAX_WAIT_S, help="Seconds a room may stay in WaitingForInput.")
]
TransferTimeout = Annotated[
    float, typer.Option(min=0.1, max=MAX_WAIT_S, help="Seconds a Transferring room may make no progress.")
]


def _endpoint(value: str) -> str:
    """A ZeroMQ address to connect to, checked before any socket sees it ("" passes: the option was not given):
    `transport.registration.endpoint_problem`, a TCP port in 1..65535 (libzmq would wrap 99999 silently)."""
    from transport.registration import endpoint_problem

    return _address(value, endpoint_problem)


def bind_endpoint(value: str) -> str:
    """A ZeroMQ address to bind, checked before any socket sees it ("" passes: a free port is picked)."""
    from transport.sockets import bind_problem

    return _address(value, bind_problem)


def _address(value: str, problem_of: Callable[[str], str]) -> str:
    """`value` when it is "" or an address `problem_of` finds nothing wrong with; else a usage error saying why."""
    if not value:
        return value
    if not re.fullmatch(r"(tcp|ipc)://\S+", value):
        raise typer.BadParameter(f"{value!r} is not an address like tcp://127.0.0.1:5555")
    if problem := problem_of(value):
        raise typer.BadParameter(problem)
    return value


def _endpoints(values: list[str]) -> list[str]:
    return [_endpoint(value) for value in values]


def _bootstrap(value: str) -> str:
    """`_endpoint`, its error naming the option's environment variable."""
    try:
        return _endpoint(value)
    except typer.BadParameter as error:
        raise typer.BadParameter(error.message, param_hint="'--bootstrap' (or KVTOP_BOOTSTRAP)") from None


def _relay(value: str) -> str:
    """`_endpoint`, its error naming the option's environment variable."""
    try:
        return _endpoint(value)
    except typer.BadParameter as error:
        raise typer.BadParameter(error.message, param_hint="'--relay' (or KVTOP_RELAY)") from None


# Shared by the headless views.
Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap",
        envvar="KVTOP_BOOTSTRAP",
        metavar="ADDR",
        callback=_bootstrap,
        help="Bootstrap address of the cluster, tcp://HOST:PORT (it lists every agent).",
    ),
]
Relay = Annotated[
    str,
    typer.Option(
        "--relay",
        envvar="KVTOP_RELAY",
        metavar="ADDR",
        callback=_relay,
        help="A relay's address (the one `kvtop relay` prints), instead of --bootstrap: the view subscribes once, "
        "to the relay, as it does when the bootstrap lists a relay.",
    ),
]
Connect = Annotated[
    list[str],
    typer.Option(
        "--connect",
        metavar="EP",
        callback=_endpoints,
        help="An agent's event endpoint, tcp://HOST:PORT (repeatable), instead of or beside --bootstrap.",
    ),
]


def _log_specs(values: list[str]) -> list[str]:
    """`FILE`, `prefill=FILE` or `decode=FILE`, each a file that can be read."""
    for value in values:
        role, sep, path = value.partition("=")
        path = path if sep and role in ("prefill", "decode") else value
        if not Path(path).is_file() and not piped(path):  # a pipe is copied to a file first (`spooled`)
            raise typer.BadParameter(f"{path!r} {_not_a_file(Path(path))}", param_hint="--sglang-log")
    return values


def _not_a_file(path: Path) -> str:
    """Why `path` is no log file to read: not there, a folder (a few of the files in it named), or no regular file."""
    if not path.exists():
        if path.is_symlink():  # a link whose target is gone (a log rotated under it) or that loops
            return _broken_link(path)
        joined = str(path).split(",")
        if len(joined) > 1 and all(Path(part).is_file() for part in joined):
            return "does not exist: files joined by a comma? give --sglang-log once per file"
        return "does not exist"
    if not path.is_dir():
        return "is not a regular file (a device or a pipe): give a server's log file"
    try:
        names = sorted(entry.name for entry in itertools.islice(path.iterdir(), 64) if entry.is_file())
    except OSError:
        names = []
    shown = f" (in it: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''})" if names else ""
    return f"is a folder: give --sglang-log once per server's log file{shown}"


def _broken_link(path: Path) -> str:
    """Why a symlink leads to no file: it loops, or its target does not exist (named)."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symlink loop: give a server's log file"
    return f"is a symlink to {os.readlink(path)!r}, which does not exist"


def _model_at(value: str) -> str:
    """A model process's pid or an endpoint ("" passes: the option was not given)."""
    if value and not (value.isdigit() or re.fullmatch(r"(tcp|ipc)://\S+", value)):
        raise typer.BadParameter(
            f"{value!r} is neither a pid nor an endpoint like ipc:///run/user/1000/kvtop/model-1.sock"
        )
    return value


Model = Annotated[
    bool,
    typer.Option(
        "--model",
        help="Read the model of the dashboard running on this machine (`kvtop top` or bare `kvtop`, as this "
        "user) instead of opening a source of its own: the one that runs, or the one of --bootstrap/--connect "
        "when given. --wait bounds its answer (its agents' snapshots awaited, as a source's); a view that "
        "follows asks it again for each frame (events: every second). Exit 1 (check: CRITICAL) when none answers; 2 "
        "(check: UNKNOWN) when several run and none is named.",
    ),
]
ModelAt = Annotated[
    str,
    typer.Option(
        "--model-at",
        metavar="PID|ENDPOINT",
        callback=_model_at,
        help="As --model, naming the dashboard's model when several run: its model process's pid (the error "
        "that lists them names each pid and source), or its endpoint (ipc://...).",
    ),
]
SGLangLog = Annotated[
    list[str],
    typer.Option(
        "--sglang-log",
        metavar="FILE",
        callback=_log_specs,
        help="An SGLang server log to read instead of a live cluster (repeatable, one file per instance; "
        "prefill=FILE or decode=FILE says which server wrote it where its lines do not; .gz read too, a damaged "
        "one up to its damage, named on stderr; a view that follows tails them; - or /dev/stdin: one log piped in, "
        "read to its end, not followed). "
        "Given, it is the source: --bootstrap and --connect are ignored.",
    ),
]
ReplayPath = Annotated[
    str,
    typer.Option(
        "--replay",
        envvar="KVTOP_REPLAY",
        metavar="DIR|FILE",
        help="A recording to read instead of a live cluster: the folder `kvtop record --out` wrote (or the "
        "dashboard's ring), or one .kvr segment. Views judge 'now' at --at (default: the recording's end).",
    ),
]
TIMES = "ISO time (2026-12-01T03:00:00, local unless it names a zone), time of day (03:00), epoch seconds, or "
"""The forms of time the options take, to be ended by an example of a relative time."""
At = Annotated[
    str,
    typer.Option(
        "--at",
        metavar="T",
        help=f"With --replay or --sglang-log: the instant the view shows, as it was then ({TIMES}'5 minutes ago').",
    ),
]
Since = Annotated[
    str,
    typer.Option(
        "--since",
        metavar="T",
        help="With --replay or --sglang-log: where the view's window starts (status and check: their window; "
        "failures and events: what started from then on).",
    ),
]
Until = Annotated[str, typer.Option("--until", metavar="T", help="With --replay or --sglang-log: the same as --at.")]
Wait = Annotated[
    float, typer.Option(min=0.1, max=MAX_WAIT_S, help="Seconds to wait for every agent's snapshot (at most a day).")
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (stable fields, see docs/json.md).")]
Follow = Annotated[
    bool,
    typer.Option("--follow", "-f", help="Print the view again every --interval until Ctrl-C (JSON Lines with --json)."),
]
Interval = Annotated[
    float, typer.Option(min=0.1, max=MAX_INTERVAL_S, help="Seconds between frames with --follow (at most an hour).")
]


def key_folder(value: str) -> str:
    """A CURVE key folder, refused when the path is there but is no folder ("" passes: no CURVE)."""
    if value and Path(value).exists() and not Path(value).is_dir():
        raise typer.BadParameter(f"{value!r} is not a folder (`kvtop keys generate DIR` makes the key folder)")
    return value


CurveKeysDir = Annotated[
    str,
    typer.Option(
        "--curve-keys",
        envvar="KVTOP_CURVE_KEYS",
        metavar="DIR",
        callback=key_folder,
        help="CURVE key folder of the cluster (`kvtop keys generate DIR`): encrypted, and only a client whose key "
        "is on the agents' allow-list hears anything. A view needs server.key, client.key, client.key_secret.",
    ),
]
ClusterCurveKeys = Annotated[
    str,
    typer.Option(
        "--curve-keys",
        metavar="DIR",
        callback=key_folder,
        help="CURVE key folder (`kvtop keys generate DIR`) for the bootstrap service and every agent: every "
        "socket encrypted, answering only clients whose key is in DIR/allowed.",
    ),
]
"""The agents' side takes no KVTOP_CURVE_KEYS: that variable names a view's folder, which cannot serve."""
Insecure = Annotated[
    bool,
    typer.Option("--insecure", help="Bind an address beyond loopback without --curve-keys (plain TCP, no checks)."),
]


def load_curve(folder: str, serve: bool) -> CurveKeys | None:
    """The CURVE keys in `folder` (None when it is ""); exit 2 with one line when they cannot be used."""
    if not folder:
        return None
    from transport.curve import CurveKeys
    from transport.errors import CurveError

    try:
        return CurveKeys.load(folder, serve=serve)
    except CurveError as error:
        raise fail(f"--curve-keys: {error}", 2) from None


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"kvtop: {message}", err=True)
    if code == INTERRUPTED:
        INTERRUPTION_SAID.set()
    return typer.Exit(code)


def not_a_terminal() -> str:
    """Which of stdin and stdout is not a terminal ("" when both are): the dashboard reads its keys from one and
    draws on the other. Without keys it could not be quit (q, Ctrl-C as a key) but by a signal."""
    streams = (("stdin", sys.stdin), ("stdout", sys.stdout))
    return " and ".join(name for name, stream in streams if stream is None or not stream.isatty())


INTERRUPTION_SAID = threading.Event()
"""A command said why it ends with `INTERRUPTED` (`fail`): any other such exit is Typer's, for a Ctrl-C that it
caught (said nothing)."""


def quiet_stdout() -> None:
    """Point stdout at /dev/null once it cannot be written (its reader went away, a full disk), so nothing written
    later, the interpreter's last flush included, raises again."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def open_sglang_logs(sglang_log: list[str]) -> SGLangLogs:
    """The SGLang log source over the given files (exit 2 when one cannot be read)."""
    from kvtop.sources.sglang import SGLangLogs

    try:
        return SGLangLogs(sglang_log)
    except OSError as error:
        raise fail(f"cannot read an SGLang log: {error}", 2) from None
