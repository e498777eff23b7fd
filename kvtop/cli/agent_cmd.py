"""`kvtop agent`: one rank of kvtop's KV transfer engine as a process (the options become `AgentOptions`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.options import MAX_WAIT_S, Insecure, bind_endpoint, fail, key_folder
from transport.config import LogLevel, Role, Timeouts, TransferConfig
from transport.registration import MAX_PAGE_BYTES, MAX_TP

if TYPE_CHECKING:
    from transport.harness.agent import AgentOptions

SIDECAR = "--sglang-log"
"""Given, `kvtop agent` is the log sidecar of a real SGLang server instead (`kvtop.cli.sidecar_cmd`)."""

_TRANSFER = TransferConfig()
_TIMEOUTS = Timeouts()


def agent(
    role: Annotated[Role, typer.Option(help="Which side this rank serves.", show_default=False)],
    instance: Annotated[
        str, typer.Option(help="The instance's name, unique in the cluster, e.g. prefill-0.", show_default=False)
    ],
    bootstrap: Annotated[
        str, typer.Option(help="The bootstrap service's address, tcp://HOST:PORT (`kvtop bootstrap`).")
    ],
    rank: Annotated[int, typer.Option(min=0, help="TP rank within the instance (below --tp).")] = 0,
    tp: Annotated[int, typer.Option(min=1, max=MAX_TP, help="TP size of the instance (its ranks).")] = 1,
    pages: Annotated[
        int,
        typer.Option(
            min=1, help="KV pool size in pages (the pool, --pages x --page-bytes, within this machine's memory)."
        ),
    ] = 4096,
    page_bytes: Annotated[
        int, typer.Option(min=1, max=MAX_PAGE_BYTES, help="Bytes per page on this rank (at most 1 GiB).")
    ] = 16 << 10,
    host: Annotated[
        str,
        typer.Option(help="Address the data and control sockets bind (beyond loopback: --curve-keys or --insecure)."),
    ] = "127.0.0.1",
    control: Annotated[
        str,
        typer.Option(
            callback=bind_endpoint,
            help="Control endpoint to bind, tcp://HOST:PORT, PORT 0 to 65535 (default: a free port on --host).",
        ),
    ] = "",
    chunk_bytes: Annotated[int, typer.Option(min=1, help="Bytes per data frame.")] = _TRANSFER.chunk_bytes,
    window_bytes: Annotated[
        int, typer.Option(min=1, help="Bytes a prefill rank may have unacknowledged on one link (at least a chunk).")
    ] = _TRANSFER.window_bytes,
    bootstrap_timeout: Annotated[
        float, typer.Option(min=0.001, max=MAX_WAIT_S, help="Seconds a room may stay in Bootstrapping.")
    ] = _TIMEOUTS.bootstrap_s,
    waiting_timeout: Annotated[
        float, typer.Option(min=0.001, max=MAX_WAIT_S, help="Seconds a room may stay in WaitingForInput.")
    ] = _TIMEOUTS.waiting_s,
    transfer_timeout: Annotated[
        float, typer.Option(min=0.001, max=MAX_WAIT_S, help="Seconds a Transferring room may make no progress.")
    ] = _TIMEOUTS.transfer_s,
    heartbeat: Annotated[
        float,
        typer.Option(min=0.001, max=MAX_WAIT_S, help="Seconds between heartbeats on each link (below --peer-timeout)."),
    ] = _TRANSFER.heartbeat_s,
    peer_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=MAX_WAIT_S,
            help="Seconds until a silent peer is lost; also how long a rank of this instance may go without voting "
            "on a room this rank took before the room fails (timeout_consensus).",
        ),
    ] = _TRANSFER.peer_timeout_s,
    checksums: Annotated[
        bool,
        typer.Option(
            help="Verify every page where it lands (xxh3: sealed pages against their writer's digest, others per "
            "chunk); --no-checksums trusts TCP's own checks."
        ),
    ] = _TRANSFER.checksums,
    fault: Annotated[
        list[str],
        typer.Option(
            metavar="SPEC",
            help="Inject a fault: KIND[:RATE][@PEER] (drop, delay, corrupt, refuse, stall act on a prefill rank; "
            "die on any). Repeatable.",
            show_default=False,
        ),
    ] = [],  # noqa: B006 - Typer reads the default, never mutates it
    fault_seed: Annotated[
        int | None, typer.Option(help="Seed of the fault dice (default: a different run every time).")
    ] = None,
    log_file: Annotated[
        str,
        typer.Option(help="File the rank appends its SGLang-format log to, in a folder that exists (default: stderr)."),
    ] = "",
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False, help="Lowest level logged.")] = "INFO",
    curve_keys: Annotated[
        str,
        typer.Option(
            "--curve-keys",
            metavar="DIR",
            callback=key_folder,
            help="CURVE key folder (`kvtop keys generate DIR`): every socket of this rank encrypted and open only "
            "to clients in DIR/allowed.",
        ),
    ] = "",
    insecure: Insecure = False,
    sglang_log: Annotated[
        str,
        typer.Option(
            SIDECAR,
            metavar="FILE",
            help="Follow a real SGLang server's log instead of running a rank: the log sidecar, whose options "
            "`kvtop agent --sglang-log FILE --help` lists.",
        ),
    ] = "",
) -> None:
    """Run one rank of kvtop's KV transfer engine: it registers with --bootstrap, serves a control socket a
    router drives and publishes its events (the way `kvtop cluster up` starts each of its ranks).

    With --sglang-log FILE, the log sidecar of a real SGLang server instead (`kvtop agent --sglang-log FILE
    --help`). Exit codes: 0 when stopped (SIGTERM, Ctrl-C, SIGHUP, its parent gone), 1 when a thread of the rank died
    (logged with its traceback), 2 for bad usage (a fault this role cannot act on, a key folder that cannot
    serve, a --host beyond loopback without --curve-keys or --insecure, an --instance, --rank or --page-bytes
    the bootstrap would refuse, a --log-file that cannot be written, a pool larger than this machine's memory).
    """
    from transport.errors import ConfigError
    from transport.harness.agent import AgentOptions
    from transport.kv.faults import FaultSpec

    if sglang_log:  # `kvtop.cli.app.run` hands these arguments to the sidecar before they reach here
        raise typer.BadParameter("takes the sidecar's options: run it as `kvtop agent --sglang-log FILE ...`")
    try:
        transfer = TransferConfig(
            chunk_bytes=chunk_bytes,
            window_bytes=window_bytes,
            heartbeat_s=heartbeat,
            peer_timeout_s=peer_timeout,
            timeouts=Timeouts(bootstrap_timeout, waiting_timeout, transfer_timeout),
            checksums=checksums,
        )
        faults = tuple(FaultSpec.parse(text) for text in fault)
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None
    try:
        options = AgentOptions(role=role, instance=instance, rank=rank, tp=tp, bootstrap=bootstrap,
                               num_pages=pages, page_bytes=page_bytes, host=host, control_endpoint=control,
                               transfer=transfer, faults=faults, fault_seed=fault_seed, log_file=log_file,
                               log_level=log_level, curve_keys=curve_keys, insecure=insecure)  # fmt: skip
    except ConfigError as error:
        raise fail(str(error), 2) from None
    raise typer.Exit(run_rank(options))


def run_rank(options: AgentOptions) -> int:
    """Run the rank until it stops; returns its exit status (a key folder that cannot serve exits 2 first, a
    bootstrap service that does not answer or refuses the rank exits 1 with its one line: the rank's own log
    line, or, when it logs to a file, kvtop's on stderr)."""
    from kvtop.cli.options import fail, load_curve
    from transport.errors import BootstrapError
    from transport.harness.agent import serve

    load_curve(options.curve_keys, serve=True)
    try:
        return serve(options)
    except BootstrapError as error:
        if not options.log_file:  # the rank logged it on stderr already (`... cannot register: ...`)
            raise typer.Exit(1) from None
        raise fail(str(error)) from None


def sidecar_args(args: list[str]) -> list[str] | None:
    """The arguments after `agent` when they ask for the log sidecar (--sglang-log), else None."""
    if args[:1] != ["agent"]:
        return None
    asked = any(arg == SIDECAR or arg.startswith(f"{SIDECAR}=") for arg in args[1:])
    return args[1:] if asked else None


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
