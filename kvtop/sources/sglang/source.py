"""SGLang server logs as a source: files in, `ClusterModel.apply()` out, like the live collector.

Each file is one server instance; the pieces of one server's rotated log are one, and so are the logs of the nodes
of one multi-node server (`sniff_node`). Which kind (prefill or decode) it is comes
from `prefill=FILE` / `decode=FILE` (`spec`), else from its name when it is one
of our agents' log files (`naming`), else from the first lines that only one
kind writes (`sniff`). Instances are named like our agents (`prefill-0`); a
rank is `instance/TP{tp}`, so labels look like the live ones, a pipeline
stage's rank `instance/PP{pp}-TP{tp}` where the lines name their stage, and a DP replica's
`instance/DP{dp}-TP{tp}` where the server's DP ranks are replicas, each its own TP group (`replicas`).

Failure lines become `Failure` events (origins inferred, `infer`; a room the
line leaves out taken from the lines around it, `related`), batch lines
`Heartbeat`s (`convert`) whose counters are the queue depths, both applied per
rank in time order across files; the ranks are log ranks (`RankView.from_log`).
Everything else kvtop understands (sessions, lost connections, NIXL errors,
tracebacks, transport-library lines) is kept as context for the failure
groups near it (`context`); a scheduler's crash is also told to the model as
its rank's (`LogContext` of kind `crash`: `ClusterModel.crashes`), as a log
sidecar publishes it.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.model.suspects import (
    BOOTSTRAP_ERROR,
    BOOTSTRAP_TIMED_OUT,
    CRASH_KINDS,
    PREFILL_LOST,
    REGISTRATION_FAILED,
    WAITING_TIMED_OUT,
    bootstrap_address,
    failed_session,
    handshake_fault,
    local_fault,
    memory_unregistered,
)
from kvtop.sources.sglang.clocks import STEP_BACK_S, ClockOffset, Server, believable, read_room_times
from kvtop.sources.sglang.context import CONTEXT_KEPT, Context, context_for
from kvtop.sources.sglang.convert import to_heartbeat
from kvtop.sources.sglang.infer import to_failure
from kvtop.sources.sglang.lines import (
    BatchLine,
    ContextLine,
    FailureLine,
    Garbled,
    LauncherLine,
    NodeOf,
    Record,
    ServerArgsLine,
    as_printed,
    classify,
    glog_year,
    glued_glog,
    is_glog,
    lost_prefill,
    startup_death,
)
from kvtop.sources.sglang.naming import InstanceNames, agent_file
from kvtop.sources.sglang.prefix import has_prefix, parse_prefix, split_stream
from kvtop.sources.sglang.reader import LogReader
from kvtop.sources.sglang.related import RelatedLines, WorkerError
from kvtop.sources.sglang.replicas import DpLayout
from kvtop.sources.sglang.sniff import first_stamp, holds_sglang_lines, sniff_node, sniff_replicas, sniff_role
from kvtop.sources.sglang.spec import LogSpec
from kvtop.sources.sglang.stats import EMPTY, ClockStep, LogStats, Misdated
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, Failure, Level, LogContext
from transport.sglang.reasons import reason_class
from transport.wire import cut_text, label_parts, rank_label

LOAD_BYTES = 8 << 20
"""Bytes of each file a poll reads while loading: what is held at once is one poll's events, whatever the size."""


ASKED_KEPT = 1024
"""Bootstrap addresses of decodes' bootstrap errors kept to pair with the prefill logs that can be at them."""
RANKS_MAX = 4096
"""Ranks the logs read together may name (as many as a bootstrap service lists): a line of one more is counted as
garbled. Each is a view of its own (~70 KB): lines naming `PP0..1023` of `TP0..1023` made a million of them."""
STREAMS_MAX = 256
"""Servers one file may name (`docker compose logs` of a deployment); lines of more are garbled."""
STREAM_NAME_MAX = 200
"""The longest server name a wrapper may give: its ranks' labels (`NAME/PPn-TPn`) stay inside an event's 256."""
ABORTED_BY_REQUEST = "Aborted by AbortReq."
"""The client's words, which SGLang 0.5.23 also records for the rooms it aborts once it gave up on a prefill's
bootstrap server (`Could not fetch prefill parallel info from X after 15 attempts`): read as that failure's rooms."""
ROOMLESS_KINDS = (BOOTSTRAP_ERROR, WAITING_TIMED_OUT, PREFILL_LOST)
"""A decode rank's failures that name no room (incidents of an address, or of its prefill side); a prefill rank's
is `BOOTSTRAP_TIMED_OUT` (of its decode side)."""
RANK_EVENT_KINDS = CRASH_KINDS
"""Context lines that are their rank's events in the model (`ClusterModel.crashes`); a bootstrap error is one once
no failure line claimed it (`related.Announcement`)."""
_ROLE_IN_NAME = re.compile(r"(?<![a-z])(prefill|decode)(?![a-z])", re.IGNORECASE)
"""A server's role in the name a wrapper gives it (`qwen3-2p2d-prefill-0-1`, `sglang-decode-5f7c`), or a file's
when nothing in it says (`decode.log`)."""


EXIT_CODE_S = 10.0
"""How long a launcher's `Rank N scheduler is dead.` waits for its `Exit code: C` (SGLang <= 0.5.9 logs it once it
joined the dead process: 1-2 s later in public reports), by the log's time or, while a followed log is quiet, the
clock: then its crash is told without it."""


@dataclass(frozen=True, slots=True)
class _Dying:
    """A launcher's word that a scheduler died, waiting for the exit code its next line gives."""

    line: LauncherLine
    ts: float
    held_at: float
    """When it began to wait (`time.monotonic()`)."""

    def given_up(self, now: float | None, quiet: bool) -> bool:
        """No exit code is coming: the file is complete (`now` None), its time went on past `EXIT_CODE_S`, or it went
        quiet and as long passed by the clock."""
        if now is None or now - self.ts > EXIT_CODE_S:
            return True
        return quiet and time.monotonic() - self.held_at > EXIT_CODE_S


_OTHER_ROLE = {"prefill": "decode", "decode": "prefill"}
_ROTATED = re.compile(r"(.+\.(?:log|txt|out))(?:[.-]\d{1,8})?(?:\.gz)?")
"""A log's name and a rotation's suffix (logrotate's `.1`, `.2.gz`, `-20260301`)."""


def _tells_suspects(text: str) -> bool:
    """A transport error the suspects read under its rank: a local fault, a session given up on, a handshake that
    failed, memory it could not register."""
    return bool(local_fault(text) or failed_session(text) or handshake_fault(text) or memory_unregistered(text))


def _rotated_server(path: Path, role: str) -> tuple[str, str, str] | None:
    """Which server a file is a piece of, when its name is a log's with or without a rotation's suffix: the pieces
    of one server's rotated log (in one folder, of one role) are read as one instance."""
    name = _ROTATED.fullmatch(path.name)
    return (str(path.resolve().parent), name[1], role) if name else None


_Log = tuple[str, str, str] | int
"""A server's log: its rotated server (`_rotated_server`: its pieces are one log), else its file's index."""


def _node_peers(named: Sequence[tuple[LogSpec, str, str]]) -> dict[_Log, int]:
    """The logs that are nodes of one multi-node server (their `server_args` lines name the same mode, rendezvous
    address, node count and TP size), each mapped to the index of the first file of any of them: one instance, where
    the lines leave no doubt (two or more nodes, each one log). Our agents' logs are their own instances."""
    first: dict[_Log, int] = {}
    nodes: dict[_Log, NodeOf] = {}
    for index, (spec, role, instance) in enumerate(named):
        log = (_rotated_server(spec.path, role) if not instance else None) or index
        first.setdefault(log, index)
        if len(named) > 1 and not instance and log not in nodes and (node := sniff_node(spec.path)) is not None:
            nodes[log] = node
    servers: dict[tuple[str, str, int, int, int], dict[int, list[_Log]]] = {}
    for log, node in nodes.items():
        servers.setdefault(node.server, {}).setdefault(node.rank, []).append(log)
    peers: dict[_Log, int] = {}
    for ranks in servers.values():
        if len(ranks) > 1 and all(len(logs) == 1 for logs in ranks.values()):
            logs = [log for (log,) in ranks.values()]
            peers.update(dict.fromkeys(logs, min(first[log] for log in logs)))
    return peers


def _identity(path: Path) -> tuple[int, int] | None:
    """The file a path names (device, inode); None while there is none (a followed log not written yet)."""
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_dev, status.st_ino)


def _role_named(name: str) -> str:
    """The role a name says (`prefill` or `decode` as a word of it), "" when none does."""
    found = _ROLE_IN_NAME.search(name)
    return found[1].lower() if found else ""


def _unbelievable(told: float | None, record: Record | None) -> float | None:
    """The time a line tells (its prefix's, or a glog or UCX line's own) where it cannot be a log's
    (`clocks.believable`); None when it can, or tells none."""
    if told is not None and not believable(told):
        return told
    own = None if record is None or isinstance(record, ServerArgsLine) else record.ts
    if own is not None and own != told and not believable(own):  # most records tell their prefix's time: asked once
        return own
    return None


_Dated = FailureLine | BatchLine | ContextLine | LauncherLine
"""A record whose line tells a time of its own."""


def _undated(record: _Dated) -> _Dated:
    """The record as a line that tells no time."""
    return msgspec.structs.replace(record, ts=None)


def _moved(file: _File, record: Record) -> float:
    """What to take off the time a record tells: its server's correction, but for the epoch seconds of a UCX line
    where that is a timezone's (no timezone moves them)."""
    return 0.0 if file.zone and isinstance(record, ContextLine) and record.kind == "ucx" else file.correction


@dataclass(eq=False)
class _File:
    spec: LogSpec
    reader: LogReader
    role: str
    instance: str
    last_ts: float
    """Time of the last line that tells one (before one: the first prefixed line at the file's head, else the
    file's mtime): lines that tell none get it, glog lines its year."""
    dated: bool = True
    """Whether `last_ts` is a time a line told (False: the file's mtime, a guess)."""
    last_tp: int | None = None
    """The TP rank of the last prefixed line that names a rank: a crash its line does not date is that rank's."""
    last_pp: int | None = None
    """The pipeline stage of that line (None: it named none)."""
    last_dp: int | None = None
    """The DP rank of that line (None: it named none)."""
    dp: DpLayout = field(default_factory=DpLayout)
    """Whether its DP ranks are replicas (`replicas`): a replica's rank is named with its DP rank."""
    batch_key: str = ""
    bootstrap_port: int | None = None
    tp_size: int | None = None
    """The TP size its `server_args` line gives (`ServerArgsLine.tp_size`): the model pairs ranks by it."""
    """A prefill's bootstrap port, from its `server_args` line (None: not read)."""
    launch: NodeOf | None = None
    """How SGLang's launcher laid out the server's schedulers on its node, from its `server_args` line (None: not read,
    or its launcher's index names no scheduler: `lines.launch_of`)."""
    dying: _Dying | None = None
    """A launcher's `Rank N scheduler is dead.` waiting for its `Exit code: C`."""
    seq: dict[str, int] = field(default_factory=dict)
    related: RelatedLines = field(default_factory=RelatedLines)
    streams: dict[str, _File] = field(default_factory=dict)
    """The servers whose lines a wrapper names in this file (`docker compose logs`, `kubectl logs --prefix`), by
    the name it gives: each its own instance, under that name."""
    used: int = 0
    """Its lines in SGLang's shape (a prefix's time, or a line kvtop reads): none, and it is asked `not_a_log`."""
    not_a_log: bool = False
    """No line at its head or tail is prefixed as SGLang's are (asked only of a file nothing was read from)."""
    sniffed_lines: int = 0
    """Its lines when `not_a_log` was last asked."""
    other_role_lines: int = 0
    """Failure and batch lines of the other role than its own (`nohup.out` of a prefill and a decode server, logs
    concatenated): read as this one server's, and said so."""
    clock: Server = (0, "")
    """Whose clock its lines' times are on (`clocks.Server`)."""
    correction: float = 0.0
    """What its times are ahead of its group's first server's (`clocks`): taken off each time its lines tell."""
    zone: bool = False
    """`correction` is a timezone's (whole hours): the epoch seconds UCX writes are not moved."""
    latest: float = 0.0
    """The latest time its prefixes told, as written."""
    stepped: ClockStep | None = None
    """The largest step back its prefixes' times took past `STEP_BACK_S` (its clock was set back)."""
    misdated: Misdated | None = None
    """Its lines dated where no log's can be (`clocks.believable`): read as lines that tell no time."""
    last_dated: str = ""
    """The reader's last dated line when it was last looked at (`SGLangLogs._saw_dated`)."""

    def misdate(self, ts: float) -> None:
        """One more of its lines told `ts`, a time no log's line can be."""
        self.misdated = Misdated(1, ts) if self.misdated is None else self.misdated.another()

    @property
    def servers(self) -> tuple[_File, ...]:
        """This file's own lines' server, and the servers a wrapper names in it."""
        return (self, *self.streams.values())


class SGLangLogs:
    """Several log files read together: `poll(model)` applies what is new; `load(model)` reads to the end."""

    def __init__(self, specs: Iterable[str | Path | LogSpec]) -> None:
        parsed = [s if isinstance(s, LogSpec) else LogSpec.parse(str(s)) for s in specs]
        self.files: list[_File] = []
        self.context: deque[Context] = deque(maxlen=CONTEXT_KEPT)
        self.errors: deque[Context] = deque(maxlen=CONTEXT_KEPT)
        """The transfer's own errors read (`Context.transport_error`), apart from `context` so that no other line
        pushes one out."""
        self.instance = ""
        """The name of every server the files hold when set (a sidecar's --instance), the servers a wrapper names
        too: the lines of one server's log are its."""
        self.fresh_context: list[Context] | None = None
        """Set it to a list to be given every context line as it is read (a sidecar publishes and empties it)."""
        self._garbled = self._failures = self._batches = self._context = self._no_room = self._undated = 0
        self._now = 0.0
        self._told = False
        """Whether some line told a time (until then the span is what mtimes guess)."""
        self.start: float | None = None
        """The earliest time the logs mention (None before one was read)."""
        self.until: float | None = None
        """Apply nothing the logs say after this time (`--at`), and judge "now" at it."""
        self._names = InstanceNames()
        self._labels: set[str] = set()
        """The ranks the lines named (`RANKS_MAX` at most)."""
        self._parts: dict[str, tuple[str, int | None, int]] = {}
        """Each of their labels' `label_parts`."""
        self.offsets: dict[Server, ClockOffset[Server]] | None = None
        """The servers' clocks that differ (`clocks`), read before the first poll applies anything."""
        self._peers: dict[str, dict[str, None]] = {}
        """Bootstrap addresses of prefill instances that decode lines say were lost, each with the decode ranks
        whose lines name it (in order): listed as ranks, so within `RANKS_MAX` with `_labels`."""
        self._peers_unlisted = 0
        """Addresses decode lines named past `RANKS_MAX` (not listed: each a rank view of its own)."""
        self._asked: dict[str, None] = {}
        """Bootstrap addresses decode ranks could not get an answer from (a bootstrap error), `ASKED_KEPT` at most: the
        prefill logs that can be at one are the model's `instances_at` it (never a rank of its own)."""
        self._asked_unpaired = 0
        """Bootstrap errors naming an address past `ASKED_KEPT` (not paired with the prefill logs that can be it)."""
        self.relabelled: list[str] = []
        """`FILE: labelled prefill, its lines are decode's` for each file whose lines say otherwise than its label."""
        self.repeated: list[str] = []
        """Files given again: read once."""
        named: list[tuple[LogSpec, str, str]] = []
        seen: set[tuple[int, int]] = set()
        for spec in parsed:
            identity = _identity(spec.path)
            if identity in seen:
                self.repeated.append(str(spec.path))
                continue
            if identity is not None:
                seen.add(identity)
            file_role, file_instance = agent_file(spec.path.name)
            told = sniff_role(spec.path)  # the text wins over a label (DOMAIN.md): a pasted line names its side
            if told and spec.role and told != spec.role:
                self.relabelled.append(f"{spec.path}: labelled {spec.role}, its lines are {told}'s")
            role = told or spec.role or file_role or _role_named(spec.path.name)
            instance = file_instance if file_role == role else ""
            self._names.take(instance)
            named.append((spec, role, instance))
        rotated: dict[tuple[str, str, str], _File] = {}
        """The first piece of each server whose log was given in rotated pieces (`decode.log.1`, `decode.log`):
        the others are its instance, and their lines relate to its (a failure's line in one, its cause in the
        other)."""
        peers = _node_peers(named)
        for index, (spec, role, instance) in enumerate(named):
            server = _rotated_server(spec.path, role) if not instance else None
            piece = rotated.get(server) if server is not None else None
            peer = peers.get(server or index, index)
            reader = LogReader(spec.path)
            reader.open()
            first = first_stamp(spec.path)
            if first is not None:
                self._saw(first)
            start = first if first is not None else min(spec.path.stat().st_mtime, time.time())  # none written later
            clock = piece.clock if piece is not None else (index, "")  # a node of a server has its own host's
            if piece is not None:
                file = _File(spec, reader, role, piece.instance, start, first is not None, related=piece.related)
            elif peer < index:  # a node of the server whose first node's log came before
                file = _File(spec, reader, role, self.files[peer].instance, start, first is not None)
            else:
                file = _File(spec, reader, role, instance or self._names.next(role), start, first is not None)
            file.clock = clock
            file.dp = sniff_replicas(spec.path)
            if piece is not None:  # a rotated server's pieces: one server, whichever piece's head told
                if piece.dp.replicas is None:
                    piece.dp.said(file.dp.replicas)
                file.dp = piece.dp
            if server is not None:
                rotated.setdefault(server, file)
            self.files.append(file)

    @property
    def now(self) -> float:
        """The latest time the logs mention, or `until` when set (what "now" is for a view of them)."""
        return self.until if self.until is not None else self._now or time.time()

    @property
    def told_span(self) -> tuple[float, float] | None:
        """The earliest and the latest time a line of the logs told (None while none did: a file's time is no
        line's)."""
        return (self.start, self._now) if self._told and self.start is not None else None

    def stats(self) -> LogStats:
        stats = LogStats(len(self.files), failures=self._failures, batches=self._batches, context=self._context)
        stats.garbled, stats.no_room, stats.undated = self._garbled, self._no_room, self._undated
        stats.peers_unlisted, stats.asked_unpaired = self._peers_unlisted, self._asked_unpaired
        for file in self.files:
            read = file.reader.stats
            stats.bytes += read.bytes
            stats.lines += read.lines
            stats.matched += read.matched
            stats.garbled += read.garbled
            stats.rotations += read.rotations
            if read.damaged:
                stats.damaged.append(f"{file.spec.path}: {read.damaged}")
            if read.cut:
                stats.cut.append(str(file.spec.path))
            if not file.used and (why := self._unread(file)):  # marker words alone (a runbook quoting them): none
                stats.unread[str(file.spec.path)] = why
        stats.relabelled, stats.repeated = self.relabelled, self.repeated
        stats.clocks, stats.clock_steps, stats.misdated = self._clocks()
        stats.mixed = [
            f"{file.spec.path}: {file.other_role_lines} of its lines are {_OTHER_ROLE.get(file.role, '?')}'s, read as "
            f"{file.instance}'s (give each server's log apart)"
            for file in self.files
            if file.other_role_lines
        ]
        return stats

    def _clocks(self) -> tuple[dict[str, ClockOffset[str]], dict[str, ClockStep], dict[str, Misdated]]:
        """The servers whose clock differs from their group's first server's (its times corrected), those whose
        clock stepped back, and those with lines dated where no log's can be, by name (the log's too where a
        server's nodes each have their own)."""
        servers = self._servers()
        clocks_of: dict[str, set[Server]] = {}
        for server in servers:
            clocks_of.setdefault(server.instance, set()).add(server.clock)

        def name(server: _File) -> str:
            if not server.instance:  # no role known yet (no line of one read): its file names it
                return server.spec.path.name
            return (
                f"{server.instance} ({server.spec.path.name})"
                if len(clocks_of[server.instance]) > 1
                else server.instance
            )

        names = {server.clock: name(server) for server in reversed(servers)}  # a clock's first server names it
        offsets = {
            names[clock]: offset.named(names.get(offset.against, "?"))
            for clock, offset in (self.offsets or {}).items()
            if clock in names
        }
        steps = {name(server): server.stepped for server in servers if server.stepped is not None}
        misdated = {name(server): server.misdated for server in servers if server.misdated is not None}
        return offsets, steps, misdated

    def _unread(self, file: _File) -> str:
        """Why nothing was read from a file: empty, damaged before its first line, or no SGLang server log ("" when
        it is a log that said nothing kvtop reads, yet)."""
        lines = file.reader.stats.lines
        if not lines:
            return file.reader.stats.damaged or EMPTY  # a plain file named .gz is not an empty one
        if file.sniffed_lines != lines:  # asked again only once the file grew
            file.sniffed_lines, file.not_a_log = lines, not holds_sglang_lines(file.spec.path)
        return "not an SGLang server log (no line at its start or end is in SGLang's format)" if file.not_a_log else ""

    def load(self, model: ClusterModel) -> None:
        """Read every file to its end into the model (a last line without a newline included), its failures
        folded into the model's incidents; memory is the model's bounds and one poll's events."""
        for _ in self.stream(model):
            pass

    def stream(self, model: ClusterModel, max_bytes: int = LOAD_BYTES) -> Iterator[list[tuple[str, Event]]]:
        """`load`, a poll at a time (about `max_bytes` of each file): yields what each poll applied, then folds
        the failures into the model's incidents."""
        while True:
            yield self.poll(model, final=True, max_bytes=max_bytes)
            if all(file.reader.at_end() for file in self.files):
                model.update_incidents()
                return

    def poll(
        self, model: ClusterModel | None, final: bool = False, max_bytes: int = 64 << 20
    ) -> list[tuple[str, Event]]:
        """Read what the files gained (up to `max_bytes` each), apply it in time order; returns (label, event)s.

        `model` None: only return them (a sidecar publishes them instead)."""
        if self.offsets is None:
            self._read_clocks()
        pending: list[tuple[float, int, _File, str, Event]] = []
        for file in self.files:
            for text in file.reader.read(final, max_bytes):
                self._line(file, text, pending)
            self._saw_dated(file, file.reader.last_dated, file.reader.last_dated_handed)
        for file in self.files:
            complete = final and file.reader.at_end()
            for server in file.servers:
                dying = server.dying
                if dying is not None and dying.given_up(None if complete else server.last_ts, file.reader.quiet):
                    server.dying = None
                    self._startup_death(server, dying.line, dying.ts, None, pending)
        last_pieces = {id(file.related): file for file in self.files}
        for file in self.files:
            if last_pieces[id(file.related)] is not file:
                continue  # an earlier piece of a rotated log: what it left unclaimed, the pieces after may claim
            complete = final and file.reader.at_end()
            for server in file.servers:
                now, quiet = None if complete else server.last_ts, file.reader.quiet
                for error in server.related.unclaimed(now, quiet):
                    self._worker_error(server, error, pending)
                for said in server.related.unclaimed_announcements(now, quiet):
                    line = ContextLine(said.since, said.tp, said.kind, None, said.text, said.pp, said.dp)
                    self._rank_event(server, line, said.since, pending)
        if self.until is not None:
            pending = [item for item in pending if item[0] <= self.until]
        if model is not None:  # before the lines apply: a failure's suspect reads them (a single pass reads no more)
            self._list_peers(model)
            for server in self._servers():
                if server.instance and server.tp_size:
                    model.tp_sizes[server.instance] = server.tp_size
        pending.sort(key=itemgetter(0, 1))
        applied: list[tuple[str, Event]] = []
        run: list[Event] = []
        for index, (ts, _, file, label, event) in enumerate(pending):
            run.append(event)
            applied.append((label, event))
            following = pending[index + 1] if index + 1 < len(pending) else None
            if following is None or following[3] != label:
                if model is not None:
                    self._apply(model, file, label, run, ts)
                run = []
        return applied

    def close(self) -> None:
        for file in self.files:
            file.reader.close()

    def _read_clocks(self) -> None:
        """Compare the servers' clocks from the rooms their logs both name (`clocks`) and set each file's
        correction, before any line is applied: the times the logs' first lines told are moved with them."""
        clocks = {file.clock: file.spec.path for file in self.files}
        if len(clocks) < 2:  # one server's log (or a rotated one's pieces): no other clock to compare with
            self.offsets = {}
            return
        self.offsets = read_room_times([(file.clock[0], file.spec.path) for file in self.files]).offsets()
        for file in self.files:
            file.correction, file.zone = self._correction(file.clock)
        if any(file.correction for file in self.files):
            self._told, self._now, self.start = False, 0.0, None
            for file in self.files:
                if file.dated:  # the first stamp each file told: on the first server's clock now
                    file.last_ts -= file.correction
                    self._saw(file.last_ts)

    def _correction(self, clock: Server) -> tuple[float, bool]:
        """What to take off the times of the server with `clock`, and whether it is a timezone's."""
        offset = self.offsets.get(clock) if self.offsets else None
        return (offset.offset_s, offset.whole_hours) if offset is not None and offset.corrected else (0.0, False)

    def context_for(self, groups: Sequence[FailureGroup]) -> list[list[Context]]:
        """For each group: lines about its room, and lines near it in time (its instances', transport libraries')."""
        return context_for(self.context, groups)

    def _servers(self) -> list[_File]:
        """Every server the files hold: each file's own lines (none when a wrapper names the server of each line: its
        role from the file's name is no server's), and the servers a wrapper names in it."""
        return [
            server
            for file in self.files
            for server in file.servers
            if server is not file or not file.streams or file.seq
        ]

    def _stream(self, file: _File, text: str) -> tuple[_File | None, str]:
        """The server a line is from (a wrapper may name one, `split_stream`), and the line without the wrapper;
        None for a line of a server past the file's `STREAMS_MAX` or named longer than `STREAM_NAME_MAX` (a file
        that names servers without end: counted as garbled).

        A docker compose wrapper counts before SGLang's prefix or a glog line, or once its server is known:
        `name | ` is common enough in other lines."""
        name, rest = split_stream(text)
        if not name or (
            name not in file.streams and not text.startswith("[pod/") and not has_prefix(rest) and not is_glog(rest)
        ):
            return file, text
        server = file.streams.get(name)
        if server is None:
            if len(file.streams) >= STREAMS_MAX or len(name) > STREAM_NAME_MAX:
                return None, rest
            self._names.take(name)
            role = _role_named(name) or file.spec.role  # else its lines will say
            instance = self.instance or name
            server = file.streams[name] = _File(file.spec, file.reader, role, instance, file.last_ts, file.dated)
            server.clock = (file.clock[0], name)
            server.correction, server.zone = self._correction(server.clock)
        return server, rest

    def _line(self, file: _File, text: str, pending: list[tuple[float, int, _File, str, Event]]) -> None:
        given = file
        if " | " in text or text.startswith("[pod/"):  # what a wrapper that names a server holds (`split_stream`)
            server, text = self._stream(file, text)
            if server is None:
                self._garbled += 1
                return
            file = server
        glued = glued_glog(text)
        if glued is not None and ("\n" in text or has_prefix(text)):  # two processes' output in one stream: each
            # read as its own line (an undated line of its own with a glog line glued into it is that glog line)
            self._record(file, given, glued[0], pending)
            self._record(file, given, glued[1], pending)
            return
        self._record(file, given, text, pending)

    def _record(
        self, file: _File, given: _File, text: str, pending: list[tuple[float, int, _File, str, Event]]
    ) -> None:
        """One record of `file` (`given`: the file it came in, a wrapper's server's or its own)."""
        if " batch" in text:
            key = text[: text.find(" batch")]  # the prefix, its time and rank (a service's name may come first)
            if key and key == file.batch_key:
                return  # queue depths once per second and rank are enough
            file.batch_key = key
        record: Record | None
        try:
            printed = as_printed(text)  # a failure or a lost connection as SGLang prints it: most marked lines
            if printed is not None:
                prefix, record = printed
            else:
                prefix = parse_prefix(text)
                # only an undated line may be a glog one (the year dates nothing else; a localtime and a match a line)
                year = glog_year(prefix.message, file.last_ts, latest=not file.dated) if prefix.ts is None else 0
                record = classify(prefix, year)
        except (Garbled, ValueError):
            self._garbled += 1
            return
        given.used += prefix.ts is not None or record is not None
        if (bad := _unbelievable(prefix.ts, record)) is not None:  # its time is the line's before, as an undated one's
            file.misdate(bad)
            prefix = msgspec.structs.replace(prefix, ts=None)
            record = record if record is None or isinstance(record, ServerArgsLine) else _undated(record)
        if "DP" in prefix.tags:
            file.dp.saw(prefix.tags)
        if prefix.ts is not None:
            if prefix.ts < file.latest - STEP_BACK_S:
                self._stepped_back(file, prefix.ts)
            file.latest = max(file.latest, prefix.ts)
            file.last_ts, file.dated = prefix.ts - file.correction, True
            if "TP" in prefix.tags or "PP" in prefix.tags or "DP" in prefix.tags:
                file.last_tp, file.last_pp, file.last_dp = prefix.tp, prefix.pp, prefix.tags.get("DP")
        elif record is not None and not isinstance(record, ServerArgsLine) and record.ts is not None:
            file.last_ts, file.dated = record.ts - _moved(file, record), True  # a glog or UCX line: a time, no rank
        if record is None or isinstance(record, ServerArgsLine):
            if record is not None:
                file.bootstrap_port, file.launch = record.bootstrap_port, record.launch
                file.tp_size = record.tp_size or file.tp_size
                file.dp.said(record.dp_replicas)
            if prefix.ts is not None:  # a line that only dates: the span the logs cover
                self._saw(file.last_ts)
            return
        ts = record.ts - _moved(file, record) if record.ts is not None else file.last_ts
        self._undated += record.ts is None and not file.dated
        self._saw(ts, guessed=not file.dated)  # lines that tell no time too: "now" is never the wall clock once read
        if isinstance(record, LauncherLine):
            self._launcher(file, record, ts, pending)
            return
        if isinstance(record, ContextLine):
            self._context_line(file, record, ts, pending)
            return
        if not file.role:
            file.role = record.role
        elif record.role != file.role:
            file.other_role_lines += 1
        if not file.instance:
            file.instance = self._names.next(file.role)
        dp = file.dp.replica(record.dp)
        label = self._label(file.instance, record.tp, record.pp, dp)
        if label is None:
            return
        event: Event
        if isinstance(record, FailureLine):
            if record.reason.startswith(ABORTED_BY_REQUEST) and (
                gave_up := file.related.gave_up(record.pp, record.tp, ts)
            ):
                record = msgspec.structs.replace(record, reason=cut_text(f"{gave_up} (then SGLang: {record.reason})"))
            room, echo = file.related.link(record, ts)
            roomed = record if room == record.room else msgspec.structs.replace(record, room=room)
            failure = to_failure(roomed, label, ts)
            if failure is None:
                self._no_room += 1
                self.context.append(Context(ts, file.instance, record.tp, "no_room", None, text, record.pp, dp))
                return
            if echo:  # the room already failed in this instance: the same failure seen by another rank
                failure = msgspec.structs.replace(
                    failure, reason_class="propagated", level=str(Level.DEBUG), is_from_another_rank=True, origin=""
                )
            self._failures += 1
            self._peer_named(record.reason, label)
            event = failure
        else:
            self._batches += 1
            event = to_heartbeat(record, ts)
        pending.append((ts, len(pending), file, label, event))

    def _context_line(
        self, file: _File, record: ContextLine, ts: float, pending: list[tuple[float, int, _File, str, Event]]
    ) -> None:
        """A line that explains failures: kept as context; a crash, or a transport error the suspects read, is also
        its rank's event."""
        file.related.context(record, ts)
        self._context += 1
        dp = file.dp.replica(record.dp)
        context = Context(
            ts, file.instance or file.spec.path.name, record.tp, record.kind, record.room, record.text, record.pp, dp
        )
        self.context.append(context)
        transport_error = context.transport_error
        if transport_error:
            self.errors.append(context)
        if record.kind in RANK_EVENT_KINDS or (transport_error and _tells_suspects(record.text)):
            self._rank_event(file, record, ts, pending)  # its rank's (a sidecar publishes it with the rank's)
        elif self.fresh_context is not None and record.kind != BOOTSTRAP_ERROR:  # that one: once unclaimed
            self.fresh_context.append(context)
        if record.kind == "lost_connection" and record.tp is not None and file.instance:
            self._peer_named(record.text, rank_label(file.instance, record.tp, record.pp, dp))
        elif record.kind == BOOTSTRAP_ERROR and REGISTRATION_FAILED not in record.text:
            self._asked_at(bootstrap_address(record.text))

    def _launcher(
        self, file: _File, line: LauncherLine, ts: float, pending: list[tuple[float, int, _File, str, Event]]
    ) -> None:
        """A launcher's word that a scheduler died: its crash, once its exit code is known (`Rank N scheduler is
        dead.` waits for its next line, `Exit code: C`: `_Dying`); an exit code's line that none waits for says
        nothing."""
        dying, file.dying = file.dying, None
        if dying is not None:  # its exit code, else another launch's word: the one waiting gets none
            code = line.code if line.index is None and ts - dying.ts <= EXIT_CODE_S else None
            self._startup_death(file, dying.line, dying.ts, code, pending)
        if line.index is not None and line.code is None:
            file.dying = _Dying(line, ts, time.monotonic())
        elif line.index is not None:
            self._startup_death(file, line, ts, None, pending)

    def _startup_death(
        self,
        file: _File,
        line: LauncherLine,
        ts: float,
        code: int | None,
        pending: list[tuple[float, int, _File, str, Event]],
    ) -> None:
        """The crash of the scheduler a launcher's line names, on its node (`file.launch`), with `code` where the line
        gives none; a rank past the node's schedulers is garbled."""
        try:
            record = startup_death(line, file.launch, code)
        except Garbled:
            self._garbled += 1
            return
        self._context_line(file, record, ts, pending)

    def _saw_dated(self, file: _File, line: str, handed: bool) -> None:
        """The last dated line a file gave (marked or not; `handed`: `_line` read it): how far the span the logs
        cover goes, unless its time is no log's (counted here when no marker brought it to `_line`)."""
        if line == file.last_dated:
            return  # seen at the poll before
        file.last_dated = line
        name, rest = split_stream(line)
        try:
            ts = parse_prefix(rest if name else line).ts
        except ValueError:
            return
        if ts is None:
            return
        server = file.streams.get(name, file)
        if believable(ts):
            self._saw(ts - server.correction)
        elif not handed:
            server.misdate(ts)

    def _stepped_back(self, file: _File, ts: float) -> None:
        """A line of `file` dated `ts` (as written), more than `STEP_BACK_S` before the latest one it dated: its
        clock was set back (the largest step is kept)."""
        back = file.latest - ts
        if file.stepped is None or back > file.stepped.back_s:
            file.stepped = ClockStep(round(back, 3), ts - file.correction)

    def _saw(self, ts: float, guessed: bool = False) -> None:
        """The logs mention this time: the span they cover reaches it. A `guessed` time (a file's mtime, for a line
        of a file that told none yet) stands for the span only while no line told one. Every time here is
        `clocks.believable` (a line dated 2099 made "now" 2099 for every view, and every failure old)."""
        if guessed and self._told:
            return
        if not guessed and not self._told:
            self._told = True
            self._now, self.start = 0.0, None  # the guesses stood for the span until a line told a time
        self._now = max(self._now, ts)
        self.start = ts if self.start is None else min(self.start, ts)

    def _rank_event(
        self, file: _File, line: ContextLine, ts: float, pending: list[tuple[float, int, _File, str, Event]]
    ) -> None:
        """A rank crashed, it could not reach a bootstrap server, it timed out a room its line for which was not
        read, or its transport library logged a fault of its own side: its rank says so to the model (under the
        file's name while the file's role is unknown: never dropped for want of a name). A line that names no rank
        (a thread's death, a fatal signal, a glog line) is the rank of the dated line before it, else TP0."""
        if line.kind in ROOMLESS_KINDS:  # only a decode rank asks a bootstrap server, waits for KV, or loses a prefill
            file.role = file.role or "decode"
        elif line.kind == BOOTSTRAP_TIMED_OUT:  # only a prefill rank waits for a decode's request
            file.role = file.role or "prefill"
        file.instance = file.instance or self._names.next(file.role)
        named = line.tp is not None or line.pp is not None or line.dp is not None
        tp, pp, dp = (line.tp, line.pp, line.dp) if named else (file.last_tp, file.last_pp, file.last_dp)
        label = self._label(file.instance or file.spec.path.name, tp or 0, pp, file.dp.replica(dp))
        if label is None:
            return
        pending.append((ts, len(pending), file, label, LogContext(ts, line.kind, None, line.text, tp)))

    def _worker_error(
        self, file: _File, error: WorkerError, pending: list[tuple[float, int, _File, str, Event]]
    ) -> None:
        """A worker error no failure line claimed: the room's failure record itself, an origin at its rank."""
        file.role = file.role or "prefill"  # the transfer worker that raises it is the sender's
        file.instance = file.instance or self._names.next(file.role)
        label = self._label(file.instance, error.tp or 0, error.pp, file.dp.replica(error.dp))
        if label is None:
            return
        level = Level.WARNING if file.role == "prefill" else Level.ERROR
        failure = Failure(
            error.ts, error.room, label, error.reason, reason_class(error.reason), str(level), False, label
        )
        self._failures += 1
        pending.append((error.ts, len(pending), file, label, failure))

    def _label(self, instance: str, tp: int, pp: int | None, dp: int | None = None) -> str | None:
        """The rank's label (`dp`: its DP replica's rank, None where the server's DP ranks are no replicas); None
        for one more than `RANKS_MAX` (its line counted as garbled)."""
        label = rank_label(instance, tp, pp, dp)
        if label not in self._labels:
            if len(self._labels) >= RANKS_MAX:
                self._garbled += 1
                return None
            self._labels.add(label)
        return label

    def _peer_named(self, text: str, label: str) -> None:
        """Note the prefill instance a decode rank's line says it lost (by its bootstrap address)."""
        address = lost_prefill(text)
        if not address:
            return
        if address not in self._peers and len(self._labels) + len(self._peers) >= RANKS_MAX:
            self._peers_unlisted += 1
            return
        self._peers.setdefault(address, {})[label] = None

    def _asked_at(self, address: str) -> None:
        """Note the bootstrap address a decode rank's bootstrap error names (none: nothing to note)."""
        if not address or address in self._asked:
            return
        if len(self._asked) >= ASKED_KEPT:
            self._asked_unpaired += 1
            return
        self._asked[address] = None

    def _list_peers(self, model: ClusterModel) -> None:
        """List in the model each prefill instance decode lines named (`ClusterModel.peer_named`) that none of
        the prefill logs read can be: a prefill log is ruled out only by a bootstrap port of its own that is not
        the address's (the host a log prints is where it listens, often 0.0.0.0, not the address decode used).
        The instances of the logs that can be it are the model's `instances_at` the address, and so are those of each
        address a decode's bootstrap error asked (a decode's error and the prefill's give-up that names no address are
        one failure: `IncidentTracker`)."""
        for address, named_by in self._peers.items():
            logs = self._prefills_at(address)
            if logs:
                model.forget_peer_named(address)
                model.instances_at[address] = tuple(dict.fromkeys(file.instance for file in logs if file.instance))
            else:
                model.peer_named(address, "prefill", address.rpartition(":")[0], list(named_by))
        for address in self._asked:
            if address not in self._peers and (logs := self._prefills_at(address)):
                model.instances_at[address] = tuple(dict.fromkeys(file.instance for file in logs if file.instance))

    def _prefills_at(self, address: str) -> list[_File]:
        """The prefill instances whose logs can be at a bootstrap address: a log is ruled out only by a bootstrap port
        of its own that is not the address's."""
        port = address.rpartition(":")[2]
        return [
            server
            for server in self._servers()
            if server.role == "prefill" and (server.bootstrap_port is None or str(server.bootstrap_port) == port)
        ]

    def _apply(self, model: ClusterModel, file: _File, label: str, events: list[Event], ts: float) -> None:
        parts = self._parts.get(label)
        if parts is None:  # a regex a label: read once per rank (at most `RANKS_MAX`), not per event
            parts = self._parts[label] = label_parts(label) or (label, None, 0)
        instance, pp, tp = parts
        model.log_rank(label, file.role, instance, tp)
        seq = file.seq[label] = file.seq.get(label, 0) + 1
        model.apply(label, EventBatch(EVENT_SCHEMA, file.role, instance, tp, 0, seq, ts, events, pp), ts)


def load(paths: Iterable[str | Path | LogSpec], model: ClusterModel) -> SGLangLogs:
    """Read the logs to their end into `model`; the returned source has `stats()`, `context_for()`, `poll()`."""
    logs = SGLangLogs(paths)
    logs.load(model)
    return logs
