"""`kvtop relay`: one address for a cluster's events and snapshots (transport/plane/relay.py does the work)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import (
    MAX_INTERVAL_S,
    Connect,
    Duration,
    Insecure,
    _endpoint,
    _endpoints,
    bind_endpoint,
    fail,
    key_folder,
    load_curve,
)

if TYPE_CHECKING:
    from transport.curve import CurveKeys
    from transport.plane.relay import Relay

_HEARD_WITHIN_S = 3.0
"""How long an agent given by --connect may take to publish at start (agents beat every second)."""

_Upstream = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_BOOTSTRAP",
        callback=_endpoint,
        help="Bootstrap address whose agents the relay subscribes to (listed again every second: agents come, "
        "go and restart).",
    ),
]
_Relays = Annotated[
    list[str],
    typer.Option(
        "--relay",
        metavar="ADDR",
        callback=_endpoints,
        help="An upstream relay's address (repeatable): its agents arrive through it (tiers: rack, then cluster).",
    ),
]
_Listen = Annotated[
    str,
    typer.Option(
        callback=bind_endpoint, help="Where views subscribe (the XPUB), e.g. tcp://0.0.0.0:7100 (default: a free port)."
    ),
]
_SnapshotListen = Annotated[
    str,
    typer.Option(
        callback=bind_endpoint,
        help="The relay's address (its ROUTER: listing and snapshots), the one views take as --relay "
        "(default: a free port).",
    ),
]
_RelayCurveKeys = Annotated[
    str,
    typer.Option(
        "--curve-keys",
        metavar="DIR",
        callback=key_folder,
        help="The cluster's CURVE key folder (`kvtop keys generate DIR`, with the server secret and allowed/): "
        "the relay dials agents, relays and the bootstrap as a client, and serves views only if their key is "
        "in DIR/allowed.",
    ),
]


def relay(
    bootstrap: _Upstream = "",
    relay: _Relays = [],  # noqa: B006
    connect: Connect = [],  # noqa: B006
    listen: _Listen = "",
    snapshot_listen: _SnapshotListen = "",
    host: Annotated[str, typer.Option(help="Host of the ports chosen when --listen is not given.")] = "127.0.0.1",
    name: Annotated[str, typer.Option(help="This relay's name in listings.")] = "relay",
    advertise: Annotated[
        str,
        typer.Option(
            help="Host name views reach this relay at, when --listen binds a wildcard (0.0.0.0) "
            "(default: this machine's host name)."
        ),
    ] = "",
    register: Annotated[
        bool,
        typer.Option(
            "--register",
            help="List this relay with --bootstrap, so that views given the bootstrap subscribe to the relay.",
        ),
    ] = False,
    status: Annotated[
        bool,
        typer.Option(
            "--status",
            help=(
                "Print the relay's counters on stderr every --interval: upstreams, messages, snapshots, rejected "
                "frames, bad entries (distinct entries its upstreams list that no reader may dial)."
            ),
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, max=MAX_INTERVAL_S, help="Seconds between --status lines (at most an hour).")
    ] = 5.0,
    duration: Duration = None,
    curve_keys: _RelayCurveKeys = "",
    insecure: Insecure = False,
) -> None:
    """Relay a cluster's events (a ZeroMQ XSUB/XPUB proxy) and pass snapshot requests through to its agents.

    Views across a network boundary then need one address: `kvtop top --relay ADDR`. Batches pass untouched,
    so gaps stay counted per agent incarnation (and a view asks the agent's snapshot again after one, through
    the relay). Prints its two addresses, then runs until Ctrl-C, SIGTERM, SIGHUP or --duration (exit 0). Exit 1 when an
    upstream does not answer at start (the bootstrap or a relay lists nothing within 2 s, an agent given by
    --connect publishes nothing within 3 s), an address it binds is taken (named) or a relay thread dies; exit 2
    for a key folder that cannot serve, or a bind beyond loopback without --curve-keys or --insecure.
    """
    from transport.curve import exposure_problem
    from transport.plane.relay import Relay
    from transport.signals import STOP_SIGNALS, stop_on

    if not bootstrap and not relay and not connect:
        raise typer.BadParameter("give --bootstrap ADDR, at least one --relay ADDR, or at least one --connect EP")
    binds = [listen, snapshot_listen] + ([host] if not (listen and snapshot_listen) else [])
    problem = exposure_problem(binds, bool(curve_keys), insecure)
    if problem:
        raise fail(problem, 2)
    keys = load_curve(curve_keys, serve=True)
    problem = _silent(connect, keys)
    if problem:
        raise fail(problem)
    stop = threading.Event()
    with stop_on(stop, *STOP_SIGNALS):  # from the start: a stop while it discovers is a clean one too
        upstreams = (bootstrap, relay, connect)
        server = _started(
            lambda: Relay(*upstreams, listen, snapshot_listen, host, name, register, advertise=advertise, curve=keys),
            stop,
        )
        if server is None:
            return
        curve = ", CURVE" if keys is not None else ""
        end = None if duration is None else time.monotonic() + duration
        try:  # the address once stopping works: whoever reads it may stop the relay
            typer.echo(
                f"kvtop relay: events at {server.endpoint}, address {server.address}{curve} "
                f"(views: --relay {server.address})"
            )
            while not stop.is_set() and not server.died and (end is None or time.monotonic() < end):
                stop.wait(min(interval, end - time.monotonic()) if end is not None else interval)
                if status:
                    typer.echo(f"kvtop relay: {server.status_line()}", err=True)
        finally:
            server.close()
    if status:
        typer.echo(f"kvtop relay: {server.status_line()}", err=True)
    if server.died:
        raise fail(server.error)


def _bind_problem(error: Exception) -> str:
    """`Address already in use: tcp://127.0.0.1:P` of a failed bind (the relay binds two or three: which one), or
    what else failed."""
    import zmq

    if isinstance(error, zmq.ZMQError) and error.errno:
        address = error.strerror.partition(" (addr=")[2].removesuffix(")").strip("'\"")
        return f"{zmq.strerror(error.errno)}: {address}" if address else zmq.strerror(error.errno)
    return str(error)


def _started(make: Callable[[], Relay], stop: threading.Event) -> Relay | None:
    """The relay `make` opens, its upstreams discovered (exit 1 when its sockets cannot be bound or an upstream
    does not answer); None when `stop` was set meanwhile and the discovery failed (it is closed)."""
    from transport.errors import BootstrapError
    from transport.registration import agent_problem

    try:
        server = make()
    except Exception as error:  # a bind that failed (address in use, bad interface): one line
        raise fail(f"cannot open the relay's sockets: {_bind_problem(error)}") from None
    problem = agent_problem(server.entry)
    if problem:
        server.close()
        raise fail(f"this relay's entry cannot be listed: {problem} (see --name, --advertise)", 2)
    try:
        server.start()
    except BootstrapError as error:
        server.close()
        if stop.is_set():
            return None
        raise fail(str(error)) from None
    return server


def _silent(endpoints: list[str], keys: CurveKeys | None) -> str:
    """Why an agent given by its event endpoint cannot be used at start: the first that publishes nothing
    within `_HEARD_WITHIN_S` ("" when every one does)."""
    import zmq

    from transport.curve import dialing
    from transport.reach import why_silent
    from transport.sockets import LIST_FRAME, open_socket

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    poller = zmq.Poller()
    waiting: dict[zmq.Socket[bytes], str] = {}
    try:
        for endpoint in endpoints:
            sock = open_socket(context, zmq.SUB, LIST_FRAME, dialing(keys))
            waiting[sock] = endpoint
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + _HEARD_WITHIN_S
        while waiting and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                poller.unregister(sock)
                del waiting[sock]
    finally:
        context.destroy(linger=0)
    if not waiting:
        return ""
    silent = next(iter(waiting.values()))
    hint = why_silent(silent) or (
        "does it serve these keys?" if keys is not None else "if it serves CURVE, pass its --curve-keys"
    )
    return f"agent {silent} published nothing within {_HEARD_WITHIN_S:.1f}s ({hint})"


def register(app: typer.Typer) -> None:
    app.command("relay")(relay)
