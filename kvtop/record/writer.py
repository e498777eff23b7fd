"""The recorder: what a live collector applies to its model, written to a recording as it happens.

The collector calls the `Recorder` under its lock (`delivered`, `swept`, `registered`, `expected`,
`forgot`, `accounted`, `tick`): each call appends a record to a list and returns (no encoding, no I/O on
the collector's thread). A writer thread takes the list every `flush_s`, encodes it (msgspec), compresses
it (zstd) and appends it as a block; it also writes the failure origins of the block (MARKS) and, when
`tick` took one, a keyframe. Segments rotate at a keyframe once they hold `segment_bytes` past the keyframe
they open with, so each segment starts with a keyframe and stands alone once the older ones are deleted
(`retain_s`, `max_bytes`: the bounded ring). With `max_bytes`, a segment is an eighth of it, and the oldest
segments go before a block is written, so the segments never hold more than `max_bytes` together (unless
the one being written does alone: a keyframe about as big as the cap). One recorder writes a folder at a
time (kvtop.record.lock).

A keyframe is taken by a forked child (kvtop.record.forked: the lock is held for the fork, a few ms,
not for the capture, hundreds of ms at 100k rooms); the writer waits for it in its place among the ops.
Captured under the lock instead: a recorder's first keyframe (the model is new then, and a run's first
segment must start with one), the one after a child failed (so a recording never goes two keyframes
without one: the ring rotates at keyframes), and every one where there is no fork (`fork_keyframes`) or
no writer thread to collect it (a recorder never started writes on `close`).

A writer that cannot keep up drops whole flushes past `max_pending` ops and records that it did
(`Dropped`; the replay is inexact until the next keyframe, which it then asks for). A write that fails (a
full disk) stops the recording: `error` says why, the ops of the block that failed and every op after it
count as dropped, and `stats()` shows both.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Intake
from kvtop.record.forked import FORK_KEYFRAMES, ForkedKeyframe, KeyframeFailed, abandon, collect, fork_capture
from kvtop.record.format import DIR_MODE, INDEX_SUFFIX, SEGMENT_SUFFIX, BlockKind
from kvtop.record.keyframes import capture
from kvtop.record.lock import LOCK_NAME, lock_folder
from kvtop.record.records import (
    Accounted,
    Delivered,
    Dropped,
    Expected,
    Forgot,
    Gapped,
    Mark,
    Op,
    Registered,
    Swept,
)
from kvtop.record.segment import SEGMENT_HEADERS, SegmentWriter, block_bytes, index_path
from transport.bootstrap import REFUSED_KEPT
from transport.plane.events import EventBatch, Snapshot
from transport.thread_names import name_os_thread
from transport.wire import AgentInfo

log = logging.getLogger("kvtop.record")

FLUSH_S = 0.25
KEYFRAME_EVENTS = 50_000
"""A keyframe after this many events: a seek replays at most this many (~0.1 s with decoding; `bench replay`)."""
KEYFRAME_S = 60.0
"""A keyframe at least this often, however quiet the cluster."""
SEGMENT_BYTES = 16 << 20
SEGMENT_S = 3600.0
"""A segment is closed (at the next keyframe) past this size or age: the ring deletes whole segments."""
RING_SEGMENTS = 8
"""With `max_bytes`, a segment is at most `max_bytes / RING_SEGMENTS`: the ring deletes an eighth at a time."""
MIN_SEGMENT_BYTES = 128 << 10
"""The smallest segment a cap makes (each segment costs a keyframe)."""
MIN_MAX_BYTES = RING_SEGMENTS * MIN_SEGMENT_BYTES
"""The smallest cap the commands accept (1 MiB)."""
MAX_PENDING = 2_000_000
"""Ops held for the writer at most (about 10 s at 200k events/s in batches of 1)."""


@dataclass(frozen=True, slots=True)
class _Keyframe:
    """A keyframe captured at `now`, in its place among the ops."""

    now: float
    state: bytes


class _FramedDelivery(msgspec.Struct, tag="d", array_like=True, frozen=True):
    """A `Delivered` op whose batch is the frame it came in (encodes exactly as `Delivered`, without
    encoding the batch again)."""

    now: float
    label: str
    item: msgspec.Raw


@dataclass(frozen=True, slots=True)
class _Marks:
    """Failure origins the model took in since the last pass (for the MARKS block of the next flush)."""

    marks: list[Mark]


@dataclass(frozen=True)
class RecorderStats:
    ops: int
    """Ops written."""
    events: int
    """Events handed to the recorder (those of dropped ops included: `dropped_ops` says how many ops)."""
    blocks: int
    keyframes: int
    bytes: int
    """Bytes of the segments on disk now (the ring's deletions taken off)."""
    segments: int
    dropped_ops: int
    deleted_segments: int
    error: str
    keyframes_failed: int = 0
    """Forked keyframes whose child failed or died (not written; the next keyframe is taken under the lock)."""
    keyframes_in_lock: int = 0
    """Keyframes captured under the collector's lock (the first, those after a failure, those with no fork)."""
    keyframes_forked: int = 0
    """Keyframes handed to a forked child (written, or failed)."""
    keyframe_child_cpu_s: float = 0.0
    """CPU seconds the children spent encoding and compressing keyframes (all of them)."""
    keyframe_child_bytes: int = 0
    """The most memory one child wrote to (copies of the parent's pages, and its buffers)."""


def _segment_name(first: float, seq: int) -> str:
    return f"seg-{int(first * 1e6):017d}-{seq:06d}{SEGMENT_SUFFIX}"


def make_folder(folder: Path) -> None:
    """The recording's folder, mode 0750 (its parents too, when missing)."""
    folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(folder, DIR_MODE)


class Recorder:
    """Records a live collector's model inputs into `folder` (a new recording, or more segments of one)."""

    def __init__(
        self,
        folder: str | Path,
        *,
        max_bytes: int | None = None,
        retain_s: float | None = None,
        keyframe_events: int = KEYFRAME_EVENTS,
        keyframe_s: float = KEYFRAME_S,
        segment_bytes: int = SEGMENT_BYTES,
        segment_s: float = SEGMENT_S,
        flush_s: float = FLUSH_S,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.time,
        fork_keyframes: bool = FORK_KEYFRAMES,
    ) -> None:
        """`max_bytes`/`retain_s`: delete the oldest segments beyond this size or age (None: keep all).
        `fork_keyframes`: take keyframes in a forked child (False: capture them under the lock).
        Raises `FolderInUse` when another recorder writes `folder`, `OSError` when it cannot be made."""
        self.folder = Path(folder)
        self._made = (not self.folder.exists(), not (self.folder / LOCK_NAME).exists())
        """Whether this recorder made the folder, and its lock file (`discard` removes them)."""
        make_folder(self.folder)
        self._lock: int | None = lock_folder(self.folder)
        """The folder's lock, held until `close`."""
        self.max_bytes, self.retain_s = max_bytes, retain_s
        self.keyframe_events, self.keyframe_s = keyframe_events, keyframe_s
        self.segment_bytes = segment_bytes
        if max_bytes is not None:
            self.segment_bytes = min(segment_bytes, max(MIN_SEGMENT_BYTES, max_bytes // RING_SEGMENTS))
        self.segment_s = min(segment_s, retain_s / 4) if retain_s is not None else segment_s
        self.flush_s, self.max_pending, self._clock = flush_s, max_pending, clock
        self.fork_keyframes = fork_keyframes
        self.error = ""
        self._pending: deque[Op | _FramedDelivery | _Keyframe | ForkedKeyframe | _Marks] = deque()
        """Ops and keyframes in order (appended by the collector's thread, taken by the writer's)."""
        self._events_since_keyframe = 0
        self._keyframe_at = -1e18
        self._want_keyframe = True
        self._in_lock_next = True
        """Capture the next keyframe under the lock (the first, and the one after a child failed)."""
        self._child: ForkedKeyframe | None = None
        """The forked keyframe the writer has not collected yet (one at a time)."""
        self._pipe: tuple[int, int] | None = None
        """The next forked keyframe's pipe, made by the writer's thread (off the collector's lock)."""
        self._last_account: Accounted | None = None
        self._failures_seen = 0
        self._events_in = 0
        self._segment: SegmentWriter | None = None
        self._opened_size = 0
        """The size of the segment being written after its first block (the keyframe it opens with), 0 before."""
        self._keyframe_asked = False
        """The writer asked for a keyframe to open the next segment with, and has reached none since (the ops
        written before it, in a full segment, ask no more: each would be one more keyframe)."""
        self._segments = _existing_segments(self.folder)
        """(path, time it was opened) of the folder's segments, oldest first (earlier runs' too: one ring)."""
        self._written: list[Path] = []
        """The segments this recorder opened (`discard` removes them)."""
        self._seq = 0
        self._ops = self._blocks = self._keyframes = 0
        self._bytes = sum(_size(path) + _size(index_path(path)) for path, _ in self._segments)
        self._dropped = self._deleted = 0
        self._keyframes_failed = self._keyframes_in_lock = self._keyframes_forked = self._child_bytes = 0
        self._child_cpu_s = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set by `tick` when a child is encoding: the writer collects it at once (the child waits on its pipe)."""
        self._thread = threading.Thread(target=self._run, name="kvtop-recorder", daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    # --- the collector's side (called under its lock) -------------------------------------

    def delivered(
        self, label: str, item: Snapshot | EventBatch, now: float, frame: bytes = b"", refused: int = 0
    ) -> None:
        """A delivery applied at `now`; `frame`: the frame a batch came in (written as it came, not encoded
        again: `Delivered.frame` of the subscriber); `refused`: records of it the subscriber left out."""
        if frame and type(item) is EventBatch:
            self._pending.append(_FramedDelivery(now, label, msgspec.Raw(memoryview(frame)[1:])))
        else:
            self._pending.append(Delivered(now, label, item, refused))
        count = len(item.events) if type(item) is EventBatch else 1
        self._events_since_keyframe += count
        self._events_in += count

    def swept(self, now: float, held: bool = False) -> None:
        self._pending.append(Swept(now, held))

    def registered(self, agent: AgentInfo, now: float) -> None:
        self._pending.append(Registered(now, agent))

    def expected(self, label: str, now: float) -> None:
        self._pending.append(Expected(now, label))

    def forgot(self, label: str, now: float) -> None:
        self._pending.append(Forgot(now, label))

    def gapped(self, label: str, incarnation: int, batches: int, now: float) -> None:
        self._pending.append(Gapped(now, label, incarnation, batches))

    def accounted(self, model: ClusterModel, now: float) -> None:
        """The collector's account, recorded when it changed."""
        intake = model.intake
        last = self._last_account
        if (
            last is None
            or last.counters != intake.counters
            or last.gaps != model.gaps
            or last.rejected_frames != model.rejected_frames
            or last.bad_entries != intake.bad_entries
            or last.bootstrap_counters != intake.bootstrap_counters
            or last.bootstrap_refused != intake.bootstrap_refused
            or last.error != intake.error
            or last.unreachable != intake.unreachable
            or last.upstream_errors != intake.upstream_errors
            or last.upstream_kept != intake.upstream_kept
            or last.upstream_relay != intake.upstream_relay
            or last.bootstrap_refusals != _refusals(intake)
            or last.bootstrap_replaced != intake.bootstrap_replaced[-REFUSED_KEPT:]
            or last.records_refused != intake.records_refused
        ):
            self._last_account = account = Accounted(
                now, dict(intake.counters), dict(intake.bad_entries), dict(intake.bootstrap_counters),
                list(intake.bootstrap_refused), model.gaps, model.rejected_frames, intake.error,
                dict(intake.unreachable), intake.upstream_relay, list(intake.upstream_errors),
                list(intake.upstream_kept), _refusals(intake), intake.bootstrap_replaced[-REFUSED_KEPT:],
                dict(intake.records_refused),
            )  # fmt: skip
            self._pending.append(account)

    def tick(self, model: ClusterModel, now: float) -> None:
        """End of one collector pass: take a keyframe when one is due (after `keyframe_events` events,
        `keyframe_s` seconds, a segment rotation or a drop) and the last one's child is done."""
        self._take_marks(model, now)
        due = self._events_since_keyframe >= self.keyframe_events or now - self._keyframe_at >= self.keyframe_s
        if not (due or self._want_keyframe) or self.error or self._child is not None:
            return
        self._want_keyframe = False
        self._events_since_keyframe = 0
        self._keyframe_at = now
        if self.fork_keyframes and not self._in_lock_next and self._thread.is_alive():
            pipe, self._pipe = self._pipe, None
            try:
                self._child = fork_capture(model, now, pipe)
            except OSError as error:
                log.warning("no fork for a keyframe (%s): captured under the lock", error.strerror or error)
            else:
                self._keyframes_forked += 1
                self._pending.append(self._child)
                self._wake.set()
                return
        self._in_lock_next = False
        self._keyframes_in_lock += 1
        self._pending.append(_Keyframe(now, capture(model)))

    def _take_marks(self, model: ClusterModel, now: float) -> None:
        """The origins among the failures the model took in since the last pass (a rank's own failure, not
        one it learnt of), from the model's own list: no walk over the events."""
        new = model.failures_total - self._failures_seen
        self._failures_seen = model.failures_total
        if new <= 0:
            return
        recent = itertools.islice(reversed(model.failures), min(new, len(model.failures)))
        marks = [Mark(f.ts, now, f.room, f.rank, f.reason_class) for f in recent
                 if not f.from_another_rank and f.origin in ("", f.rank)]  # fmt: skip
        if marks:
            self._pending.append(_Marks(marks[::-1]))

    # --- the writer's side ----------------------------------------------------------------

    def stats(self) -> RecorderStats:
        return RecorderStats(
            self._ops, self._events_in, self._blocks, self._keyframes, self._bytes, len(self._segments),
            self._dropped, self._deleted, self.error, self._keyframes_failed, self._keyframes_in_lock,
            self._keyframes_forked, self._child_cpu_s, self._child_bytes,
        )  # fmt: skip

    def close(self) -> None:
        """Write what is pending and close the segment (fsync'd); idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._flush()
        if self._segment is not None:
            try:
                self._segment.close()
            except OSError as error:
                self._fail(error)
            self._segment = None
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def discard(self) -> None:
        """Close, and remove what this recorder made (a start that failed leaves nothing behind): its segments and
        their indexes, the lock file and the folder when it made them (the folder only when empty then)."""
        made_folder, made_lock = self._made
        if made_lock and self._lock is not None:  # unlinked while held: no other recorder locks the doomed file
            (self.folder / LOCK_NAME).unlink(missing_ok=True)
        self.close()
        for path in self._written:
            for doomed in (path, index_path(path)):
                doomed.unlink(missing_ok=True)
        if made_folder:
            with contextlib.suppress(OSError):
                self.folder.rmdir()

    def _run(self) -> None:
        name_os_thread()
        try:
            while not self._stop.is_set():
                self._make_pipe()
                self._wake.wait(self.flush_s)
                self._wake.clear()
                self._flush()
            self._flush()
        except Exception as error:  # a bug: loud, and the recording stops
            log.exception("the recorder thread died; the recording stops here")
            self.error = f"the recorder stopped: {error!r}"
            child, self._child = self._child, None
            if child is not None:  # no one will read it: the child would wait on its pipe for ever
                abandon(child)

    def _make_pipe(self) -> None:
        """The next forked keyframe's pipe, made here, off the collector's lock (with no descriptors left,
        `fork_capture` tries again, and `tick` says why it captured under the lock)."""
        if self.fork_keyframes and self._pipe is None:
            with contextlib.suppress(OSError):
                self._pipe = os.pipe()

    def _flush(self) -> None:
        queued, take = self._pending, self._pending.popleft
        pending = [take() for _ in range(len(queued))]
        if not pending:
            return
        if self.error:
            self._drop_stopped(pending)
            return
        if len(pending) > self.max_pending:
            self._dropped += len(pending)
            self._want_keyframe = True
            log.warning("the recorder fell behind: %d ops dropped (a keyframe follows)", len(pending))
            for child in (item for item in pending if isinstance(item, ForkedKeyframe)):
                abandon(child)
                self._child = None
            pending = [Dropped(self._clock(), len(pending))]
        ops: list[Op | _FramedDelivery] = []
        marks: list[Mark] = []
        for item in pending:
            if isinstance(item, _Keyframe | ForkedKeyframe):  # may open a new segment: what came before goes first
                self._write_ops(ops)
                self._write_marks(marks)
                ops, marks = [], []
                self._write_keyframe(item)
            elif isinstance(item, _Marks):
                marks += item.marks
            else:
                ops.append(item)
        self._write_ops(ops)
        self._write_marks(marks)

    def _drop_stopped(self, pending: list[Op | _FramedDelivery | _Keyframe | ForkedKeyframe | _Marks]) -> None:
        """What came after the recording stopped: its ops counted as dropped, its keyframe's child stopped."""
        for item in pending:
            if isinstance(item, ForkedKeyframe):
                abandon(item)
                self._child = None
            elif not isinstance(item, _Keyframe | _Marks):
                self._dropped += 1

    def _write_marks(self, marks: list[Mark]) -> None:
        if marks and self._segment is not None:
            raw = msgspec.msgpack.encode(marks)
            self._append(BlockKind.MARKS, marks[0].arrived, marks[-1].arrived, len(marks), raw)

    def _write_ops(self, ops: list[Op | _FramedDelivery]) -> None:
        if self.error:
            self._dropped += len(ops)
            return
        if not ops:
            return
        if self._segment is None:  # ops before any keyframe: they replay onto an empty model
            self._rotate(ops[0].now)
        raw = msgspec.msgpack.encode(ops)
        self._append(BlockKind.OPS, ops[0].now, ops[-1].now, len(ops), raw)

    def _write_keyframe(self, keyframe: _Keyframe | ForkedKeyframe) -> None:
        self._keyframe_asked = False
        if isinstance(keyframe, ForkedKeyframe):
            try:
                captured = collect(keyframe)
            except KeyframeFailed as failure:
                self._keyframes_failed += 1
                self._in_lock_next = True
                log.warning("%s: no keyframe at %.3f (the next one is captured under the lock)", failure, keyframe.now)
                return
            finally:
                self._child = None
            self._child_cpu_s += captured.cpu_s
            self._child_bytes = max(self._child_bytes, captured.copied_bytes)
        if self.error:
            return
        if self._segment is None or self._segment_full(keyframe.now):
            self._rotate(keyframe.now)
        if isinstance(keyframe, ForkedKeyframe):
            self._append_compressed(
                BlockKind.KEYFRAME, keyframe.now, keyframe.now, 1, captured.raw_len, captured.payload
            )
        else:
            self._append(BlockKind.KEYFRAME, keyframe.now, keyframe.now, 1, keyframe.state)
        if not self.error:
            self._keyframes += 1

    def _segment_full(self, now: float) -> bool:
        """Past `segment_bytes` after its opening keyframe (a keyframe bigger than that would otherwise fill
        every segment alone, and ask for the next keyframe at once), or past `segment_s`."""
        return self._segment is not None and (
            self._segment.size - self._opened_size >= self.segment_bytes
            or now - self._segments[-1][1] >= self.segment_s
        )

    def _append(self, kind: BlockKind, t_first: float, t_last: float, count: int, raw: bytes) -> None:
        if self._segment is not None and not self.error:
            payload = self._segment.compress(kind, raw)
            self._append_compressed(kind, t_first, t_last, count, len(raw), payload)

    def _append_compressed(
        self, kind: BlockKind, t_first: float, t_last: float, count: int, raw_len: int, payload: bytes
    ) -> None:
        """One block of `count` ops, compressed already (`raw_len` bytes before), after making room for it."""
        if self._segment is None or self.error:
            return
        try:
            self._retire(t_last, block_bytes(len(payload)))
            self._bytes += self._segment.append_compressed(kind, t_first, t_last, count, raw_len, payload)
        except OSError as error:
            self._fail(error, count if kind is BlockKind.OPS else 0)
            return
        self._blocks += 1
        self._ops += count if kind is BlockKind.OPS else 0
        if not self._opened_size:  # its first block: the keyframe it opens with, whatever its size
            self._opened_size = self._segment.size
        if not self._keyframe_asked and self._segment_full(t_last):
            self._keyframe_asked = self._want_keyframe = True  # the next keyframe opens a new segment

    def _rotate(self, now: float) -> None:
        """Close the segment being written (if any) and open the next, once the ring has room for its headers."""
        closing, self._segment = self._segment, None
        try:
            if closing is not None:
                closing.close()
        except OSError as error:
            self._fail(error)
            return
        self._opened_size = 0
        self._seq += 1
        path = self.folder / _segment_name(now, self._seq)
        while path.exists():
            self._seq += 1
            path = self.folder / _segment_name(now, self._seq)
        try:
            self._retire(now, SEGMENT_HEADERS)
            self._segment = SegmentWriter(path, now)
        except OSError as error:
            self._fail(error)
            return
        self._segments.append((path, now))
        self._written.append(path)
        self._bytes += SEGMENT_HEADERS

    def _retire(self, now: float, incoming: int) -> None:
        """Delete the oldest segments (never the one being written) beyond `retain_s`, or until `incoming`
        more bytes fit in `max_bytes`."""
        writing = self._segment is not None
        while len(self._segments) > writing:
            path = self._segments[0][0]
            ended = self._segments[1][1] if len(self._segments) > 1 else now  # the next one opened as it ended
            too_old = self.retain_s is not None and now - ended > self.retain_s
            too_big = self.max_bytes is not None and self._bytes + incoming > self.max_bytes
            if not (too_old or too_big):
                return
            size = _size(path) + _size(index_path(path))
            for doomed in (path, index_path(path)):
                doomed.unlink(missing_ok=True)
            self._segments.pop(0)
            self._bytes -= size
            self._deleted += 1

    def _fail(self, error: OSError, dropped: int = 0) -> None:
        """The recording stops (a full disk, a segment the ring could not delete); `dropped`: the ops of the
        block that was not written."""
        self.error = f"recording to {self.folder} stopped: {error.strerror or error}"
        self._dropped += dropped


def cache_folder() -> Path:
    """Where the dashboard's ring goes by default: `$XDG_CACHE_HOME/kvtop/recordings` (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvtop" / "recordings"


def unrelated_files(folder: Path) -> list[str]:
    """The names in `folder` that are no recorder's (segments, their indexes, the lock) when it holds no segment: a
    folder of other files, no recording to continue. [] for a folder absent, empty, or a recording (one segment:
    what a replay asks of a recording folder)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # absent (made), or not readable (the recorder says why)
        return []
    if any(name.endswith(SEGMENT_SUFFIX) for name in names):
        return []
    return [name for name in names if name != LOCK_NAME and not name.endswith(INDEX_SUFFIX)]


def _existing_segments(folder: Path) -> list[tuple[Path, float]]:
    """The segments already in `folder` with the time each was opened (from its name), oldest first."""
    found: list[tuple[Path, float]] = []
    for path in sorted(folder.glob(f"seg-*{SEGMENT_SUFFIX}")):
        stamp = path.name.removeprefix("seg-").partition("-")[0]
        if stamp.isdigit():
            found.append((path, int(stamp) / 1e6))
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _refusals(intake: Intake) -> list[tuple[str, str, float]]:
    """The bootstrap's refusals as a recording keeps them: line, role, time."""
    return [(refused.line, refused.role, refused.at) for refused in intake.bootstrap_refusals]
