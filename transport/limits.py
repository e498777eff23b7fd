"""What a process that talks to every agent may open: ZeroMQ's sockets per context and the kernel's open files.

libzmq lets a context open 1023 sockets unless told otherwise, and a Linux process starts with 1024 open
files (its soft limit); a collector or a relay holds a connection per agent, and a socket per agent while
it waits for that agent's snapshot. `size_context` lifts both before the first socket: the context to
`MAX_SOCKETS`, the soft limit of open files to what is asked (`files_for(agents)`; never past the hard
limit, never lowered). Where the hard limit is too low for the agents, `snapshot_room` keeps a process
from spending on snapshot sockets the files its connections need (a socket per agent opened first would leave
none to connect with, and no agent would be heard). A socket refused so, or that still cannot be opened, is
told in words (`out_of_files`, `cannot_open`: the limit, and what to raise), for the agent it was meant for.
"""

from __future__ import annotations

import errno
import resource

import zmq

MAX_SOCKETS = 65_536
"""Sockets one context may open (libzmq fixes this at the context's first socket)."""
FILES_PER_SNAPSHOT = 2
"""Open files a snapshot socket costs while its agent's snapshot is awaited: its mailbox and its connection."""
FILES_SPARE = 256
"""Open files kept for everything else (the interpreter, ZeroMQ's own threads, the bootstrap, a recording)."""


def files_for(agents: int) -> int:
    """Open files a process needs to talk to `agents` agents: a connection each, and a snapshot socket each."""
    return FILES_SPARE + (1 + FILES_PER_SNAPSHOT) * agents


def snapshot_room(open_files: int, agents: int, snapshot_sockets: int) -> bool:
    """Whether a process allowed `open_files`, connected to `agents` agents and holding `snapshot_sockets`
    snapshot sockets, may open one more and still keep a connection per agent and the spare."""
    if open_files == resource.RLIM_INFINITY:
        return True
    return FILES_SPARE + agents + FILES_PER_SNAPSHOT * (snapshot_sockets + 1) <= open_files


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


def out_of_files(why: str) -> str:
    """`why`, with this process's limits of open files and what to raise."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return f"{why} (open files: {soft}, hard limit {limit}; raise `ulimit -n`)"


def cannot_open(error: zmq.ZMQError) -> str:
    """Why a socket could not be opened, in words; out of files or sockets, with the limit and what to raise."""
    return out_of_files(error.strerror) if error.errno == errno.EMFILE else error.strerror
