"""Zero-copy sends from registered memory (a KV pool) without pyzmq's garbage collector.

pyzmq's zero-copy send (`send(buffer, copy=False)`) keeps the buffer alive until
libzmq is done with it: it files the buffer with its garbage collector (Python,
a lock, two `getpid` calls), and once the frame is on the wire libzmq's I/O
thread sends the buffer's id over an inproc socket to pyzmq's gc thread, which
wakes, takes the GIL and lets go of it. For a prefill rank that is a message, a
thread wake-up and a GIL hand-off in the sending process per chunk.

A KV pool needs none of it: it is allocated once and kept by its `KVManager`
until the manager's ZeroMQ context has terminated, after which libzmq holds no
frame. So slices of it go out as frames without a free function
(`zmq_send_const`: libzmq's constant messages), sent on the pyzmq socket's own
handle through ctypes, one call a frame. Where this process's libzmq does not
export that call (no pyzmq Cython backend, or a libzmq older than 4.1), the
same sends go through pyzmq's zero-copy path: slower, same bytes.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable

import numpy as np
import zmq

_SendConst = Callable[[int, int, int, int], int]
"""`zmq_send_const(socket, buffer, length, flags)`: a frame of memory libzmq neither copies nor frees."""


def _load() -> _SendConst | None:
    """libzmq's `zmq_send_const`, resolved through pyzmq's own extension (so the very library its sockets live
    in); None where it is not at hand."""
    if zmq.zmq_version_info() < (4, 1, 0):
        return None
    try:
        from zmq.backend.cython import _zmq

        send_const = ctypes.CDLL(_zmq.__file__, use_errno=True).zmq_send_const
    except (ImportError, OSError, AttributeError):
        return None
    send_const.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    send_const.restype = ctypes.c_int
    return send_const


_SEND_CONST = _load()


def registered_sends() -> bool:
    """Whether registered memory goes out without pyzmq's garbage collector in this process."""
    return _SEND_CONST is not None


class RegisteredMemory:
    """A buffer that outlives every socket that sends from it: its slices go out zero-copy, and libzmq never
    tells anyone it is done with them.

    The owner keeps the buffer alive, in place, until the ZeroMQ context of every socket that sent from it has
    terminated (a `KVManager` holds its pool until `close()` has terminated its context). The bytes are read
    when the I/O thread sends them, as with any zero-copy send: a slice rewritten meanwhile goes out rewritten.
    """

    def __init__(self, buffer: memoryview) -> None:
        flat = np.frombuffer(buffer, dtype=np.uint8)
        self._view = flat.data
        self._size = len(flat)
        self._address: int = flat.ctypes.data

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Bytes `[offset, offset+nbytes)` of the buffer, without copy."""
        return self._view[offset : offset + nbytes]

    def send(self, sock: zmq.Socket[bytes], offset: int, nbytes: int, flags: int) -> None:
        """Send bytes `[offset, offset+nbytes)` as one frame on `sock` with `flags`; raises like pyzmq's send
        (`zmq.Again` when it would block, `zmq.ZMQError` otherwise) and ValueError for a slice outside the
        buffer (never read past it)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self._size:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) are outside a registered buffer of {self._size}")
        send_const = _SEND_CONST
        if send_const is None:
            sock.send(self._view[offset : offset + nbytes], flags, copy=False)
            return
        while send_const(sock.underlying, self._address + offset, nbytes, flags) < 0:
            error = ctypes.get_errno()
            if error != errno.EINTR:  # a signal: try again, as pyzmq does
                raise zmq.Again(error) if error == errno.EAGAIN else zmq.ZMQError(error)
