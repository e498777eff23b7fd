"""`kvtop`: one Typer app. Commands parse their options and hand off; heavy imports stay lazy.

Exit codes: 0 success; 1 the work ran but failed (a benchmark whose rooms
failed, a cluster that did not come up or does not answer); 2 bad usage
(unknown option, bad value). `kvtop check` uses Nagios codes instead: 0 OK,
1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments included).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.units import format_size, parse_size

if TYPE_CHECKING:
    from kvtop.model import ClusterModel
    from transport.cluster import LocalCluster
    from transport.faults import FaultSpec
    from transport.workload import WorkloadStats

app = typer.Typer(
    help="top for KV transfers: watch, triage and check prefill/decode disaggregated serving clusters.\n\n"
    "With no command, kvtop starts an embedded local cluster (prefill and decode agents on loopback, "
    "a workload and a few injected faults) and shows its live status.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)
_check_ran = threading.Event()
"""Set once `kvtop check` got past argument parsing: its exit 2 is then CRITICAL, not a usage error."""
bench_app = typer.Typer(help="Measure kvtop against a baseline measured in the same run.", no_args_is_help=True)
cluster_app = typer.Typer(help="Run a local cluster of agents on loopback.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(cluster_app, name="cluster")

# Options shared by bare `kvtop` and `kvtop cluster up`.
Prefill = Annotated[int, typer.Option(min=1, max=8, help="Prefill instances.")]
Decode = Annotated[int, typer.Option(min=1, max=8, help="Decode instances.")]
Tp = Annotated[int, typer.Option(min=1, max=8, help="TP size of every instance (ranks per instance).")]
Rate = Annotated[float, typer.Option(min=0.1, help="Rooms started per second.")]
Faults = Annotated[
    list[str],
    typer.Option(
        help="Inject faults: [AGENT=]KIND[:RATE], e.g. prefill-0/TP1=corrupt:0.1, decode=die:0.01 or stall:0.05 "
        "(every agent); RATE is per room; kinds: drop, delay, corrupt, refuse, stall, die. Repeatable; "
        "'none' for no faults. Default: corrupt:0.02 on prefill-0/TP0, stall:0.01 on prefill-1."
    ),
]
Duration = Annotated[float | None, typer.Option(help="Stop after this many seconds (default: until Ctrl-C).")]
LogDir = Annotated[
    str, typer.Option(help="Folder for the agents' SGLang-format logs, one file per instance (default: a temp folder).")
]
BootstrapTimeout = Annotated[float, typer.Option(min=0.1, help="Seconds a room may stay in Bootstrapping.")]
WaitingTimeout = Annotated[float, typer.Option(min=0.1, help="Seconds a room may stay in WaitingForInput.")]
TransferTimeout = Annotated[float, typer.Option(min=0.1, help="Seconds a Transferring room may make no progress.")]


def _endpoint(value: str) -> str:
    """A ZeroMQ address, checked before any socket sees it ("" passes: the option was not given)."""
    if value and not re.fullmatch(r"(tcp|ipc)://\S+", value):
        raise typer.BadParameter(f"{value!r} is not an address like tcp://127.0.0.1:5555")
    return value


def _endpoints(values: list[str]) -> list[str]:
    return [_endpoint(value) for value in values]


# Options shared by the headless views.
Bootstrap = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_BOOTSTRAP",
        callback=_endpoint,
        help="Bootstrap address of the cluster, tcp://HOST:PORT (it lists every agent).",
    ),
]
Connect = Annotated[
    list[str],
    typer.Option(
        "--connect",
        callback=_endpoints,
        help="An agent's event endpoint, tcp://HOST:PORT (repeatable), instead of or beside --bootstrap.",
    ),
]
Wait = Annotated[float, typer.Option(min=0.1, help="Seconds to wait for every agent's snapshot.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (stable fields, see the README).")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"kvtop: {message}", err=True)
    return typer.Exit(code)


def _faults(texts: list[str]) -> dict[str, tuple[FaultSpec, ...]] | None:
    """`--fault [AGENT=]KIND[:RATE]` into the cluster's per-agent map; None keeps the demo faults."""
    from transport.errors import ConfigError
    from transport.faults import FaultSpec

    if not texts:
        return None
    if texts == ["none"]:
        return {}
    faults: dict[str, tuple[FaultSpec, ...]] = {}
    try:
        for text in texts:
            target, _, spec = text.rpartition("=")
            faults[target] = (*faults.get(target, ()), FaultSpec.parse(spec))
    except ConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--fault") from None
    return faults


def _source(bootstrap: str, connect: list[str]) -> None:
    if not bootstrap and not connect:
        raise typer.BadParameter("give --bootstrap ADDR (or KVTOP_BOOTSTRAP) or at least one --connect EP")


def _snapshot_model(bootstrap: str, connect: list[str], wait: float) -> tuple[ClusterModel, float]:
    """Every agent's snapshot applied to a fresh model (exit 1 when the cluster does not answer)."""
    import time

    from kvtop.collect import Collector
    from transport.errors import BootstrapError

    _source(bootstrap, connect)
    collector = Collector(bootstrap, connect)
    try:
        collector.start(discover_timeout_s=wait)
        collector.wait_synced(wait)
    except BootstrapError as error:
        raise _fail(str(error)) from None
    finally:
        collector.close()
    return collector.model, time.time()


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
) -> WorkloadStats:
    from kvtop.local import DEMO_TIMEOUTS, demo_spec, run_local
    from transport.config import Timeouts
    from transport.errors import ConfigError, TransportError
    from transport.workload import WorkloadSpec

    try:
        limits = Timeouts(*timeouts) if timeouts else DEMO_TIMEOUTS
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None
    spec = demo_spec(prefill, decode, tp, _faults(fault), log_dir or tempfile.mkdtemp(prefix="kvtop-logs-"), limits)

    def announce(cluster: LocalCluster) -> None:
        typer.echo(cluster.endpoint)

    emit = (lambda line: typer.echo(line, err=True)) if print_address else typer.echo
    try:
        return run_local(spec, WorkloadSpec(rate=rate), duration, emit, on_up=announce if print_address else None)
    except TransportError as error:
        raise _fail(str(error)) from None


@app.callback()
def local(
    ctx: typer.Context,
    prefill: Prefill = 2,
    decode: Decode = 2,
    tp: Tp = 2,
    rate: Rate = 20.0,
    fault: Faults = [],  # noqa: B006 - Typer reads the default, never mutates it
    duration: Duration = None,
    log_dir: LogDir = "",
) -> None:
    """Start an embedded local cluster with a workload and print its live status once a second."""
    if ctx.invoked_subcommand is not None:
        return
    stats = _run_cluster(prefill, decode, tp, rate, fault, duration, log_dir, None, print_address=False)
    typer.echo(f"done: {stats.succeeded} rooms ok, {stats.failed} failed, {stats.bytes_moved / 1e9:.2f} GB moved")


@cluster_app.command("up")
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
) -> None:
    """Start a bootstrap service, agents and a router on loopback; Ctrl-C or SIGTERM stops them all.

    The first line on stdout is the bootstrap address (tcp://127.0.0.1:PORT), the one address that lists
    every agent; status lines go to stderr.
    """
    timeouts = (bootstrap_timeout, waiting_timeout, transfer_timeout)
    stats = _run_cluster(prefill, decode, tp, rate, fault, duration, log_dir, timeouts, print_address=True)
    typer.echo(f"done: {stats.succeeded} rooms ok, {stats.failed} failed", err=True)


@app.command(
    "agent",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def agent(ctx: typer.Context) -> None:
    """Run one rank (all options as `python -m transport.agent`; `kvtop agent --help` lists them)."""
    from transport.agent import main as agent_main

    agent_main(ctx.args)


@app.command("check")
def check(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    max_failure_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="CRITICAL above this failed fraction of rooms (WARNING at half).")
    ] = 0.05,
    max_stuck: Annotated[int, typer.Option(min=0, help="CRITICAL above this many stuck rooms.")] = 0,
    stuck_after: Annotated[
        float, typer.Option(min=0.1, help="Seconds without progress that make a room stuck.")
    ] = 10.0,
    min_ranks: Annotated[
        int, typer.Option(min=0, help="CRITICAL below this many live ranks (0: every listed rank).")
    ] = 0,
    max_gaps: Annotated[int, typer.Option(min=0, help="WARNING above this many lost event batches.")] = 0,
    window: Annotated[float, typer.Option(min=1.0, help="Seconds of finished rooms the failure rate covers.")] = 60.0,
    wait: Wait = 2.0,
    as_json: Json = False,
) -> None:
    """Health check for cron, Nagios/Icinga, Kubernetes exec probes and CI gates.

    Prints `KVTOP <STATUS> - <text> | <perfdata>` (or JSON) and exits 0 OK, 1 WARNING, 2 CRITICAL
    (including: cluster unreachable, a rank gone, failure rate or stuck rooms over the limit),
    3 UNKNOWN (bad arguments, internal error).
    """
    _source(bootstrap, connect)
    _check_ran.set()
    from kvtop.check import Thresholds, Verdict, evaluate, unreachable
    from kvtop.collect import Collector
    from transport.errors import BootstrapError

    limits = Thresholds(max_failure_rate, max_stuck, stuck_after, min_ranks, max_gaps, window)
    collector = Collector(bootstrap, connect)
    try:
        collector.start(discover_timeout_s=wait)
        collector.wait_synced(wait)
        with collector.lock:
            result = evaluate(collector.model, limits)
    except BootstrapError as error:
        result = unreachable(bootstrap, str(error))
    except Exception as error:  # a check must answer UNKNOWN, never a traceback
        typer.echo(f"KVTOP UNKNOWN - internal error: {error!r}")
        raise typer.Exit(int(Verdict.UNKNOWN)) from None
    finally:
        collector.close()
    typer.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.nagios(limits))
    raise typer.Exit(int(result.verdict))


@app.command("status")
def status(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    window: Annotated[float, typer.Option(min=1.0, help="Seconds the rates and failures cover.")] = 60.0,
    wait: Wait = 2.0,
    as_json: Json = False,
) -> None:
    """One screen of cluster health: ranks, rooms, throughput, latency, failures, stuck rooms, links."""
    from kvtop.tables import status_json, status_text

    model, now = _snapshot_model(bootstrap, connect, wait)
    typer.echo(json.dumps(status_json(model, now, window), indent=2) if as_json else status_text(model, now, window))


@app.command("ranks")
def ranks(bootstrap: Bootstrap = "", connect: Connect = [], wait: Wait = 2.0, as_json: Json = False) -> None:  # noqa: B006
    """Every rank: role, instance, liveness (alive/stale/gone), host, pid, rooms in flight, origins, echoes."""
    from kvtop.tables import ranks_json, ranks_text

    model, now = _snapshot_model(bootstrap, connect, wait)
    typer.echo(json.dumps(ranks_json(model, now), indent=2) if as_json else ranks_text(model, now))


@app.command("rooms")
def rooms(bootstrap: Bootstrap = "", connect: Connect = [], wait: Wait = 2.0, as_json: Json = False) -> None:  # noqa: B006
    """Rooms still open on some rank: state per rank, bytes, age, idle time, link; STUCK after 10 s idle."""
    from kvtop.tables import rooms_json, rooms_text

    model, now = _snapshot_model(bootstrap, connect, wait)
    typer.echo(json.dumps(rooms_json(model, now), indent=2) if as_json else rooms_text(model, now))


@app.command("events")
def events(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
    level: Annotated[
        str, typer.Option(help="Lowest level shown: debug, info, warning, error (echoes are debug).")
    ] = "info",
    jsonl: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line.")] = False,
    wait: Wait = 2.0,
) -> None:
    """The event tail as log lines: what every agent remembers (its snapshot), then, with --follow, live."""
    import time

    from kvtop.event_lines import LEVELS, shown, snapshot_events, to_json, to_line
    from transport.bootstrap import BootstrapClient
    from transport.errors import BootstrapError
    from transport.events import Snapshot
    from transport.subscriber import EventSubscriber

    if level not in LEVELS:
        raise typer.BadParameter(f"{level!r} is not one of {', '.join(LEVELS)}", param_hint="--level")
    _source(bootstrap, connect)
    render = to_json if jsonl else to_line
    agents = []
    if bootstrap:
        try:
            with BootstrapClient(bootstrap, timeout_s=wait) as client:
                agents = client.list_agents()
        except BootstrapError as error:
            raise _fail(str(error)) from None
    subscriber = EventSubscriber()
    for agent in agents:
        subscriber.connect(agent)
    for endpoint in connect:
        subscriber.connect_endpoint(endpoint)
    deadline = time.monotonic() + wait
    try:
        while follow or (time.monotonic() < deadline and not subscriber.synced()):
            for delivered in subscriber.poll(0.1):
                item = delivered.item
                batch = snapshot_events(item) if isinstance(item, Snapshot) else item.events
                for event in batch:
                    if shown(event, level):
                        typer.echo(render(delivered.label, event))
    except KeyboardInterrupt:
        pass
    finally:
        subscriber.close()


@app.command("failures")
def failures(
    bootstrap: Bootstrap = "",
    connect: Connect = [],  # noqa: B006
    debug: Annotated[bool, typer.Option("--debug", help="List every echo under its origin.")] = False,
    as_json: Json = False,
    wait: Wait = 2.0,
) -> None:
    """Recent failures of a live cluster, each origin once with its echo count (echoes folded under it).

    Reads every agent's snapshot (its last 512 failures) and what agents publish meanwhile. JSON: a list
    of groups {room, origin: {rank, role, instance, reason, reason_class, ts, level} or null, origin_label,
    echo_count, echoes}. Exit 1 when the cluster does not answer.
    """
    from kvtop.failures_view import render_groups, to_json

    model, _ = _snapshot_model(bootstrap, connect, wait)
    groups = model.groups()
    if as_json:
        typer.echo(json.dumps(to_json(groups), indent=2))
        return
    typer.echo(render_groups(groups, debug))
    typer.echo(f"{len(groups)} failures from {len(model.ranks)} ranks", err=True)


@bench_app.command("transfer")
def bench_transfer(
    chunk_bytes: Annotated[
        list[str], typer.Option("--chunk-bytes", help="Chunk size to measure (repeatable): 65536, 64KiB, 1MiB.")
    ] = ["64KiB", "1MiB", "4MiB"],  # noqa: B006
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room.")] = "64MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per kvtop run (the first one warms up).")] = 32,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """KV transfer GB/s over loopback vs raw pyzmq PUSH/PULL at the same message size, and their ratio.

    Each run starts a prefill rank process and a decode rank (KV pools, bootstrap, credits, checksums,
    events) and, alternating with it, a raw PUSH process sending zero-copy into a PULL that lands each
    message with recv_into in a numpy buffer; a third leg repeats the kvtop run with checksums off.
    Progress goes to stderr.
    """
    from kvtop.bench.transfer import measure

    try:
        sizes = [parse_size(text) for text in chunk_bytes]
        room = parse_size(room_bytes)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    results = measure(sizes, room, rooms, repeats, lambda line: typer.echo(line, err=True))
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    typer.echo(f"{'chunk':>8} {'raw GB/s':>9} {'kvtop GB/s':>11} {'ratio':>6} {'unchecked GB/s':>15} {'ratio':>6}")
    for r in results:
        typer.echo(
            f"{format_size(r.chunk_bytes):>8} {r.raw_gbps:>9.2f} {r.kvtop_gbps:>11.2f} {r.ratio:>6.2f} "
            f"{r.kvtop_unchecked_gbps:>15.2f} {r.ratio_unchecked:>6.2f}"
        )


@bench_app.command("events")
def bench_events(
    chunk_bytes: Annotated[str, typer.Option(help="Chunk size of the transfer legs.")] = "1MiB",
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room (smaller rooms: more events).")] = "4MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per transfer run.")] = 256,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of text.")] = False,
) -> None:
    """What publishing events costs the transfer path, and how many events/s one publisher sustains.

    Alternates transfer runs with events on and off (same rooms, same sizes) and reports the median
    GB/s of each and the cost (1 - on/off; the target is <= 0.03). Then pushes events through one
    publisher to a subscriber as fast as it takes them. Progress goes to stderr.
    """
    from kvtop.bench.events import measure_events

    try:
        chunk, room = parse_size(chunk_bytes), parse_size(room_bytes)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    result = measure_events(chunk, room, rooms, repeats, lambda line: typer.echo(line, err=True))
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    typer.echo(
        f"events on {result.gbps_events_on:.2f} GB/s, off {result.gbps_events_off:.2f} GB/s, "
        f"cost {result.cost:+.1%}; publisher {result.events_per_s:,.0f} events/s"
    )


@bench_app.command("ingest")
def bench_ingest(
    events: Annotated[int, typer.Option(min=1000, help="Events per run.")] = 500_000,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of text.")] = False,
) -> None:
    """Events/s applied to the cluster model vs decoding the same frames alone, and `kvtop check` wall time.

    Targets (DESIGN.md): >= 300k events/s on one core and >= 0.5 x decode-only; check <= 1 s.
    """
    from kvtop.bench.ingest import measure_ingest

    result = measure_ingest(events, repeats, lambda line: typer.echo(line, err=True))
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    typer.echo(
        f"ingest {result.events_per_s:,.0f} events/s, decode only {result.decode_only_per_s:,.0f} "
        f"(ratio {result.ratio:.2f}); kvtop check {result.check_wall_s:.2f} s"
    )


def main() -> None:
    """Console entry point: usage errors exit 2, except for `kvtop check`, whose bad arguments are UNKNOWN (3)."""
    # kvtop does no linear algebra: idle OpenBLAS threads only compete for the cores that move KV.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        app(prog_name="kvtop")
    except SystemExit as exit_:
        usage_error = exit_.code == 2 and sys.argv[1:2] == ["check"] and not _check_ran.is_set()
        sys.exit(3 if usage_error else exit_.code)


if __name__ == "__main__":
    main()
