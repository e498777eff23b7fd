"""Give a thread's Python name to the operating system, so `top -H`, `ps -L` and `perf` show whose it is.

Python names its threads for itself only: in the kernel every thread of an
agent is `python` until told otherwise. Linux keeps 15 bytes of a name, so a
long one keeps its start (`kv-engine-prefill-0/tp2` shows as `kv-engine-prefi`).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading

_PR_SET_NAME = 15
OS_NAME_BYTES = 15


def name_os_thread() -> None:
    """Name the calling thread, in the kernel, after its Python name (Linux only; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    name = threading.current_thread().name.encode("utf-8", "replace")[:OS_NAME_BYTES]
    with contextlib.suppress(AttributeError, OSError):  # no prctl here: the thread keeps the process's name
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
