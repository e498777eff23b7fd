"""Keyframes captured in a forked child, so the collector's lock is held only for the fork (Redis's BGSAVE).

`fork_capture(model)` runs under the collector's lock: it forks (a few ms: the page tables, not the heap),
and the child, holding a copy-on-write image of the model frozen at that instant, encodes it as
`capture` does, compresses it and writes it to a pipe, then leaves with `os._exit`. The parent returns at
once; the recorder's writer thread `collect`s the bytes in the keyframe's place among the ops, so the
keyframe is exactly the one a capture under the lock would have taken.

While the child works, the parent's garbage collector leaves alone the objects that were there at the
fork (`gc.freeze` until the child is reaped): a full collection writes to every tracked object's header,
which would copy most of the heap's pages. (The dashboard's process also freezes what was alive when it
mounted, `kvtop.tui.process`; a keyframe taken there unfreezes that too, and later collections walk those
objects again: time, not correctness.)

The child touches nothing but the model, a compressor of its own and its pipe, at a lower priority
(`CHILD_NICE`): every signal is blocked (no handler of the parent's runs there, no signal wakes the parent's
event loop), the garbage collector is off (a collection would copy every page it walks), the parent's
descriptors are closed, and whatever happens it ends with `os._exit` (no atexit, no finalizer, no flush of
the parent's buffers). A child that fails, dies or outlasts `CHILD_TIMEOUT_S` (killed) is a `KeyframeFailed`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import struct
import sys
import time
import warnings
from dataclasses import dataclass
from typing import NoReturn

import zstandard

from kvtop.model.cluster import ClusterModel
from kvtop.record.format import MAX_BLOCK_BYTES
from kvtop.record.keyframes import capture
from kvtop.record.segment import KEYFRAME_ZSTD_LEVEL

FORK_KEYFRAMES = sys.platform.startswith("linux")
"""Where keyframes fork by default: Linux (elsewhere fork in a threaded process is not safe enough, or
there is none; keyframes are captured under the lock there)."""
CHILD_TIMEOUT_S = 30.0
"""A child that has not sent its keyframe by then is killed (100k rooms take well under 1 s)."""
CHILD_NICE = 10
"""The child is background work: on a machine of two cores, a child encoding a 100k-room keyframe (~0.4 s of
a core) beside the model process's ingest took the dashboard's paints' core away (frames of 40-60 ms instead
of ~20, `kvtop bench ui`); niced, it takes what the others leave."""
_HEADER = struct.Struct("<QQ")
"""What the child sends first: the keyframe's raw length, then its compressed length."""
_READ_BYTES = 1 << 20


class KeyframeFailed(Exception):
    """A forked keyframe that never came whole (the child failed, died, or was killed for its time)."""


@dataclass(frozen=True, slots=True)
class ForkedKeyframe:
    """A keyframe being captured by the child `pid`, which writes it to `fd`."""

    now: float
    pid: int
    fd: int
    write_fd: int
    """The pipe's other end, closed by `collect` (not under the lock: a close lets go of the GIL)."""


@dataclass(frozen=True, slots=True)
class Captured:
    """A keyframe as the child sent it: a zstd frame of `raw_len` bytes."""

    raw_len: int
    payload: bytes
    cpu_s: float
    """The child's CPU time (encoding and compressing): what the keyframe cost, off the lock."""
    copied_bytes: int
    """Memory the child wrote to (its pages faulted: copies of the parent's, and its own buffers)."""


def fork_capture(model: ClusterModel, now: float, pipe: tuple[int, int] | None = None) -> ForkedKeyframe:
    """Fork a child that captures `model` as it is now (call it under the lock that guards the model).
    `pipe`: (read, write) descriptors made beforehand (`os.pipe()`), so that no call here lets go of the
    GIL (another thread could keep it for its switch interval, 5 ms, with the lock held). Raises `OSError`
    when there is no fork (no memory, too many processes): capture under the lock then."""
    read_fd, write_fd = pipe or os.pipe()
    gc.freeze()
    try:
        with warnings.catch_warnings():  # 3.12+ warns of a fork beside threads: the child touches none (above)
            warnings.filterwarnings("ignore", r".*use of fork\(\) may lead to deadlocks", DeprecationWarning)
            pid = os.fork()
    except OSError:
        gc.unfreeze()
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        _child(model, write_fd)
    return ForkedKeyframe(now, pid, read_fd, write_fd)


def _child(model: ClusterModel, fd: int) -> NoReturn:
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        with contextlib.suppress(OSError):
            os.nice(CHILD_NICE)
        gc.disable()
        _close_inherited(keep=fd)
        raw = capture(model)
        payload = zstandard.ZstdCompressor(level=KEYFRAME_ZSTD_LEVEL).compress(raw)
        _write(fd, _HEADER.pack(len(raw), len(payload)))
        _write(fd, payload)
        code = 0
    finally:
        os._exit(code)


def _close_inherited(keep: int) -> None:
    """Close the parent's descriptors (sockets, segments, the terminal's) but stdio and `keep`."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def collect(keyframe: ForkedKeyframe, timeout_s: float = CHILD_TIMEOUT_S) -> Captured:
    """The keyframe the child sends (blocks until it is done, at most `timeout_s`); the child is reaped
    whatever happens. Raises `KeyframeFailed` (why, in one line) when it never came whole."""
    os.close(keyframe.write_fd)  # the child's end, or no end of file
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(keyframe.fd, select.POLLIN)
    timed_out = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                os.kill(keyframe.pid, signal.SIGKILL)
                break
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(keyframe.fd, _READ_BYTES)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(keyframe.fd)
        _, status, usage = os.wait4(keyframe.pid, 0)
        gc.unfreeze()
    if timed_out:
        raise KeyframeFailed(f"the keyframe's child took over {timeout_s:g} s (killed)")
    code = os.waitstatus_to_exitcode(status)
    if code:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        raise KeyframeFailed(f"the keyframe's child {how}")
    data = b"".join(chunks)
    if len(data) < _HEADER.size:
        raise KeyframeFailed(f"the keyframe's child sent {len(data)} bytes, no header")
    raw_len, comp_len = _HEADER.unpack_from(data)
    if max(raw_len, comp_len) > MAX_BLOCK_BYTES or len(data) != _HEADER.size + comp_len:
        raise KeyframeFailed(f"the keyframe's child sent {len(data)} bytes for a keyframe of {comp_len}")
    cpu_s = usage.ru_utime + usage.ru_stime
    return Captured(raw_len, data[_HEADER.size :], cpu_s, usage.ru_minflt * os.sysconf("SC_PAGE_SIZE"))


def abandon(keyframe: ForkedKeyframe) -> None:
    """Stop and reap a child whose keyframe is not wanted (the ops around it were dropped)."""
    os.close(keyframe.fd)
    os.close(keyframe.write_fd)
    os.kill(keyframe.pid, signal.SIGKILL)  # never reaped yet, so the pid is still the child's
    os.waitpid(keyframe.pid, 0)
    gc.unfreeze()
