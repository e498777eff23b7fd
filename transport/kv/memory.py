"""Keep the memory a decode rank's data links receive into, instead of returning it to the OS every window.

ZeroMQ's I/O thread receives each chunk into a fresh `malloc` of the chunk's
size and the engine frees it once the payload is in the pool. glibc serves a
block that large from `mmap` (below its dynamic threshold) or from a heap it
trims whenever the free space at the top passes a threshold; under credit flow
control the receive queue fills and drains once per window, so the heap is
trimmed and faulted back in (zeroed page by page) all the time: a quarter to a
third of the I/O thread's CPU per GB in `kvtop bench transfer`'s decode rank.
Raising both thresholds above a chunk and a window keeps those pages.

The setting is the process's (`mallopt`); it only raises what an earlier call
set, and is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
import threading

_log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's largest mmap threshold on 64-bit: a larger message is still mapped and unmapped (only the heap kept)."""
_INT_MAX = (1 << 31) - 1

_lock = threading.Lock()
_applied = {_M_MMAP_THRESHOLD: 0, _M_TRIM_THRESHOLD: 0}


def _mallopt() -> ctypes._NamedFuncPointer | None:
    try:
        return ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no mallopt, or no C library to load by None (Windows)
        return None


def keep_receive_buffers(message_bytes: int, window_bytes: int) -> bool:
    """Serve messages of up to `message_bytes` from the heap and keep two windows of it free before trimming.

    Returns False where this cannot be set (not glibc); the transfer works either way, at more CPU per GB."""
    mallopt = _mallopt()
    if mallopt is None:
        _log.debug("no mallopt in this C library: receive buffers are left to its defaults")
        return False
    wanted = {
        _M_MMAP_THRESHOLD: min(message_bytes, MMAP_THRESHOLD_MAX),
        _M_TRIM_THRESHOLD: min(2 * window_bytes, _INT_MAX),
    }
    with _lock:
        for param, value in wanted.items():
            if value > _applied[param]:
                if not mallopt(param, value):
                    return False
                _applied[param] = value
    return True
