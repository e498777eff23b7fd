"""What a process that talks to every agent may open: ZeroMQ's sockets per context and the kernel's open files.

libzmq lets a context open 1023 sockets unless told otherwise, and a Linux process starts with 1024 open
files (its soft limit); a collector or a relay holds a connection per agent, and a socket per agent while
it waits for that agent's snapshot. `size_context` lifts both before the first socket: the context to
`MAX_SOCKETS`, the soft limit of open files to what is asked (`files_for(agents)`; never past the hard
limit, never lowered). A socket that still cannot be opened is told in words by `cannot_open` (the limit,
and what to raise), for the agent it was meant for.
"""

from __future__ import annotations

import errno
import resource

import zmq

MAX_SOCKETS = 65_536
"""Sockets one context may open (libzmq fixes this at the context's first socket)."""
FILES_PER_AGENT = 3
"""Open files one agent may cost a subscriber: its event connection, and while the agent's snapshot is awaited,
that socket's mailbox and its connection."""
FILES_SPARE = 256
"""Open files kept for everything else (the interpreter, ZeroMQ's own threads, the bootstrap, a recording)."""


def files_for(agents: int) -> int:
    """Open files a process needs to talk to `agents` agents."""
    return FILES_SPARE + FILES_PER_AGENT * agents


def raise_open_files(wanted: int = MAX_SOCKETS) -> int:
    """Raise this process's soft limit of open files towards `wanted` (never above the hard limit, never
    lowered). Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def size_context(context: zmq.Context[zmq.Socket[bytes]], open_files: int = MAX_SOCKETS) -> int:
    """Let `context` open `MAX_SOCKETS` sockets (call it before the context's first socket) and raise this
    process's soft limit of open files towards `open_files` (`files_for(agents)`, or as many as the hard
    limit allows up to `MAX_SOCKETS`). Returns the soft limit."""
    context.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    return raise_open_files(open_files)


def cannot_open(error: zmq.ZMQError) -> str:
    """Why a socket could not be opened, in words; out of files or sockets, with the limit and what to raise."""
    if error.errno != errno.EMFILE:
        return error.strerror
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return f"{error.strerror} (open files: {soft}, hard limit {limit}; raise `ulimit -n`)"
