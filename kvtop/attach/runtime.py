"""The runtime folder where running dashboards' model processes say where they answer.

    $KVTOP_RUNTIME_DIR, else $XDG_RUNTIME_DIR/kvtop, else <tempdir>/kvtop-<uid>    mode 0700, the user's own
        model-<pid>.json    an `Advert` (JSON): pid, the process's start time, endpoint, source
        model-<pid>.sock    the endpoint (ipc://), a ZeroMQ ROUTER

The model process writes its advert once its socket is bound (written whole, then renamed into place) and
removes both on its way out. One killed before it could is stale: its pid is gone (or is another process,
started at another time); whoever lists the folder ignores it and removes it. A folder that belongs to
another user, or that others may enter, is refused (`RuntimeDirError`): anyone who can write there could
pose as a dashboard.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Final

import msgspec

from kvtop.record.lock import alive

RUNTIME_ENV: Final = "KVTOP_RUNTIME_DIR"
ADVERT_VERSION: Final = 1
MAX_ADVERT_BYTES: Final = 64 * 1024
MAX_IPC_PATH: Final = 100
"""A Unix socket's path is at most 107 bytes on Linux (103 on macOS): a longer one cannot be bound."""

_Text = Annotated[str, msgspec.Meta(max_length=4096)]


class RuntimeDirError(Exception):
    """The runtime folder cannot be made, or is not the user's own (one line, for the user)."""


class Advert(msgspec.Struct, forbid_unknown_fields=False):
    """What a model-<pid>.json says of the model process that wrote it."""

    version: Annotated[int, msgspec.Meta(ge=1)]
    pid: Annotated[int, msgspec.Meta(gt=0, le=1 << 31)]
    started: Annotated[int, msgspec.Meta(ge=0)]
    """The process's start time in clock ticks since boot (/proc/PID/stat), 0 where there is none: a pid
    that names another process than the one that wrote this is stale."""
    endpoint: _Text
    source: _Text
    """As `kvtop top` was given it: `bootstrap tcp://...`, `connect tcp://... tcp://...`."""
    bootstrap: _Text = ""
    connect: list[_Text] = []
    since: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)] = 0.0
    """When it started serving (epoch seconds)."""


def runtime_dir(create: bool = True) -> Path:
    """The runtime folder, made (0700) when `create`; raises `RuntimeDirError` when it is not the user's own."""
    given = os.environ.get(RUNTIME_ENV, "")
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if given:
        folder = Path(given)
    elif xdg and Path(xdg).is_dir():
        folder = Path(xdg) / "kvtop"
    else:
        folder = Path(tempfile.gettempdir()) / f"kvtop-{os.getuid()}"
    if create:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise RuntimeDirError(f"cannot make the runtime folder {folder}: {error.strerror}") from None
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return folder  # nothing runs yet; nothing to check
    except OSError as error:
        raise RuntimeDirError(f"cannot read the runtime folder {folder}: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeDirError(
            f"the runtime folder {folder} is not this user's own with mode 0700 (set {RUNTIME_ENV} to another)"
        )
    return folder


def process_started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when there is no such process; 0 where
    the system does not say (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); the ones before it end with the command's ")"
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError):
        pass
    return 0 if alive(pid) else None


def _paths(folder: Path, pid: int) -> tuple[Path, Path]:
    return folder / f"model-{pid}.json", folder / f"model-{pid}.sock"


@contextlib.contextmanager
def advertised(source: str, bootstrap: str = "", connect: tuple[str, ...] = ()) -> Iterator[tuple[str, Path]]:
    """This process's endpoint (`ipc://`) and the advert to write once it is bound (`publish`); both are
    removed on the way out. Raises `RuntimeDirError` when the folder cannot be used or the path is too long."""
    folder = runtime_dir()
    pid = os.getpid()
    advert_path, socket_path = _paths(folder, pid)
    if len(str(socket_path)) > MAX_IPC_PATH:
        raise RuntimeDirError(f"the runtime folder's path is too long for a socket ({socket_path}): set {RUNTIME_ENV}")
    socket_path.unlink(missing_ok=True)  # a pid reused after a kill -9
    try:
        yield f"ipc://{socket_path}", advert_path
    finally:
        advert_path.unlink(missing_ok=True)
        socket_path.unlink(missing_ok=True)


def publish(advert_path: Path, advert: Advert) -> None:
    """Write `advert` whole (0600), then rename it into place, so a reader never sees half of one."""
    partial = advert_path.with_suffix(".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(msgspec.json.encode(advert))
    os.replace(partial, advert_path)


def advert_for(endpoint: str, source: str, bootstrap: str, connect: tuple[str, ...]) -> Advert:
    pid = os.getpid()
    started = process_started(pid) or 0
    return Advert(ADVERT_VERSION, pid, started, endpoint, source, bootstrap, list(connect), time.time())


_DECODER = msgspec.json.Decoder(Advert)


def running(folder: Path | None = None) -> tuple[list[Advert], list[str]]:
    """The adverts of model processes that still run, by pid, and one line per advert that could not be
    read (named, left alone). Stale adverts (their process is gone) are removed with their socket."""
    folder = folder or runtime_dir(create=False)
    found: list[Advert] = []
    unreadable: list[str] = []
    try:
        paths = sorted(folder.glob("model-*.json"))
    except OSError:
        return [], []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                advert = _DECODER.decode(handle.read(MAX_ADVERT_BYTES + 1))
        except FileNotFoundError:
            continue  # removed meanwhile: its process closed
        except (OSError, msgspec.DecodeError) as error:
            unreadable.append(f"{path}: {error}")
            continue
        started = process_started(advert.pid)
        if started is None or (started and advert.started and started != advert.started):
            for stale in (path, path.with_suffix(".sock")):
                with contextlib.suppress(OSError):
                    stale.unlink()
            continue
        found.append(advert)
    return sorted(found, key=lambda advert: advert.pid), unreadable
