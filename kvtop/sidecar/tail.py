"""The followed log: waits for the file, reads what it gains with the log source's parser, tracks growth."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass

from kvtop.sources.sglang import Context, LogSpec, SGLangLogs
from kvtop.sources.sglang.lines import dp_replicas, node_of, server_count
from kvtop.sources.sglang.naming import agent_file
from kvtop.sources.sglang.reader import read_head
from kvtop.sources.sglang.sniff import PREFIX_SNIFF_BYTES, SNIFF_BYTES, sniff_server
from kvtop.sources.sglang.stats import EMPTY
from transport.plane.events import Event, LogFollowed
from transport.wire import TEXT_MAX

_SERVER_ARGS = re.compile(rb"server_args=(?:ServerArgs\(|\{)[^\n]*")
"""SGLang's start-up line names the server's TP size (and the node, of a server over several): its ranks are
published from then on."""
READ_BYTES = 8 << 20
"""At most this much of the file per poll: a big backlog is published while the heartbeats go on."""


@dataclass(frozen=True)
class Gained:
    """What one poll of the file gave: (rank label, event)s in time order, and context lines."""

    events: list[tuple[str, Event]]
    context: list[Context]


class LogTail:
    """One server's log, followed from its start (a file of several servers' lines is the sidecar's to refuse:
    `servers`). Role and instance: as given, else as the log source infers
    them (the file's name when it is one of our agents' logs, its first lines, else the first failure or
    batch line; the instance `ROLE-0` when nothing names it)."""

    def __init__(self, spec: LogSpec, instance: str = "", idle_after_s: float = 30.0) -> None:
        self.spec = spec
        self.idle_after_s = idle_after_s
        self.logs: SGLangLogs | None = None
        self._instance = instance
        self._grew_at = time.monotonic()
        self._bytes = 0
        self.tp = 0
        """The TP size the server's start-up line names (0 until one does)."""
        self.ranks = range(0)
        """The TP ranks that line gives this log: all `tp`, or its node's of a server over several nodes (node 1 of
        TP16 over two: TP8..TP15)."""
        self.stages = range(0)
        """The pipeline stages that line gives this log (each holds `ranks`): the server's, or its node's of a server
        over several nodes (node 1 of PP2 over two: PP1); none for a server without stages (its lines name none)."""
        self.replicas = range(0)
        """The DP replicas that line gives this log (plain `--dp-size N`, no DP attention: each holds `stages` x
        `ranks`); none for a server whose DP ranks are no replicas, or whose line gave no `dp_size`."""
        self._sniffed = False
        self._server: str | None = None
        """The server a wrapper names on the file's first SGLang line ("" none; None: not read yet): the log source
        names its server so only once it read that line's record, which may wait for the next."""

    @property
    def path(self) -> str:
        return str(self.spec.path)

    @property
    def servers(self) -> list[str]:
        """The servers a wrapper names in the file (`docker compose logs`' `NAME  | `, `kubectl logs --prefix`'s
        `[pod/NAME/...] `), as it names them: none for a log of lines no wrapper names."""
        return list(self.logs.files[0].streams) if self.logs is not None else []

    @property
    def role(self) -> str:
        """ "" until given, or named by the file's name, its wrapper's name for its server or one of its lines."""
        if self.logs is not None:
            file = self.logs.files[0]
            server = next(iter(file.streams.values()), file)
            return server.role or file.role
        return self.spec.role or agent_file(self.spec.path.name)[0]

    @property
    def instance(self) -> str:
        """As given, else the name a wrapper gives the file's server, else as the log source infers it."""
        if self._instance:
            return self._instance
        if self.logs is not None:
            file = self.logs.files[0]
            return next(iter(file.streams.values()), file).instance if file.streams else self._server or file.instance
        role, instance = agent_file(self.spec.path.name)
        if instance and (not self.spec.role or role == self.spec.role):
            return instance
        return f"{self.role}-0" if self.role else ""

    def poll(self) -> Gained:
        """What the file gained since the last poll (nothing while it is not there)."""
        logs = self.logs
        if logs is None:
            logs = self._open()
            if logs is None:
                return Gained([], [])
        if self._server is None:  # looked for while the file's head may gain its first SGLang line
            self._server = sniff_server(self.spec.path)
            if self._server is None and self._bytes >= PREFIX_SNIFF_BYTES:
                self._server = ""
        events = logs.poll(None, max_bytes=READ_BYTES)
        context, logs.fresh_context = logs.fresh_context or [], []
        read = logs.files[0].reader.stats.bytes
        if read != self._bytes:
            self._bytes, self._grew_at = read, time.monotonic()
        return Gained(events, context)

    def find_tp(self) -> range:
        """`ranks`, from the server's start-up line in the file's head (looked for until found, or until the file
        outgrew the head)."""
        if self.tp or self._sniffed or self.logs is None:
            return self.ranks
        try:
            self._sniffed = os.stat(self.spec.path).st_size > SNIFF_BYTES
            found = _SERVER_ARGS.search(read_head(self.spec.path, SNIFF_BYTES))
        except OSError:
            return self.ranks
        line = found[0].decode("utf-8", "replace") if found else ""
        self.tp = min(server_count(line, "tp_size") or 0, 1024)
        stages = min(server_count(line, "pp_size") or 1, 1024)
        node = node_of(line)
        node = node if node is not None and node.tp_size == self.tp else None
        self.ranks = node.tp_ranks if node is not None else range(self.tp)
        self.stages = range(0) if stages < 2 else node.pp_ranks if node is not None else range(stages)
        self.replicas = range(min(server_count(line, "dp_size") or 0, 1024)) if dp_replicas(line) else range(0)
        return self.ranks

    @property
    def dp_replicas(self) -> bool | None:
        """Whether the server's DP ranks are replicas, as the log source reads its lines (the file's head, its
        `server_args` line, its rank tags: a replica's rank is `instance/DP1-TP0`); None until they tell."""
        if self.logs is None:
            return None
        file = self.logs.files[0]
        return next(iter(file.streams.values()), file).dp.replicas

    def at_end(self) -> bool:
        return self.logs is None or self.logs.files[0].reader.at_end()

    def followed(self) -> LogFollowed:
        """What the heartbeat says of the file (metrics are added by the sidecar): not there while the path holds
        no regular file (a folder or a pipe made there is waited on, not read)."""
        silent = time.monotonic() - self._grew_at
        try:
            status = os.stat(self.spec.path)
        except OSError:
            status = None
        if status is None or (self.logs is None and not stat.S_ISREG(status.st_mode)):
            return LogFollowed(self.path, False, 0, 0, 0, 0, 0, silent, True)
        size = status.st_size
        if self.logs is None:
            return LogFollowed(self.path, True, 0, size, 0, 0, 0, silent, silent > self.idle_after_s)
        reader = self.logs.files[0].reader
        stats = self.logs.stats()
        return LogFollowed(self.path, True, reader.position, size, stats.lines, stats.garbled, stats.rotations,
                           silent, silent > self.idle_after_s, "; ".join(stats.damaged)[:TEXT_MAX])  # fmt: skip

    def not_a_file(self) -> str:
        """`FILE is a folder...` while the file awaited is not there because something else took its path (a folder,
        a pipe or device, a symlink loop, a path that cannot be looked at), else "" (not there at all, or followed)."""
        if self.logs is not None:
            return ""
        try:
            mode = os.stat(self.spec.path).st_mode
        except FileNotFoundError:  # not there yet (a link to a file not there yet too)
            return ""
        except OSError as error:
            what = "is a symlink loop" if error.errno == errno.ELOOP else f"cannot be looked at ({error.strerror})"
        else:
            what = (
                "" if stat.S_ISREG(mode)
                else "is a folder" if stat.S_ISDIR(mode)
                else "is a pipe" if stat.S_ISFIFO(mode)
                else "is no regular file (a device or a socket)"
            )  # fmt: skip
        return f"{self.path} {what}, not a log file: waiting for a log file to take its place" if what else ""

    def not_a_log(self) -> str:
        """`FILE: not an SGLang server log (...)` while nothing of the file was read and it is none (a wrong path),
        else "" (an empty log is its server not writing yet)."""
        why = self.logs.stats().unread.get(self.path, "") if self.logs is not None else ""
        return f"{self.path}: {why}: nothing of it is published" if why and why != EMPTY else ""

    def close(self) -> None:
        if self.logs is not None:
            self.logs.close()

    def _open(self) -> SGLangLogs | None:
        """The log source on the file, once it is there (None before)."""
        if not self.spec.path.exists():
            return None
        try:
            logs = SGLangLogs([self.spec])
        except FileNotFoundError:  # gone again between the look and the open
            return None
        if self._instance:
            logs.files[0].instance = logs.instance = self._instance
        logs.fresh_context = []
        self.logs = logs
        return logs
