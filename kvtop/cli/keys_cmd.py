"""`kvtop keys generate DIR`: one cluster's CURVE keys (`transport.curve`), and what to copy where."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kvtop.cli.options import fail

keys_app = typer.Typer(help="CURVE keys for clusters whose sockets leave loopback.", no_args_is_help=True)


def generate(
    folder: Annotated[str, typer.Argument(metavar="DIR", help="Folder to create (it must not exist, or be empty).")],
) -> None:
    """Write a server key pair, a client key pair and an allow-list (DIR/allowed) holding the client's public key.

    DIR is created 0700 and secret files are 0600. Copy the whole of DIR to every agent host (agents, the
    bootstrap service, `kvtop cluster up`), and only server.key, client.key and client.key_secret (in a
    0700 folder) to a host that runs views; then give every command the folder (`kvtop top --curve-keys
    DIR`). More clients: put their public <name>.key in DIR/allowed on every agent host. Exit 2 when DIR
    is not empty, cannot be made (the path at fault named: a file on its way, a link to nothing) or this libzmq
    has no CURVE.
    """
    from transport.curve import generate as write_keys
    from transport.errors import CurveError

    if not folder.strip():
        raise fail("keys generate: give a folder (an empty path would write the keys into the current folder)", 2)
    try:
        written = write_keys(folder)
    except CurveError as error:
        raise fail(f"keys generate: {error}", 2) from None
    except OSError as error:
        raise fail(f"keys generate: cannot write the keys to {folder}: {_why(error, folder)}", 2) from None
    root = written.folder
    typer.echo(f"wrote CURVE keys to {root}:")
    for path in written.files:
        typer.echo(f"  {path.relative_to(root)}")
    typer.echo(
        f"agent hosts (agents, bootstrap, cluster up): copy all of {root}\n"
        f"view hosts (status, failures, top, check): copy server.key, client.key, client.key_secret into a "
        f"0700 folder\n"
        f"then: --curve-keys DIR (or KVTOP_CURVE_KEYS=DIR) on every command"
    )


def _why(error: OSError, folder: str) -> str:
    """An OSError in words, naming the path at fault (never a bare `[Errno 2]`)."""
    where = str(error.filename or folder)
    if isinstance(error, FileExistsError) and Path(where).is_symlink():
        return f"{where} is a link to {os.readlink(where)}, which does not exist: make it, or give another folder"
    if isinstance(error, FileExistsError):
        return f"{where} exists and is not a folder"
    if isinstance(error, NotADirectoryError):
        return f"a part of {where} is a file, not a folder"
    if isinstance(error, FileNotFoundError):
        return f"{where} cannot be made: a folder above it (or the current folder) is gone, or a link to nothing"
    if isinstance(error, PermissionError):
        return f"no permission to write {where}"
    return f"{error.strerror or error}: {where}"


def register(app: typer.Typer) -> None:
    keys_app.command("generate")(generate)
    app.add_typer(keys_app, name="keys")
