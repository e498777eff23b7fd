"""Commands that run a local cluster: bare `kvtop` (embedded cluster and live status), `cluster up`, `bootstrap`."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.dashboard_record import Record, RecordDir, RecordMaxBytes, record_choice
from kvtop.cli.export_cmd import Export
from kvtop.cli.options import (
    BootstrapTimeout,
    ClusterCurveKeys,
    Decode,
    Duration,
    Faults,
    Insecure,
    LogDir,
    Prefill,
    Rate,
    Tp,
    TransferTimeout,
    Version,
    WaitingTimeout,
    bind_endpoint,
    fail,
    load_curve,
    not_a_terminal,
)
from kvtop.cli.top_cmd import Theme
from kvtop.cluster.supervisor import exit_said
from kvtop.record.dashboard import RecordChoice
from kvtop.views.units import size

if TYPE_CHECKING:
    from kvtop.tui.themes import ThemeSet
    from transport.config import Timeouts
    from transport.harness.cluster import ClusterSpec, LocalCluster
    from transport.harness.workload import WorkloadStats
    from transport.kv.faults import FaultSpec


def _faults(texts: list[str]) -> dict[str, tuple[FaultSpec, ...]] | None:
    """`--fault [TARGET=]KIND[:RATE][@PEER]` into the cluster's per-target map; None keeps the demo faults."""
    from transport.errors import ConfigError
    from transport.kv.faults import FaultSpec

    if not texts:
        return None
    if texts == ["none"]:
        return {}
    if "none" in texts:
        raise fail("--fault: 'none' means no faults: give it alone, or only the faults to inject", 2)
    faults: dict[str, tuple[FaultSpec, ...]] = {}
    try:
        for text in texts:
            target, _, spec = text.rpartition("=")
            faults[target] = (*faults.get(target, ()), FaultSpec.parse(spec))
    except ConfigError as error:
        raise fail(f"--fault: {error}", 2) from None
    return faults


@contextlib.contextmanager
def _log_folder(log_dir: str) -> Iterator[str]:
    """`log_dir` (made if missing; exit 2 when it cannot be), or a temporary folder removed on exit, the agents'
    logs with it (the cluster stopped first); the temporary folders of clusters killed before they could remove
    theirs are removed first, each said in a line (`kvtop.cluster.log_folders`)."""
    if log_dir:
        try:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            why = "not a folder" if isinstance(error, FileExistsError) else error.strerror or str(error)
            raise fail(f"--log-dir {log_dir}: {why}", 2) from None
        yield log_dir
        return
    from kvtop.cluster.log_folders import prefix, sweep_orphans

    for path in sweep_orphans():
        typer.echo(f"kvtop: removed {path}: the log folder of a local cluster that was killed", err=True)
    with tempfile.TemporaryDirectory(prefix=prefix(), ignore_cleanup_errors=True) as folder:
        yield folder


@dataclasses.dataclass(frozen=True)
class Security:
    """Where a local cluster binds and whether with CURVE."""

    curve_keys: str = ""
    host: str = "127.0.0.1"
    insecure: bool = False


def _spec(
    prefill: int,
    decode: int,
    tp: int,
    fault: list[str],
    log_dir: str,
    timeouts: Timeouts | None = None,
    security: Security | None = None,
) -> ClusterSpec:
    """The cluster to start; exit 2 with one line when a fault reaches no agent or no rank can act on it, when
    the key folder cannot be used, or when it would bind beyond loopback without CURVE or --insecure."""
    from kvtop.cluster.local import DEMO_TIMEOUTS, demo_spec
    from transport.curve import exposure_problem
    from transport.errors import ConfigError

    spec = demo_spec(prefill, decode, tp, _faults(fault), log_dir, timeouts or DEMO_TIMEOUTS)
    try:
        spec.fault_plan()
    except ConfigError as error:
        raise fail(f"--fault: {error}", 2) from None
    if security is None:
        return spec
    problem = _host_problem(security.host) or exposure_problem(
        [security.host], bool(security.curve_keys), security.insecure
    )
    if problem:
        raise fail(problem, 2)
    load_curve(security.curve_keys, serve=True)
    return dataclasses.replace(spec, curve_keys=security.curve_keys, insecure=security.insecure)


def _host_problem(host: str) -> str:
    """Why the cluster cannot bind `host` ("" when it can): it binds IPv4, so the host must have an IPv4 address."""
    try:
        socket.getaddrinfo(host, None, socket.AF_INET)
    except (socket.gaierror, UnicodeError) as error:
        if ":" in host:
            return f"--host {host}: an IPv6 address; a local cluster binds IPv4 (127.0.0.1, or a host's address)"
        return f"--host {host}: no IPv4 address for it ({getattr(error, 'strerror', None) or error})"
    return ""


def _run_cluster(
    prefill: int,
    decode: int,
    tp: int,
    rate: float,
    fault: list[str],
    duration: float | None,
    log_dir: str,
    timeouts: tuple[float, float, float] | None,
    print_address: bool,
    restart: bool = False,
    security: Security | None = None,
) -> WorkloadStats:
    from transport.config import Timeouts
    from transport.errors import ConfigError

    try:
        limits = Timeouts(*timeouts) if timeouts else None
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None
    security = security or Security()
    with _log_folder(log_dir) as folder:
        spec = _spec(prefill, decode, tp, fault, folder, limits, security)
        return _serve_cluster(spec, rate, duration, print_address, restart, security.host, kept=bool(log_dir))


def _serve_cluster(
    spec: ClusterSpec, rate: float, duration: float | None, print_address: bool, restart: bool, host: str, kept: bool
) -> WorkloadStats:
    """Run `spec` with a workload until `duration` or Ctrl-C; status lines on stdout (stderr with
    `print_address`, whose first stdout line is the bootstrap address); `kept`: its log folder outlives it."""
    from kvtop.cluster.local import run_local
    from transport.errors import TransportError
    from transport.harness.workload import WorkloadSpec

    def announce(cluster: LocalCluster) -> None:
        typer.echo(cluster.endpoint)

    def warn(line: str) -> None:
        typer.echo(f"kvtop: {line}", err=True)

    emit = (lambda line: typer.echo(line, err=True)) if print_address else typer.echo
    try:
        return run_local(
            spec,
            WorkloadSpec(rate=rate),
            duration,
            emit,
            on_up=announce if print_address else None,
            report=warn,
            restart=restart,
            host=host,
            kept=kept,
        )
    except TransportError as error:
        raise fail(str(error)) from None


def _dashboard(
    prefill: int,
    decode: int,
    tp: int,
    rate: float,
    fault: list[str],
    duration: float | None,
    log_dir: str,
    theme: str,
    export: str,
    security: Security,
    choice: RecordChoice,
) -> None:
    from kvtop.cli.top_cmd import find_theme
    from transport.signals import interrupt

    themes = find_theme(theme)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # until the dashboard takes them: they killed kvtop, its
        signal.signal(signum, interrupt)  # agents left to their parent-death check and its log folder behind
    with _log_folder(log_dir) as folder:
        spec = _spec(prefill, decode, tp, fault, folder, None, security)
        lost = _dashboard_on(spec, rate, duration, theme, themes, export, choice, kept=bool(log_dir))
    for line in lost:
        typer.echo(f"kvtop: {line}", err=True)
    if lost:
        raise typer.Exit(1)  # as without the dashboard: the cluster lost a rank


def _dashboard_on(
    spec: ClusterSpec,
    rate: float,
    duration: float | None,
    theme: str,
    themes: ThemeSet,
    export: str,
    choice: RecordChoice,
    kept: bool,
) -> list[str]:
    """The dashboard on an embedded cluster of `spec` (its model in a process of its own); what each rank that
    exited while it ran said (its stderr's last lines, unless `kept`: its log folder outlives the cluster)."""
    from kvtop.cli.model_spec import LiveModel
    from kvtop.cli.top_cmd import run_live_dashboard
    from kvtop.cluster.embedded import EmbeddedCluster
    from transport.errors import TransportError
    from transport.harness.workload import WorkloadSpec
    from transport.signals import STOP_SIGNALS, ignore

    shape = f"{spec.prefill}P{spec.decode}D TP{spec.prefill_tp} on loopback{', CURVE' if spec.curve_keys else ''}"
    removed = "" if kept else ", removed on exit: --log-dir DIR keeps them"
    typer.echo(f"starting {shape} (agent logs: {spec.log_dir}{removed}) ...", err=True)
    try:
        with EmbeddedCluster(spec, WorkloadSpec(rate=rate), collect=False) as embedded:
            model = LiveModel(embedded.cluster.endpoint, curve_keys=spec.curve_keys, record=choice, export=export,
                              kind="embedded")  # fmt: skip
            said: list[str] = []

            def exited() -> list[str]:  # shown on the dashboard as they happen, and again after it
                news = [exit_said(agent, kept) for agent in embedded.cluster.exits()]
                said.extend(news)
                return news

            try:
                run_live_dashboard(model, embedded.describe, themes, theme, quit_after=duration, alerts=exited)
            finally:  # its event loop put SIGTERM and SIGHUP back to the default: the stop below is not cut short
                ignore(*STOP_SIGNALS)
            return said + exited()
    except TransportError as error:
        raise fail(str(error)) from None


def local(
    ctx: typer.Context,
    prefill: Prefill = 2,
    decode: Decode = 2,
    tp: Tp = 2,
    rate: Rate = 20.0,
    fault: Faults = [],  # noqa: B006 - Typer reads the default, never mutates it
    duration: Duration = None,
    log_dir: LogDir = "",
    theme: Theme = "kvtop-dark",
    record: Record = True,
    record_dir: RecordDir = "",
    record_max_bytes: RecordMaxBytes = "256MiB",
    dashboard: Annotated[
        bool,
        typer.Option(
            help="Open the dashboard (default when stdin and stdout are a terminal); --no-dashboard prints status "
            "lines."
        ),
    ] = True,
    export: Export = "",
    curve_keys: ClusterCurveKeys = "",
    version: Version = False,  # its callback prints the version and exits
) -> None:
    """Start an embedded local cluster with a workload and open the dashboard on it (quitting stops every agent).

    Its default shape is 2P2D, so the dashboard shows several links and where a fault sits among them;
    `kvtop cluster up`, for scripts and CI, starts the smallest cluster with a link (1P1D)."""
    if ctx.invoked_subcommand is not None:
        return
    security = Security(curve_keys)
    choice = record_choice(record, record_dir, record_max_bytes)  # a size that does not read is bad usage either way
    if dashboard and not not_a_terminal():
        _dashboard(prefill, decode, tp, rate, fault, duration, log_dir, theme, export, security, choice)
        return
    if export:
        raise typer.BadParameter(
            "serves the dashboard's model: without the dashboard, run `kvtop cluster up` and "
            "`kvtop export --bootstrap ADDR`",
            param_hint="--export",
        )
    stats = _run_cluster(
        prefill, decode, tp, rate, fault, duration, log_dir, None, print_address=False, security=security
    )
    typer.echo(f"done: {_summary(stats)}, {size(stats.bytes_moved)} moved")
    _exit_for(stats)


def _summary(stats: WorkloadStats) -> str:
    return (
        f"{stats.succeeded} rooms ok, {stats.failed} failed, {stats.refused} refused, {stats.lost} lost, "
        + (f"{stats.dropped} arrivals dropped, " if stats.dropped else "")
        + f"{stats.rank_exits} rank exits ({stats.ranks_down} still down)"
        + (f"; no {stats.unserved} instance up at the end: no room started" if stats.unserved else "")
    )


def _exit_for(stats: WorkloadStats) -> None:
    """Exit 1 when a rank exited and did not come back: the run did not end healthy."""
    if stats.ranks_down:
        raise typer.Exit(1)


def cluster_up(
    prefill: Prefill = 1,
    decode: Decode = 1,
    tp: Tp = 2,
    rate: Rate = 20.0,
    fault: Faults = [],  # noqa: B006
    duration: Duration = None,
    log_dir: LogDir = "",
    bootstrap_timeout: BootstrapTimeout = 10.0,
    waiting_timeout: WaitingTimeout = 10.0,
    transfer_timeout: TransferTimeout = 3.0,
    restart: Annotated[
        bool, typer.Option(help="Start a rank that exited again (a new process, so a new incarnation).")
    ] = False,
    curve_keys: ClusterCurveKeys = "",
    host: Annotated[
        str,
        typer.Option(
            help="Address the bootstrap service and the agents bind (beyond loopback: --curve-keys or --insecure)."
        ),
    ] = "127.0.0.1",
    insecure: Insecure = False,
) -> None:
    """Start a bootstrap service, agents and a router on loopback; Ctrl-C or SIGTERM stops them all.

    Its default shape is the smallest cluster with a link (1P1D), light enough for scripts and CI; bare
    `kvtop`, a demo on the dashboard, starts 2P2D (`--prefill 2 --decode 2` here gives that shape).

    The first line on stdout is the bootstrap address (tcp://127.0.0.1:PORT), the one address that lists
    every agent; status lines go to stderr (rooms ok, failed, refused, lost, in flight; MB/s; the room end to
    end p50 and p99, from a decode rank taking it to its instance's answer: longer than `kvtop status`' transfer
    time), and so does one line, at once, for every rank that exits (its label, pid, exit code or signal).
    Each agent's stderr is kept in the log folder as <instance>-TP<rank>.stderr. With --curve-keys every
    socket of the cluster is CURVE-encrypted and answers only clients on the folder's allow-list. Exit codes:
    0 after --duration, Ctrl-C or SIGTERM (also while the agents come up), 1 when the cluster did not come up
    or a rank exited and is not back, 2 for bad usage (a --fault that reaches no agent, a key folder that
    cannot be used, a --host beyond loopback without --curve-keys or --insecure).
    """
    timeouts = (bootstrap_timeout, waiting_timeout, transfer_timeout)
    stats = _run_cluster(
        prefill,
        decode,
        tp,
        rate,
        fault,
        duration,
        log_dir,
        timeouts,
        print_address=True,
        restart=restart,
        security=Security(curve_keys, host, insecure),
    )
    typer.echo(f"done: {_summary(stats)}", err=True)
    _exit_for(stats)


def _network_values(texts: list[str] | None) -> list[str] | None:
    """--endpoint-network values that are networks (any other is a usage error, exit 2)."""
    for text in texts or []:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise typer.BadParameter(f"{text[:80]!r} is not a network like 10.0.0.0/8") from None
    return texts


def bootstrap(
    listen: Annotated[
        str,
        typer.Option(
            callback=bind_endpoint,
            help="Address to bind, tcp://HOST:PORT (default: a free port on 127.0.0.1; beyond loopback: "
            "--curve-keys or --insecure).",
        ),
    ] = "",
    curve_keys: Annotated[
        str,
        typer.Option(
            "--curve-keys",
            metavar="DIR",
            help="The cluster's CURVE key folder (`kvtop keys generate DIR`, with the server secret and allowed/): "
            "only clients whose key is in DIR/allowed can register or list.",
        ),
    ] = "",
    insecure: Insecure = False,
    endpoint_network: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint-network",
            metavar="CIDR",
            callback=_network_values,
            help="A network registered endpoints may be in besides the registering client's own address "
            "(repeatable), for hosts that reach the service on one network and move data on another.",
        ),
    ] = None,
) -> None:
    """Run the bootstrap service alone: a registry for sidecars (`kvtop agent --sglang-log`) and agents.

    The first line on stdout is its address (what a view's `--bootstrap` and KVTOP_BOOTSTRAP take). Registrations are
    checked, refreshed every second and forgotten 5 s after their last refresh. One client (the address its
    registrations come from) holds at most 1024 of the 4096 entries: past that its registrations are refused,
    counted and named with its address (`kvtop status`), and nobody else is locked out. A live entry is only
    replaced from the client that registered it (another client's registration waits for it to expire), and an
    endpoint must be the client's own address (or in an --endpoint-network); refusals and replaced incarnations
    are counted and named in `kvtop status` (each client's latest refusal of each role, with its age, so that
    `kvtop check` names one only where it explains a missing rank). A rank whose refresh is refused after it
    started runs on, listed nowhere: `kvtop ranks` says `unlisted: ...` on its row. SIGTERM or Ctrl-C stops it
    (exit 0); an address it cannot bind exits 1; a key folder that cannot serve, or a --listen beyond
    loopback without --curve-keys or --insecure, exits 2.
    """
    import threading

    import zmq

    from transport.bootstrap import BootstrapServer
    from transport.curve import exposure_problem, stop_authenticator
    from transport.signals import stop_on

    if listen and not listen.startswith("tcp://"):
        raise typer.BadParameter(f"{listen!r} is not an address like tcp://127.0.0.1:5555", param_hint="--listen")
    if problem := exposure_problem([listen], bool(curve_keys), insecure):
        raise fail(problem, 2)
    networks = [ipaddress.ip_network(text, strict=False) for text in endpoint_network or []]
    keys = load_curve(curve_keys, serve=True)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        server = BootstrapServer(listen, context=context, curve=keys, endpoint_networks=networks).start()
    except zmq.ZMQError as error:
        stop_authenticator(context)
        context.destroy(linger=0)
        why = zmq.strerror(error.errno) if error.errno else error  # str() repeats the address: (addr='tcp://...')
        raise fail(f"bootstrap: cannot bind {listen}: {why}") from None
    stop = threading.Event()
    try:
        with stop_on(stop, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # before the address: its reader may stop us
            typer.echo(server.endpoint)
            sys.stdout.flush()
            while not stop.wait(0.5):
                pass
    finally:
        server.close()
        stop_authenticator(context)
        context.term()


def register(app: typer.Typer) -> None:
    app.callback()(local)
    cluster_app = typer.Typer(help="Run a local cluster of agents on loopback.", no_args_is_help=True)
    app.add_typer(cluster_app, name="cluster")
    cluster_app.command("up")(cluster_up)
    app.command("bootstrap")(bootstrap)
