"""SGLang server logs as a source: files in, `ClusterModel.apply()` out, like the live collector.

Each file is one server instance. Which kind (prefill or decode) it is comes
from `prefill=FILE` / `decode=FILE`, else from its name when it is one of our
agents' log files (`prefill-0.log`, rotated `prefill-0.log.1`, `.gz`), else
from the first lines that only one kind writes. Instances are named like our
agents (`prefill-0`), from the file name when it is an agent's, else
`prefill-N`/`decode-N` in argument order; a rank is `instance/TP{tp}`, so
labels look like the live ones.

Failure lines become `Failure` events (origins inferred, `infer.py`), batch
lines `Heartbeat`s whose counters are the queue depths, both applied per rank
in time order across files; the ranks are log ranks (`RankView.from_log`).
Everything else kvtop understands (sessions, lost connections, NIXL errors,
tracebacks, transport-library lines) is kept as context for the failure
groups near it (`context_for`).
"""

from __future__ import annotations

import bisect
import gzip
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import ROOM_REUSE_S, FailureGroup
from kvtop.sources.sglang.infer import to_failure
from kvtop.sources.sglang.lines import ROLE_MARKERS, BatchLine, ContextLine, FailureLine, Garbled, classify
from kvtop.sources.sglang.prefix import parse_prefix
from kvtop.sources.sglang.reader import LogReader
from transport.events import EVENT_SCHEMA, Event, EventBatch, Heartbeat

ROLES = ("prefill", "decode")
AGENT_FILE = re.compile(r"((prefill|decode)-\d+)\.log(?:\.\d+)?(?:\.gz)?")
SNIFF_BYTES = 4 << 20
CONTEXT_KEPT = 10_000
CONTEXT_S = 5.0
"""Lines without a room are shown with failure groups that started this close in time."""


@dataclass(frozen=True)
class LogSpec:
    """A log file and, when the user said so, which kind of server wrote it."""

    path: Path
    role: str = ""

    @classmethod
    def parse(cls, text: str) -> LogSpec:
        """`FILE`, `prefill=FILE` or `decode=FILE`."""
        for role in ROLES:
            if text.startswith(f"{role}="):
                return cls(Path(text[len(role) + 1 :]), role)
        return cls(Path(text))


@dataclass(frozen=True, slots=True)
class Context:
    """A line shown beside the failure groups it may explain."""

    ts: float
    source: str
    """The instance whose log holds it (the file name while its kind is unknown)."""
    tp: int | None
    kind: str
    room: int | None
    text: str

    @property
    def likely_cause(self) -> bool:
        """Transport libraries (glog, UCX) log the low-level error that failed the rooms near it."""
        return self.kind in ("glog", "ucx")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "likely_cause": self.likely_cause}


@dataclass
class LogStats:
    """What the files gave: bytes and lines read, lines parsed, and what was skipped."""

    files: int = 0
    bytes: int = 0
    lines: int = 0
    matched: int = 0
    failures: int = 0
    batches: int = 0
    context: int = 0
    garbled: int = 0
    """Lines that hold a marker but not the shape of their kind, or that are not text: counted, skipped."""
    no_room: int = 0
    """Failure lines without a room (kept as context: they cannot be folded)."""
    rotations: int = 0

    def summary(self) -> str:
        return (
            f"sglang logs: {self.files} files, {self.lines} lines, {self.failures} failure lines, "
            f"{self.batches} batch lines, {self.context} context lines, {self.garbled} garbled (skipped), "
            f"{self.no_room} without a room"
        )


@dataclass(eq=False)
class _File:
    spec: LogSpec
    reader: LogReader
    role: str
    instance: str
    last_ts: float
    """Time of the last prefixed line (the file's mtime before one): lines without a prefix get it."""
    batch_key: str = ""
    seq: dict[str, int] = field(default_factory=dict)


class SGLangLogs:
    """Several log files read together: `poll(model)` applies what is new; `load(model)` reads to the end."""

    def __init__(self, specs: Iterable[str | Path | LogSpec]) -> None:
        parsed = [s if isinstance(s, LogSpec) else LogSpec.parse(str(s)) for s in specs]
        self.files: list[_File] = []
        self.context: deque[Context] = deque(maxlen=CONTEXT_KEPT)
        self._garbled = self._failures = self._batches = self._context = self._no_room = 0
        self._now = 0.0
        self._taken: set[str] = set()
        named: list[tuple[LogSpec, str, str]] = []
        for spec in parsed:
            match = AGENT_FILE.fullmatch(spec.path.name)
            role = spec.role or (match[2] if match else "") or _sniff(spec.path)
            instance = match[1] if match and match[2] == role else ""
            self._taken.add(instance)
            named.append((spec, role, instance))
        for spec, role, instance in named:
            reader = LogReader(spec.path)
            reader.open()
            mtime = spec.path.stat().st_mtime
            self.files.append(_File(spec, reader, role, instance or self._name(role), mtime))

    def _name(self, role: str) -> str:
        """The next free `role-N` ("" while the role is unknown)."""
        if not role:
            return ""
        index = 0
        while f"{role}-{index}" in self._taken:
            index += 1
        self._taken.add(f"{role}-{index}")
        return f"{role}-{index}"

    @property
    def now(self) -> float:
        """The latest time the logs mention (what "now" is for a view of them)."""
        return self._now or time.time()

    def stats(self) -> LogStats:
        stats = LogStats(len(self.files), failures=self._failures, batches=self._batches, context=self._context)
        stats.garbled, stats.no_room = self._garbled, self._no_room
        for file in self.files:
            read = file.reader.stats
            stats.bytes += read.bytes
            stats.lines += read.lines
            stats.matched += read.matched
            stats.garbled += read.garbled
            stats.rotations += read.rotations
        return stats

    def load(self, model: ClusterModel) -> list[tuple[str, Event]]:
        """Read every file to its end (a last line without a newline included); what was applied."""
        applied: list[tuple[str, Event]] = []
        while True:
            applied += self.poll(model, final=True)
            if all(file.reader.at_end() for file in self.files):
                return applied

    def poll(self, model: ClusterModel, final: bool = False, max_bytes: int = 64 << 20) -> list[tuple[str, Event]]:
        """Read what the files gained (up to `max_bytes` each), apply it in time order; returns (label, event)s."""
        pending: list[tuple[float, int, _File, str, Event]] = []
        for file in self.files:
            for text in file.reader.read(final, max_bytes):
                self._line(file, text, pending)
        pending.sort(key=lambda item: (item[0], item[1]))
        applied: list[tuple[str, Event]] = []
        run: list[Event] = []
        for index, (ts, _, file, label, event) in enumerate(pending):
            run.append(event)
            applied.append((label, event))
            following = pending[index + 1] if index + 1 < len(pending) else None
            if following is None or following[3] != label:
                self._apply(model, file, label, run, ts)
                run = []
        return applied

    def close(self) -> None:
        for file in self.files:
            file.reader.close()

    def context_for(self, groups: Sequence[FailureGroup]) -> list[list[Context]]:
        """For each group: lines about its room, and lines near it in time (its instances', transport libraries')."""
        ordered = sorted(self.context, key=lambda c: c.ts)
        times = [c.ts for c in ordered]
        by_room: dict[int, list[Context]] = {}
        for line in ordered:
            if line.room is not None:
                by_room.setdefault(line.room, []).append(line)
        found: list[list[Context]] = []
        for group in groups:
            start = group.first_ts
            instances = {e.instance for e in group.echoes} | {group.origin_label.rpartition("/")[0]}
            near = ordered[bisect.bisect_left(times, start - CONTEXT_S) : bisect.bisect_right(times, start + CONTEXT_S)]
            lines = [c for c in by_room.get(group.room, []) if abs(c.ts - start) <= ROOM_REUSE_S]
            lines += [c for c in near if c.room is None and (c.likely_cause or c.source in instances)]
            found.append(sorted(set(lines), key=lambda c: (c.ts, c.source, c.text)))
        return found

    def _line(self, file: _File, text: str, pending: list[tuple[float, int, _File, str, Event]]) -> None:
        if " batch" in text:
            key = text[: text.find("]") + 1]
            if key and key == file.batch_key:
                return  # queue depths once per second and rank are enough
            file.batch_key = key
        try:
            prefix = parse_prefix(text)
            record = classify(prefix, time.localtime(file.last_ts).tm_year)
        except (Garbled, ValueError):
            self._garbled += 1
            return
        if record is None:
            return
        if prefix.ts is not None:
            file.last_ts = prefix.ts
        ts = record.ts if record.ts is not None else file.last_ts
        self._now = max(self._now, ts)  # lines without a prefix too: "now" is never the wall clock once read
        if isinstance(record, ContextLine):
            self._context += 1
            self.context.append(Context(ts, file.instance or file.spec.path.name, record.tp, record.kind,
                                        record.room, record.text))  # fmt: skip
            return
        if not file.role:
            file.role = record.role
        if not file.instance:
            file.instance = self._name(file.role)
        label = f"{file.instance}/TP{record.tp}"
        event: Event
        if isinstance(record, FailureLine):
            failure = to_failure(record, label, ts)
            if failure is None:
                self._no_room += 1
                self.context.append(Context(ts, file.instance, record.tp, "no_room", None, text))
                return
            self._failures += 1
            event = failure
        else:
            self._batches += 1
            event = _heartbeat(record, ts)
        pending.append((ts, len(pending), file, label, event))

    def _apply(self, model: ClusterModel, file: _File, label: str, events: list[Event], ts: float) -> None:
        instance, _, tp = label.rpartition("/TP")
        model.log_rank(label, file.role, instance, int(tp))
        seq = file.seq[label] = file.seq.get(label, 0) + 1
        model.apply(label, EventBatch(EVENT_SCHEMA, file.role, instance, int(tp), 0, seq, ts, events), ts)


def _heartbeat(line: BatchLine, ts: float) -> Heartbeat:
    """A batch line as the heartbeat a live agent would send: queue depths as counters, in-flight rooms."""
    inflight = line.queues.get("queue_inflight", line.queues.get("queue_transfer", 0))
    return Heartbeat(ts, dict(line.queues), inflight, 0, 0.0, 0, 0.0)


def _sniff(path: Path) -> str:
    """Which kind of server wrote the file, from the first line only one kind writes ("" when none says)."""
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as head:
            text = head.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return ""
    found = [(pos, role) for marker, role in ROLE_MARKERS.items() if (pos := text.find(marker)) >= 0]
    return min(found)[1] if found else ""


def load(paths: Iterable[str | Path | LogSpec], model: ClusterModel) -> SGLangLogs:
    """Read the logs to their end into `model`; the returned source has `stats()`, `context_for()`, `poll()`."""
    logs = SGLangLogs(paths)
    logs.load(model)
    return logs
