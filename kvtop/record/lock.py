"""One recorder per folder: an OS lock (`flock`) on the folder's lock file, which names its holder's pid.

The kernel lets go of a `flock` when its holder exits, however it exits (SIGTERM, kill -9, a crash), so a
stale file never keeps a folder locked; the pid written in it only names the holder to a recorder refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from kvtop.record.format import FILE_MODE

LOCK_NAME = "recorder.lock"
HOLDER_WAIT_S = 0.5
"""How long a refused recorder reads the lock file for a live holder's pid (the holder writes it just after it
takes the lock; a crashed holder's stale pid is overwritten by the next)."""
_PID_BYTES = 32


class FolderInUse(Exception):
    """Another recorder (the process `pid`, 0 when it did not say) holds the folder's lock."""

    def __init__(self, folder: Path, pid: int) -> None:
        who = f"pid {pid}" if pid else "a process whose pid it did not write"
        super().__init__(f"another kvtop ({who}) records into {folder}")
        self.pid = pid


def lock_folder(folder: Path) -> int:
    """The folder's lock, held (a descriptor: closing it lets go). Raises `FolderInUse` when another process
    (or another recorder of this one) holds it, `OSError` when the lock file cannot be opened."""
    descriptor = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(descriptor)
        os.close(descriptor)
        raise FolderInUse(folder, pid) from None
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, and the first segment says so
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


def _holder(descriptor: int) -> int:
    """The live process the lock file names (0: none within `HOLDER_WAIT_S`)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        text = os.pread(descriptor, _PID_BYTES, 0).strip()
        pid = int(text) if text.isdigit() and len(text) < 10 else 0
        if pid and alive(pid):
            return pid
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether a process has `pid` (another user's included: signal 0 is refused to it, but it runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
