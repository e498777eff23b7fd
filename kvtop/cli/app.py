"""`kvtop`: one Typer app. Commands parse their options and hand off; heavy imports stay lazy.

Exit codes: 0 success; 1 the work ran but failed (a benchmark whose rooms
failed, a cluster that did not come up); 2 bad usage (unknown option, bad value).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.units import format_size, parse_size

if TYPE_CHECKING:
    from transport.faults import FaultSpec

app = typer.Typer(
    help="top for KV transfers: watch, triage and check prefill/decode disaggregated serving clusters.\n\n"
    "With no command, kvtop starts an embedded local cluster (prefill and decode agents on loopback, "
    "a workload and a few injected faults) and shows its live status.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Measure kvtop against a baseline measured in the same run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"kvtop: {message}", err=True)
    return typer.Exit(code)


def _faults(texts: list[str]) -> dict[str, tuple[FaultSpec, ...]] | None:
    """`--fault [TARGET=]KIND[:RATE]` into the cluster's per-agent map; None keeps the demo faults."""
    from transport.faults import FaultSpec

    if not texts:
        return None
    if texts == ["none"]:
        return {}
    faults: dict[str, tuple[FaultSpec, ...]] = {}
    for text in texts:
        target, _, spec = text.rpartition("=")
        faults[target] = (*faults.get(target, ()), FaultSpec.parse(spec))
    return faults


@app.callback()
def local(
    ctx: typer.Context,
    prefill: Annotated[int, typer.Option(min=1, max=8, help="Prefill instances.")] = 2,
    decode: Annotated[int, typer.Option(min=1, max=8, help="Decode instances.")] = 2,
    tp: Annotated[int, typer.Option(min=1, max=8, help="TP size of every instance (ranks per instance).")] = 2,
    rate: Annotated[float, typer.Option(min=0.1, help="Rooms started per second.")] = 20.0,
    fault: Annotated[
        list[str],
        typer.Option(
            help="Inject faults: [AGENT=]KIND[:RATE], e.g. prefill-0/TP1=corrupt:0.1 or decode=die:0.01; "
            "kinds: drop, delay, corrupt, refuse, stall, die. Repeatable; 'none' for no faults. "
            "Default: corrupt:0.02 on prefill-0/TP0, stall:0.01 on prefill-1."
        ),
    ] = [],  # noqa: B006 - Typer reads the default, never mutates it
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: until Ctrl-C).")
    ] = None,
    log_dir: Annotated[
        str, typer.Option(help="Folder for the agents' SGLang-format logs (default: a new temporary folder).")
    ] = "",
) -> None:
    """Start an embedded local cluster with a workload and print its live status once a second."""
    if ctx.invoked_subcommand is not None:
        return
    import tempfile

    from kvtop.local import demo_spec, run_local
    from transport.errors import ConfigError, TransportError
    from transport.workload import WorkloadSpec

    try:
        faults = _faults(fault)
    except ConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--fault") from None
    spec = demo_spec(prefill, decode, tp, faults, log_dir or tempfile.mkdtemp(prefix="kvtop-logs-"))
    try:
        stats = run_local(spec, WorkloadSpec(rate=rate), duration, typer.echo)
    except TransportError as error:
        raise _fail(str(error)) from None
    typer.echo(f"done: {stats.succeeded} rooms ok, {stats.failed} failed, {stats.bytes_moved / 1e9:.2f} GB moved")


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

    Each run starts a prefill rank process and a decode rank (KV pools, bootstrap, credits, checksums)
    and, alternating with it, a raw PUSH process sending zero-copy into a PULL that lands each message
    with recv_into in a numpy buffer. Progress goes to stderr.
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
    typer.echo(f"{'chunk':>8} {'kvtop GB/s':>11} {'raw GB/s':>9} {'ratio':>6}")
    for r in results:
        typer.echo(f"{format_size(r.chunk_bytes):>8} {r.kvtop_gbps:>11.2f} {r.raw_gbps:>9.2f} {r.ratio:>6.2f}")


def main() -> None:
    """Console entry point."""
    # kvtop does no linear algebra: idle OpenBLAS threads only compete for the cores that move KV.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    app(prog_name="kvtop")


if __name__ == "__main__":
    main()
