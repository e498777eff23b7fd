"""The dashboard's recording options (`--record/--no-record`, `--record-dir`, `--record-max-bytes`), read into
a `RecordChoice` (kvtop.record.dashboard opens the recording)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvtop.cli.units import format_size, parse_size
from kvtop.record.dashboard import DEFAULT_MAX_BYTES, RecordChoice

Record = Annotated[
    bool,
    typer.Option(
        "--record/--no-record",
        envvar="KVTOP_RECORD",
        help="Record what the dashboard receives into a bounded ring (rewind with , . [ ] b L; replay it later "
        "with `kvtop top --replay DIR`). --no-record keeps nothing.",
    ),
]
RecordDir = Annotated[
    str,
    typer.Option(
        "--record-dir",
        envvar="KVTOP_RECORD_DIR",
        help="Folder of the dashboard's ring (default: $XDG_CACHE_HOME/kvtop/recordings, ~/.cache/... ).",
    ),
]
RecordMaxBytes = Annotated[
    str,
    typer.Option(
        "--record-max-bytes",
        envvar="KVTOP_RECORD_MAX_BYTES",
        help=f"Size of the ring: the oldest segments are deleted past it (default {format_size(DEFAULT_MAX_BYTES)};"
        " 64MiB, 2G, ...; at least 1MiB).",
    ),
]


def record_choice(record: bool, folder: str, max_bytes: str) -> RecordChoice:
    """What the command line asked of the dashboard's recording; a size that does not read, or is below the
    least ring, is a usage error before anything starts."""
    from kvtop.record.writer import MIN_MAX_BYTES

    try:
        size = parse_size(max_bytes or str(DEFAULT_MAX_BYTES), minimum=MIN_MAX_BYTES)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--record-max-bytes") from None
    return RecordChoice(record, folder, size)
