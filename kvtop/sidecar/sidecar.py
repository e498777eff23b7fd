"""The sidecar's loop: read what the log gained, publish it per rank, beat, until told to stop."""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import psutil
import zmq

from kvtop.sidecar.backlog import Backlog
from kvtop.sidecar.metrics import MetricsScraper
from kvtop.sidecar.ranks import RankPublisher, sidecar_info
from kvtop.sidecar.tail import LogTail
from kvtop.sources.sglang import Context
from transport.curve import CurveKeys, stop_authenticator
from transport.kvpoll import KVPoll
from transport.plane.events import CONTEXT_TEXT_MAX, Event, Failure, Heartbeat, LogContext, RoomState
from transport.plane.registrar import Registrar
from transport.wire import TEXT_MAX, AgentInfo, label_parts, label_replica

HEARTBEAT_S = 1.0
RANKS_MAX = 256
"""Ranks one sidecar publishes at most (a server's log holds a node's: a few dozen). Each is a publisher, two
sockets and a thread: a `server_args` line of `tp_size=16, pp_size=1024` asked for 16,384, and the sidecar died
out of sockets at the 511th. The ranks past it are said once, their lines not published."""
RankKey = tuple[int | None, int | None, int]
"""A published rank: (DP replica, None where the server's DP ranks are no replicas; pipeline stage past the first,
None for the first and without stages; TP rank)."""
_log = logging.getLogger(__name__)
_LEFT_IN = {
    "Bootstrapping": KVPoll.Bootstrapping,
    "WaitingForInput": KVPoll.WaitingForInput,
    "Transferring": KVPoll.Transferring,
}


@dataclass(frozen=True)
class SidecarOptions:
    """What `kvtop agent --sglang-log` was told."""

    tail: LogTail
    bootstrap: str = ""
    tp: int = 1
    """Ranks published from the start (TP0 to tp-1); more as the server's start-up line (`tp_size=`) or
    its lines name them."""
    host: str = "127.0.0.1"
    metrics_url: str = ""
    metrics_interval_s: float = 5.0
    poll_s: float = 0.05
    curve: CurveKeys | None = None
    """The cluster's keys (loaded to serve): ranks serve CURVE, registrations dial with it; None: plain TCP."""


def left_state(failure: Failure) -> KVPoll:
    """The state a failure line's room left: the one its timeout names, else by where it failed."""
    for name, state in _LEFT_IN.items():
        if f"KVPoll.{name}" in failure.reason:
            return state
    bootstrap = failure.reason_class == "timeout_bootstrap" or "bootstrap" in failure.reason.lower()
    return KVPoll.Bootstrapping if bootstrap else KVPoll.Transferring


def several_servers(path: str, servers: list[str]) -> str:
    """Why a sidecar stops on a file whose wrapper names several servers' lines (`docker compose logs` of them)."""
    names = ", ".join(servers[:4]) + (f" and {len(servers) - 4} more" if len(servers) > 4 else "")
    return (
        f"{path} holds the lines of several servers ({names}): a sidecar follows one server's log, its ranks "
        "alive while that log grows; follow each server's own (`docker compose logs -f SERVICE`), or read the "
        "file with a view's --sglang-log; stopping"
    )


class Sidecar:
    """Publishes one server log's events; `run(stop)` returns the exit code (1: a thread of it died; 2: its log
    holds several servers' lines, `several_servers`)."""

    def __init__(self, options: SidecarOptions, say: Callable[[str], None]) -> None:
        self.options = options
        self.tail = options.tail
        self._say = say
        self._zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._incarnation = random.getrandbits(63)
        self.ranks: dict[RankKey, RankPublisher] = {}
        self._registrar = (
            Registrar(options.bootstrap, self._infos, self._zmq, options.curve).start() if options.bootstrap else None
        )
        self._metrics = (
            MetricsScraper(options.metrics_url, options.metrics_interval_s).start() if options.metrics_url else None
        )
        self._process = psutil.Process()
        self._said = ""
        self._cut_said = False
        self._backlog: Backlog | None = None
        """The lines the file held when the sidecar started, while it reads them (None before and after)."""

    def run(self, stop: threading.Event) -> int:
        try:
            return self._loop(stop)
        finally:
            self.close()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        if self._registrar is not None:
            self._registrar.close()
        for rank in self.ranks.values():
            rank.close()
        self.tail.close()
        stop_authenticator(self._zmq)
        self._zmq.destroy(linger=0)  # a socket a failed bind left open must not hold the exit

    def _infos(self) -> list[AgentInfo]:
        return [rank.info for rank in list(self.ranks.values())]

    def _loop(self, stop: threading.Event) -> int:
        next_beat = 0.0
        waiting_said = role_said = False
        not_a_file = no_log = ""  # looked at on each heartbeat, kept between them
        first = True
        while not stop.is_set():
            beat = time.monotonic() >= next_beat
            try:
                gained = self.tail.poll()
                problem = ""
            except OSError as error:  # unreadable now (permissions, a vanished mount): say so, keep trying
                gained, problem = None, f"cannot read {self.tail.path}: {error}"
            if first and self.tail.logs is not None:  # there at start: what it holds is history, said when read
                self._backlog = Backlog(self.tail.path)
            first = False
            if len(servers := self.tail.servers) > 1:
                self._say(several_servers(self.tail.path, servers))
                return 2
            if beat:
                not_a_file, no_log = self.tail.not_a_file(), self.tail.not_a_log()
            if self.tail.logs is None and not waiting_said and not not_a_file:
                self._say(f"waiting for {self.tail.path} to appear")
                waiting_said = True
            if self.tail.role and self.tail.instance and (self.ranks or not self._guessed_role_of_no_log(no_log)):
                self._declare(self._ranks(beat))
                self._withdraw_plain()
                if gained is not None:
                    self._publish(gained.events, gained.context)
            elif self.tail.logs is not None and not role_said and beat and not no_log:
                # registers nothing until its ranks' role is known (a file that is no log: `_report` says so)
                self._say(f"waiting for {self.tail.path}'s lines to tell prefill or decode (--role says it now)")
                role_said = True
            if beat:
                next_beat = time.monotonic() + HEARTBEAT_S
                self._beat()
                self._report(problem or not_a_file or no_log)
            dead = self._dead_thread()
            if dead:
                self._say(f"the {dead} thread died (traceback above); stopping")
                return 1
            if self.tail.at_end():
                self._backlog_read(no_log)
                stop.wait(self.options.poll_s)
        return 0

    def _backlog_read(self, no_log: str) -> None:
        """Says, once the lines the file held at start are read, how many, their failures and how old (nothing for
        an empty file, one that is no log, `not_a_log` says that, or one whose role no line told yet: none of it
        was published)."""
        backlog, self._backlog = self._backlog, None
        read = self.tail.logs.stats().bytes if self.tail.logs is not None else 0
        if backlog is not None and read and not no_log and self.ranks:
            self._say(backlog.said(read))

    def _guessed_role_of_no_log(self, no_log: str) -> bool:
        """The file is no SGLang log (`no_log`) and its role was not given (`--role`): what its name or a quoted line
        says (`decode-notes.log`, a runbook that quotes `Lost connection with prefill instance`) is no server's, and
        a rank registered on it would be listed alive while it publishes nothing."""
        return bool(no_log) and not self.tail.spec.role

    def _ranks(self, beat: bool) -> list[RankKey]:
        """The ranks to publish: `--tp`'s TP0..N-1 and those the log's start-up line gives it (looked for at a beat),
        of each pipeline stage it gives, of each DP replica it gives (a server of replicas whose count no line gave:
        those its lines name, as they come); a log of a later node of a server over several nodes, its node's alone
        (TP0 is node 0's, PP0 too)."""
        found = self.tail.find_tp() if beat else self.tail.ranks
        tps = sorted({*(range(self.options.tp) if not found.start else ()), *found})
        replicas = self.tail.replicas or (() if self.tail.dp_replicas else (None,))
        keys = ((dp, pp or None, tp) for dp in replicas for pp in self.tail.stages or (None,) for tp in tps)
        return list(itertools.islice(keys, RANKS_MAX + 1))  # one past it: `_declare` says the rest are cut

    def _declare(self, keys: list[RankKey]) -> None:
        """Ranks published from now on (each its own publisher and registration), up to `RANKS_MAX`."""
        new = [key for key in dict.fromkeys(keys) if key not in self.ranks]
        if len(self.ranks) + len(new) > RANKS_MAX:
            new = new[: RANKS_MAX - len(self.ranks)]
            if not self._cut_said:
                self._say(f"the log names more than {RANKS_MAX} ranks: the lines of those past them are not published")
                self._cut_said = True
        tps = [tp for _, _, tp in (*new, *self.ranks)]
        width = max(max(tps, default=0) + 1, self.options.tp, self.tail.tp)
        for dp, pp, tp in new:
            info = sidecar_info(self.tail.role, self.tail.instance, tp, width, self._incarnation, pp, dp)
            rank = self.ranks[dp, pp, tp] = RankPublisher(info, self.options.host, self._zmq, self.options.curve)
            if not self.options.bootstrap:
                self._say(f"{info.label} publishes on {rank.info.event_endpoint}")
        for rank in self.ranks.values():
            rank.set_tp(width)

    def _withdraw_plain(self) -> None:
        """The server's DP ranks turned out to be replicas (its `server_args` line, or its tags, read after `--tp`'s
        ranks were published as no replica's): those no line spoke for are no rank of the server, taken off the
        listing (a rank a line spoke for stays, as the files read together name it)."""
        if not self.tail.dp_replicas:
            return
        for key in [key for key, rank in self.ranks.items() if key[0] is None and not rank.lines]:
            rank = self.ranks.pop(key)
            if self._registrar is not None:
                self._registrar.withdraw(rank.info)
            else:
                self._say(f"{rank.info.label} is no rank of this server (its DP ranks are replicas): withdrawn")
            rank.close()

    def _publish(self, events: list[tuple[str, Event]], context: list[Context]) -> None:
        if self._backlog is not None:
            self._backlog.add([event for _, event in events])
        for label, event in events:
            _, pp, tp = label_parts(label) or ("", None, 0)
            rank = self._rank_of((label_replica(label), pp, tp))
            if rank is None:
                continue
            rank.lines += 1
            if isinstance(event, Heartbeat):  # a batch line: its queue depths go into the rank's heartbeats
                rank.batch = event
                continue
            if isinstance(event, Failure):
                rank.emit(RoomState(event.ts, event.room, int(KVPoll.Failed), int(left_state(event))))
            rank.emit(event)
        for line in context:
            text = line.text[:CONTEXT_TEXT_MAX]
            if rank := self._rank_of((line.dp, line.pp, line.tp or 0)):
                rank.lines += 1
                rank.emit(LogContext(line.ts, line.kind[:32], line.room, text, line.tp))

    def _rank_of(self, key: RankKey) -> RankPublisher | None:
        """The rank publishing `key`'s lines (declared now if new); None past `RANKS_MAX`."""
        if key not in self.ranks:
            self._declare([key])
        return self.ranks.get(key)

    def _beat(self) -> None:
        if not self.ranks:
            return
        followed = self.tail.followed()
        if self._metrics is not None:
            followed = msgspec.structs.replace(
                followed,
                metrics_url=self._metrics.url[:TEXT_MAX],
                metrics=self._metrics.moved(),
                metrics_error=self._metrics.error,
            )
        with self._process.oneshot():
            cpu, rss = self._process.cpu_percent(), self._process.memory_info().rss
        memory = psutil.virtual_memory().percent
        problems = self._registrar.problems if self._registrar is not None else {}
        for rank in self.ranks.values():
            rank.heartbeat(followed, cpu, rss, memory, problems.get(rank.info.label, ""))

    def _report(self, problem: str) -> None:
        """One stderr line whenever what is wrong changes (the registry, the file or what it holds, the metrics)."""
        registrar = self._registrar
        problems = [p for p in (problem, registrar.problem if registrar else "") if p]
        text = "; ".join(problems)
        if text != self._said:
            self._say(text or "all is well again")
            self._said = text

    def _dead_thread(self) -> str:
        threads = [rank.publisher.thread for rank in self.ranks.values()]
        if self._registrar is not None:
            threads.append(self._registrar.thread)
        return next((t.name for t in threads if t.ident is not None and not t.is_alive()), "")
