"""`kvtop bench ...`: each benchmark compares against a baseline measured in the same run.

A benchmark whose measured work did not happen (no events applied, no frame drawn, rooms failed, a check
without a verdict) exits 1 with one line on stderr saying what was missing; bad sizes exit 2. A Ctrl-C says so in
one line at once and exits 130 once the bench's processes stopped (each stops on the same Ctrl-C, quietly:
`kvtop.bench.child`); a second one does not cut that short.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Annotated

import typer

from kvtop.bench import BenchFailed
from kvtop.bench.report import Report, text
from kvtop.cli.options import INTERRUPTION_SAID, MAX_INTERVAL_S
from kvtop.cli.units import parse_size
from transport.signals import interrupt

JsonObject = Annotated[bool, typer.Option("--json", help="Print a JSON object instead of text.")]
SyntheticRooms = Annotated[int, typer.Option(min=1000, help="Rooms in the synthetic model.")]
SyntheticInstances = Annotated[int, typer.Option(min=1, help="Prefill instances, and as many decode instances.")]
SyntheticTp = Annotated[int, typer.Option(min=1, help="Ranks per instance (8+8 instances of TP 4: 64 ranks).")]
"""The synthetic model of the dashboard's benchmarks (`kvtop.bench.ui_load`)."""


def _on_ctrl_c(ctx: typer.Context) -> None:
    """Every bench: a Ctrl-C says which bench stops, then stops it (`transport.signals.interrupt`: once)."""
    said = f"kvtop bench {ctx.invoked_subcommand}: interrupted, stopping\n".encode()

    def interrupted(signum: int, frame: FrameType | None) -> None:
        os.write(2, said)  # not through sys.stderr, whose buffer a progress line may be in
        INTERRUPTION_SAID.set()  # said: the exit 130 Typer returns for it needs no other line
        interrupt(signum, frame)

    signal.signal(signal.SIGINT, interrupted)


def _progress(line: str) -> None:
    typer.echo(line, err=True)


@contextlib.contextmanager
def _loud(name: str) -> Iterator[None]:
    """Turn a benchmark's BenchFailed into one line on stderr and exit 1."""
    try:
        yield
    except BenchFailed as error:
        typer.echo(f"kvtop bench {name}: FAILED: {error}", err=True)
        raise typer.Exit(1) from None


def _report(data: Mapping[str, object], report: Report, as_json: bool) -> None:
    """A benchmark's result: as JSON for scripts, or as `kvtop.bench.report` reads it for people."""
    typer.echo(json.dumps(data, indent=2) if as_json else text(data, report))


def bench_transfer(
    chunk_bytes: Annotated[
        list[str],
        typer.Option(
            "--chunk-bytes",
            metavar="SIZE",
            help="Chunk size to measure (repeatable): 65536, 64KiB, 1MiB; at most 64KiB or a multiple of it "
            "(kvtop sends whole 64 KiB pages, and every leg moves messages of this size).",
        ),
    ] = ["64KiB", "1MiB", "4MiB"],  # noqa: B006
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room (a whole number of chunks).")] = "64MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per kvtop run (the first one warms up).")] = 32,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    floor: Annotated[
        bool,
        typer.Option(
            "--floor",
            help="Add two legs of the protocol's least work in pure pyzmq (kvtop's frames sent with SNDMORE, "
            "payloads as registered memory, no per-chunk poll, recv_into, credit window), with kvtop's per-chunk "
            "xxh3 and without checksums, to split the gap into protocol and implementation; and raw with "
            "registered sends (raw without pyzmq's garbage-collector round trip per frame).",
        ),
    ] = False,
    e2e: Annotated[
        bool,
        typer.Option(
            "--e2e",
            help="Add a least-work leg with end-to-end page checksums: pages hashed when written, digests "
            "in the chunk header, each landed page verified (no hash on the sender's transfer path).",
        ),
    ] = False,
    vs_mooncake: Annotated[
        bool,
        typer.Option(
            "--vs-mooncake",
            help="Add a leg with Mooncake Transfer Engine's TCP transport between two processes on loopback (same "
            "bytes, same transfer size) and kvtop's ratio to it. Needs the optional extra: pip install "
            "'kvtop[mooncake]'; fails at once when it is missing.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """KV transfer GB/s over loopback vs raw pyzmq PUSH/PULL at the same message size, and their ratio.

    Each run starts a prefill rank process and a decode rank (KV pools, bootstrap, credits, checksums,
    events) and, alternating with it, a raw PUSH process sending zero-copy into a PULL that lands each
    message with recv_into in a numpy buffer; a third leg repeats the kvtop run with checksums off; --floor
    and --e2e add the bare protocol without kvtop (--floor also raw with registered sends, as kvtop's prefill
    ranks send), --vs-mooncake Mooncake's TCP transport. Exits 1 when a room
    or a checksum failed or Mooncake was asked for and is missing, 2 for sizes the legs cannot share. Progress
    goes to stderr.
    """
    from kvtop.bench.transfer import measure

    try:
        sizes = [parse_size(text) for text in chunk_bytes]
        room = parse_size(room_bytes)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with _loud("transfer"):
        try:
            results = measure(sizes, room, rooms, repeats, _progress, floor=floor, e2e=e2e, mooncake=vs_mooncake)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="'--chunk-bytes' / '--room-bytes'") from None
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    typer.echo("\n\n".join(text(r.as_dict(), r.REPORT) for r in results))


def bench_events(
    chunk_bytes: Annotated[str, typer.Option(help="Chunk size of the transfer legs.")] = "1MiB",
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room (smaller rooms: more events).")] = "4MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per transfer run.")] = 256,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    as_json: JsonObject = False,
) -> None:
    """What publishing events costs a watched cluster's transfer path, and how many events/s one publisher sustains.

    Alternates transfer runs with events on, watched by a collector in its own process that decodes every
    batch into a cluster model (as `kvtop top` does), and events off (same rooms, same sizes); reports the
    median GB/s of each and the cost (1 - on/off; the target is <= 0.03), with what the collector applied.
    Then pushes events through one publisher to a subscriber as fast as it takes them. Exits 1 when a
    watched run's collector applied no events. Progress goes to stderr.
    """
    from kvtop.bench.events import measure_events
    from kvtop.bench.transfer import check_sizes

    try:
        chunk, room = parse_size(chunk_bytes), parse_size(room_bytes)
        check_sizes(chunk, room)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with _loud("events"):
        result = measure_events(chunk, room, rooms, repeats, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_ingest(
    events: Annotated[int, typer.Option(min=1000, help="Events per run.")] = 500_000,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 5,
    floor: Annotated[
        bool,
        typer.Option(
            "--floor",
            help="Add a leg that decodes and keeps only each room's state per rank in a dict: the least any "
            "model keyed by room pays, to tell the model's own cost from the data structure's.",
        ),
    ] = False,
    as_json: JsonObject = False,
) -> None:
    """Events/s applied to the cluster model vs decoding the same frames alone, and `kvtop check` wall time.

    The check is timed against a local 1P1D TP2 cluster under load (the workload driving 20 rooms/s);
    exits 1 when a check gives no verdict (exit code not 0-2, or UNKNOWN) or no room finished meanwhile.
    Targets (DESIGN.md): >= 300k events/s on one core and >= 0.5 x decode-only; check <= 1 s.
    """
    from kvtop.bench.ingest import measure_ingest

    with _loud("ingest"):
        result = measure_ingest(events, repeats, _progress, floor=floor)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_incidents(
    rooms: Annotated[int, typer.Option(min=1000, help="Synthetic rooms per ingest run (5 % of them fail).")] = 20_000,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg, back to back; figures are medians.")] = 9,
    memory_rooms: Annotated[
        int, typer.Option(min=10_000, help="Failed rooms fed to the model to show its memory stays bounded.")
    ] = 1_000_000,
    as_json: JsonObject = False,
) -> None:
    """What the incidents cost ingest, against the same model whose incident tracker takes nothing, and the
    model's memory with a million failed rooms (RSS at 10 %, 50 % and 100 %).

    Target (DESIGN.md): incidents <= 5 % of ingest; memory bounded with 1M failed rooms. Exits 1 when no failure
    was taken in or no incident formed.
    """
    from kvtop.bench.incidents import measure_incidents

    with _loud("incidents"):
        result = measure_incidents(rooms, repeats, memory_rooms, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_ui(
    rooms: SyntheticRooms = 100_000,
    instances: SyntheticInstances = 8,
    tp: SyntheticTp = 4,
    events_per_s: Annotated[
        float, typer.Option(min=1000, max=10_000_000, help="Events/s applied while the dashboard runs.")
    ] = 50_000,
    seconds: Annotated[
        float,
        typer.Option(
            min=1, max=MAX_INTERVAL_S, help="Seconds of watching (a quarter per view); half as long again of keys."
        ),
    ] = 30.0,
    key_timeout_s: Annotated[
        float,
        typer.Option(
            min=0, max=MAX_INTERVAL_S, help="How long a key may take to show its view; a key that takes longer fails."
        ),
    ] = 5.0,
    record: Annotated[
        bool,
        typer.Option(
            "--record/--no-record",
            help="The dashboard records what it is fed, as it does on a live cluster by default (--no-record: not).",
        ),
    ] = True,
    in_process: Annotated[
        bool,
        typer.Option(
            "--in-process",
            help="Feed the model in the dashboard's own process instead of its model process (the design before "
            "the split, for comparison).",
        ),
    ] = False,
    as_json: JsonObject = False,
) -> None:
    """The dashboard on a big synthetic model, in a pseudo-terminal, while events stream in: frame and key latency.

    frame: UI-thread time from a frame's arrival until painted, while each view is watched in turn (target
    p99 <= 40 ms); build: worker time to build a frame from the model; data age: from a frame's read of the
    model until painted, and until the next frame replaced it (the oldest data on screen; target p99 <= 250
    ms); key to screen: a view key until the new view's bytes reach the terminal (target <= 80 ms). Exits 1
    when a watched view painted no frame or a key did not show its view in time. Progress goes to stderr.
    """
    from kvtop.bench.ui import measure_ui

    with _loud("ui"):
        result = measure_ui(rooms, instances, tp, events_per_s, seconds, _progress, key_timeout_s, record, in_process)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_sglang_log(
    size_mb: Annotated[int, typer.Option(min=1, help="Size of the generated log in MiB.")] = 1024,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 3,
    failed_rooms: Annotated[
        int,
        typer.Option(
            min=0,
            help="Instead: a log in which each of this many lines fails a room of its own; time `kvtop failures` "
            "on it (its own process) and its peak RSS.",
        ),
    ] = 0,
    as_json: JsonObject = False,
) -> None:
    """Lines/s of the SGLang log source vs plain Python line iteration of the same file, and RSS growth.

    Generates a decode server log (about 1 % of lines about transfers) in a temporary folder, removed
    afterwards, and reads it both ways, alternating. Target: ratio >= 0.3, memory flat. With --failed-rooms:
    `kvtop failures --sglang-log` on a log of that many failed rooms, its wall time and peak RSS (medians);
    exit 1 when it fails or does not say how many failures it did not keep. Progress on stderr.
    """
    from kvtop.bench.sglang_log import measure_failed_rooms, measure_sglang_log

    if failed_rooms:
        with _loud("sglang-log"):
            rooms = measure_failed_rooms(failed_rooms, repeats, _progress)
        _report(rooms.as_dict(), rooms.REPORT, as_json)
        return
    result = measure_sglang_log(size_mb, repeats, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_sglang_plugin(
    calls: Annotated[int, typer.Option(min=100, help="Poll calls per leg and run.")] = 20_000,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg, alternated; figures are medians.")] = 9,
    failed_rooms: Annotated[int, typer.Option(min=1, help="Failed rooms per leg and run (a call each).")] = 200,
    as_json: JsonObject = False,
) -> None:
    """What the kvtop SGLang plugin adds to SGLang's own KV sender calls: hooked vs plain, in the same run.

    A real SGLang prefill rank (a child process; SGLang loads the plugin with its own load_plugins()) times
    MooncakeKVSender.poll on a room waiting in Bootstrapping and failure_exception on rooms aborted through
    SGLang, plain and hooked, alternated, while a collector here receives what the plugin publishes. Target:
    <= 2 us added per poll call (median). Needs SGLang and Mooncake in this Python (`make test-sglang` builds
    .venv-sglang: run `.venv-sglang/bin/kvtop bench sglang-plugin`); exits 1 when they are missing, when the
    plugin did not hook, or when the collector did not receive every hooked failure. Progress on stderr.
    """
    from kvtop.bench.sglang_plugin import measure_sglang_plugin

    with _loud("sglang-plugin"):
        result = measure_sglang_plugin(calls, repeats, failed_rooms, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_export(
    rooms: SyntheticRooms = 100_000,
    instances: SyntheticInstances = 4,
    tp: Annotated[int, typer.Option(min=1, help="Ranks per instance (4+4 instances of TP 8: 64 ranks).")] = 8,
    repeats: Annotated[int, typer.Option(min=1, help="Later scrapes (each after 500 new rooms); medians.")] = 15,
    as_json: JsonObject = False,
) -> None:
    """A Prometheus scrape of a 100k-room model vs a `kvtop status --json` frame of it, and the lock it holds.

    The model is `bench ui`'s (nearly every room open, a third stalled, failures with echoes). The first
    scrape folds every failure held; each later one follows 500 new rooms. Exits 1 when a scrape does not
    count the origins and echoes the fold finds. Progress on stderr.
    """
    from kvtop.bench.export import measure_export

    with _loud("export"):
        result = measure_export(rooms, instances, tp, repeats, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_curve(
    chunk_bytes: Annotated[str, typer.Option(help="Chunk size of the transfer legs.")] = "1MiB",
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room (a whole number of chunks).")] = "64MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per transfer run (the first one warms up).")] = 16,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 3,
    event_seconds: Annotated[
        float, typer.Option(min=0.5, max=MAX_INTERVAL_S, help="Seconds each event leg is timed.")
    ] = 2.0,
    curve_keys: Annotated[
        str,
        typer.Option("--curve-keys", metavar="DIR", help="Key folder to use (default: fresh keys in a temp folder)."),
    ] = "",
    as_json: JsonObject = False,
) -> None:
    """CURVE on vs off, same run: event throughput to a listening subscriber, and KV transfer GB/s.

    Alternates plain and CURVE legs: one publisher emitting as fast as it can to the collector's decoding
    subscriber (events/s), and a prefill and a decode process moving rooms with events and checksums on
    (GB/s, CPU s/GB). Ratios are CURVE over plain, of medians. Exits 1 when what a leg measures did not
    happen (no event arrived, a room failed, a client without keys was answered), 2 for bad sizes or keys.
    """
    from kvtop.bench.curve import measure_curve
    from kvtop.cli.options import load_curve

    load_curve(curve_keys, serve=True)
    try:
        chunk, room = parse_size(chunk_bytes), parse_size(room_bytes)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with _loud("curve"):
        try:
            result = measure_curve(chunk, room, rooms, repeats, event_seconds, _progress, curve_keys)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="'--chunk-bytes' / '--room-bytes'") from None
    _report(result.as_dict(), result.REPORT, as_json)


def bench_sidecar(
    lines_per_s: Annotated[int, typer.Option(min=1000, help="Lines per second the writer appends.")] = 50_000,
    failures_per_s: Annotated[int, typer.Option(min=1, help="Failure lines (new rooms) per second among them.")] = 20,
    seconds: Annotated[float, typer.Option(min=1.0, max=MAX_INTERVAL_S, help="Seconds of the timed window.")] = 10.0,
    as_json: JsonObject = False,
) -> None:
    """The log sidecar's CPU and line-to-event delay on a growing log, vs a bare tail loop on the same file.

    A writer appends a busy decode server's log; the sidecar (`kvtop agent --sglang-log`, its own process)
    publishes each failure line to a kvtop collector; a bare Python tail loop (its own process) reads the
    same file. Reports each one's CPU, their ratio, and the delay from a failure line's write to its event
    in the collector (the tail: to its line read), median and p99. Exits 1 when the writer fell short of
    the rate or a failure line was not seen by both. Progress on stderr.
    """
    from kvtop.bench.sidecar import measure_sidecar

    with _loud("sidecar"):
        result = measure_sidecar(lines_per_s, failures_per_s, seconds, _progress)
    _report(result.as_dict(), result.REPORT, as_json)


def bench_fanin(
    agents: Annotated[int, typer.Option(min=1, max=4096, help="Agents publishing (the event plane only).")] = 1024,
    rate: Annotated[
        float, typer.Option(min=1.0, max=1e6, help="Events per second each agent emits (heartbeats included).")
    ] = 200.0,
    processes: Annotated[int, typer.Option(min=1, max=64, help="Processes the agents run in.")] = 8,
    seconds: Annotated[
        float, typer.Option(min=1.0, max=MAX_INTERVAL_S, help="Seconds of each measured window.")
    ] = 10.0,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg (direct, relay, alternating); medians.")] = 3,
    curve: Annotated[
        bool,
        typer.Option(
            "--curve",
            help="Also the same legs with CURVE on every socket (agents, bootstrap, relay, collector; fresh keys), "
            "alternating with the plain ones: CURVE vs plain in one run.",
        ),
    ] = False,
    as_json: JsonObject = False,
) -> None:
    """Fan-in: AGENTS publishers at RATE events/s into one collector, directly and through one `kvtop relay`.

    Per leg: events/s applied vs emitted, gaps, the collector's CPU (cores), RSS and open files, its snapshot
    sync time as a late joiner, the relay's CPU, the agents' own CPU. The floor legs (a bare SUB that receives
    and decodes the same frames, nothing applied) are the baseline of the same run. Exits 1 when a collector
    did not sync, heard fewer agents than started, or applied nothing. Raises the soft open-files limit as far
    as the hard one allows.
    """
    from kvtop.bench.fanin import REPORT, measure

    with _loud("fanin"):
        result = measure(agents, rate, processes, seconds, repeats, _progress, curve=curve)
    _report(result, REPORT, as_json)


def bench_replay(
    chunk_bytes: Annotated[str, typer.Option(help="Chunk size of the transfer legs.")] = "1MiB",
    room_bytes: Annotated[str, typer.Option(help="KV bytes per room (smaller rooms: more events).")] = "4MiB",
    rooms: Annotated[int, typer.Option(min=2, help="Rooms per transfer run.")] = 256,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per leg; figures are medians.")] = 3,
    ingest_events: Annotated[int, typer.Option(min=10_000, help="Events per ingest run.")] = 300_000,
    hours: Annotated[
        float, typer.Option(min=0.01, max=24, help="Hours of the synthetic recording the seeks use.")
    ] = 1.0,
    seeks: Annotated[int, typer.Option(min=1, help="Seeks to random times (median and worst reported).")] = 20,
    as_json: JsonObject = False,
) -> None:
    """What the flight recorder costs, and how fast a recording seeks, each against a baseline of the same run.

    Transfer runs watched by a collector that records vs one that does not (target: <= 3 % cost); the
    collector's ingest with and without recording; the recorder alone on one core (target: >= 200k
    events/s); bytes per million events (real recordings, and synthetic); the same blocks in segments and in
    SQLite (WAL); seeks to random times of a synthetic hour at 50k events/s (target: <= 200 ms), with the
    memory one took. Exits 1 when a leg did not record what it claims. Progress goes to stderr.
    """
    from kvtop.bench.replay import measure_replay
    from kvtop.bench.transfer import check_sizes

    try:
        chunk, room = parse_size(chunk_bytes), parse_size(room_bytes)
        check_sizes(chunk, room)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with _loud("replay"):
        r = measure_replay(chunk, room, rooms, repeats, ingest_events, hours, seeks, _progress)
    _report(r.as_dict(), r.REPORT, as_json)


def bench_keyframe(
    rooms: SyntheticRooms = 100_000,
    instances: SyntheticInstances = 8,
    tp: SyntheticTp = 4,
    events_per_s: Annotated[
        float, typer.Option(min=1000, max=10_000_000, help="Events/s applied while keyframes are taken.")
    ] = 50_000,
    seconds: Annotated[
        float, typer.Option(min=2, max=MAX_INTERVAL_S, help="Seconds per leg (captured under the lock, forked).")
    ] = 15,
    keyframe_s: Annotated[
        float, typer.Option(min=0.5, max=MAX_INTERVAL_S, help="A keyframe this often (the dashboard: a minute).")
    ] = 2,
    as_json: JsonObject = False,
) -> None:
    """How long a keyframe of a 100k-room model holds the collector's lock: forked vs captured under the lock.

    The model is `bench ui`'s; each leg applies events under a lock as the collector does, with a started
    recorder taking a keyframe every --keyframe-s. Reports the keyframe's lock time (median, worst), every
    pass's, the passes while a child worked, the children's CPU and memory (target: <= 30 ms under the
    lock). Exits 1 when a leg took no keyframe or a child failed. Progress on stderr.
    """
    from kvtop.bench.keyframe import measure_keyframe

    with _loud("keyframe"):
        r = measure_keyframe(rooms, instances, tp, events_per_s, seconds, keyframe_s, _progress)
    _report(r.as_dict(), r.REPORT, as_json)


def bench_attach(
    rooms: SyntheticRooms = 100_000,
    instances: SyntheticInstances = 8,
    tp: SyntheticTp = 4,
    events_per_s: Annotated[
        float, typer.Option(min=1000, max=10_000_000, help="Events/s applied while the checks run.")
    ] = 50_000,
    runs: Annotated[int, typer.Option(min=1, help="Checks (and baselines) started.")] = 5,
    as_json: JsonObject = False,
) -> None:
    """`kvtop check --model` on a dashboard's model process (`bench ui`'s load), against Python's start.

    Each run starts, as a probe would, the baseline (the same check on an endpoint where nothing answers,
    less its 0.1 s wait: Python's start and the check's imports) and `kvtop check --model-at PID`
    (target: <= 1 s wall, Python's start included); reports their medians and ratio, how long an answer
    takes and holds the model's lock (what the dashboard's frames wait for), and the keyframe's size.
    Exits 1 when a check gave no verdict or the load did not run. Progress on stderr.
    """
    from kvtop.bench.attach import measure_attach

    with _loud("attach"):
        r = measure_attach(rooms, instances, tp, events_per_s, runs, _progress)
    _report(r.as_dict(), r.REPORT, as_json)


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(help="Measure kvtop against a baseline measured in the same run.", no_args_is_help=True)
    app.add_typer(bench_app, name="bench")
    bench_app.callback()(_on_ctrl_c)
    bench_app.command("attach")(bench_attach)
    bench_app.command("keyframe")(bench_keyframe)
    bench_app.command("sidecar")(bench_sidecar)
    bench_app.command("transfer")(bench_transfer)
    bench_app.command("events")(bench_events)
    bench_app.command("curve")(bench_curve)
    bench_app.command("replay")(bench_replay)
    bench_app.command("ingest")(bench_ingest)
    bench_app.command("incidents")(bench_incidents)
    bench_app.command("ui")(bench_ui)
    bench_app.command("sglang-log")(bench_sglang_log)
    bench_app.command("sglang-plugin")(bench_sglang_plugin)
    bench_app.command("export")(bench_export)
    bench_app.command("fanin")(bench_fanin)
