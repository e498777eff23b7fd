"""One source lifecycle for every headless command: open a live cluster or SGLang logs, read, close."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import typer

from kvtop.cli.options import fail, load_curve, open_sglang_logs, require_source
from kvtop.cli.when import Past, When

if TYPE_CHECKING:
    from kvtop.attach.client import Attached
    from kvtop.model.cluster import ClusterModel
    from kvtop.record.records import Gapped
    from kvtop.record.replay import Applied, Cursor
    from kvtop.record.writer import Recorder
    from kvtop.sources.live import Collector, News
    from kvtop.sources.sglang import SGLangLogs
    from transport.events import Event


@dataclass(frozen=True)
class ModelChoice:
    """`--model`/`--model-at`: read a running dashboard's model instead of opening a source of one's own."""

    which: str = ""
    """A model process's pid or endpoint; "" for the one that runs (of --bootstrap/--connect, when given)."""
    journal: bool = False
    """Also bring its event journal (`kvtop events`)."""


def model_choice(
    model: bool, model_at: str, past: Past, sglang_log: list[str], journal: bool = False
) -> ModelChoice | None:
    """What `--model`/`--model-at` ask for (None: neither); a usage error beside another source's options."""
    if not model and not model_at:
        return None
    if sglang_log or past.replay or past.given:
        raise typer.BadParameter("--model reads a running dashboard's model as it is now: not with --sglang-log, "
                                 "--replay, --at, --since or --until")  # fmt: skip
    return ModelChoice(model_at, journal)


@dataclass
class Opened:
    """A source, opened: its model (read it under `lock`), and the collector or the logs behind it."""

    model: ClusterModel
    collector: Collector | None = None
    logs: SGLangLogs | None = None
    lock: contextlib.AbstractContextManager[object] = field(default_factory=threading.Lock)
    loaded: list[tuple[str, Event]] = field(default_factory=list)
    """What the logs held from `--since` when opened, asked for with `log_events` (the logs' own event tail)."""
    cursor: Cursor | None = None
    """A recording, positioned at the instant the views read (`--replay`, `--at`)."""
    replayed: list[Applied | Gapped] = field(default_factory=list)
    """What the recording's collector heard from `--since` to `--at` (asked for with `news_since`)."""
    when: When = field(default_factory=When)
    damage: str = ""
    """What of the recording could not be read, one line ("" when nothing)."""
    attached: Attached | None = None
    """A dashboard's model, as its model process last answered (`--model`); `refresh` asks again."""
    attach_wait: float = 0.0
    start: float | None = None
    """Where a span read starts: the earliest time the logs mention, or the recording's start (None: live)."""

    def now(self) -> float:
        """The time the views judge at: the wall clock, the latest time the logs mention (or `--at`), or the
        replayed instant."""
        if self.cursor is not None:
            return self.cursor.time
        if self.attached is not None:
            return self.attached.state.captured_at
        if self.logs is not None:
            return self.logs.now
        return time.time()

    def window(self, default_s: float) -> float:
        """The view's window: from `--since` to now when given, else `default_s`."""
        return self.when.window(default_s, self.now())

    @property
    def span(self) -> bool:
        """Whether the source is a span read whole (logs, a recording, `--since`), not a live "now"."""
        return self.start is not None or self.when.since is not None

    def span_window(self) -> float:
        """The whole span read, in seconds: from `--since`, else from the logs' or recording's start, to now."""
        since = self.when.since if self.when.since is not None else self.start
        return max(1.0, self.now() - since) if since is not None else 1.0

    def heard(self) -> bool:
        """Whether the source said anything: some agent answered (logs and recordings always count as heard)."""
        if self.attached is not None:
            return self.attached.state.heard
        return self.collector is None or self.collector.heard()

    def waited(self, wait: float) -> float:
        """How long the source listened before the views read it (a dashboard's model: since it started)."""
        return self.attached.state.listening_s if self.attached is not None else wait

    def refresh(self) -> list[tuple[str, Event]]:
        """Read what the logs gained, returned in time order (a live collector keeps the model current itself);
        a dashboard's model is asked again (what its journal gained, when asked for, is returned)."""
        if self.attached is not None:
            return self._reattach()
        if self.logs is None:
            return []
        with self.lock:
            return self.logs.poll(self.model)

    def _reattach(self) -> list[tuple[str, Event]]:
        from kvtop.attach.client import fetch

        assert self.attached is not None
        journal = self.attached.state.journal_total if self.attached.with_journal else -1
        self.attached = fetch(self.attached.endpoint, self.attach_wait, journal)
        self.model = self.attached.model
        return journaled(self.attached)


def journaled(attached: Attached) -> list[tuple[str, Event]]:
    """The journal's events a dashboard's model sent, oldest first, by agent label."""
    return [(label, event) for label, batch in attached.journal for event in batch]


@contextlib.contextmanager
def opened(
    bootstrap: str,
    connect: list[str],
    wait: float,
    sglang_log: list[str] | None = None,
    news: queue.SimpleQueue[News] | None = None,
    model: ClusterModel | None = None,
    synced: bool = True,
    curve_keys: str = "",
    past: Past | None = None,
    news_since: bool = False,
    recorder: Recorder | None = None,
    dashboard: ModelChoice | None = None,
    log_events: bool = False,
) -> Iterator[Opened]:
    """The source, once every agent's snapshot is in (or `wait` passed), the logs were read to their end
    (or to `--at`), or the recording was positioned at `--at` (its end by default).

    `model`: the model to fill (a fresh one by default); `synced=False` hands a live source over as soon
    as the agents are discovered (the dashboard shows them arriving); `curve_keys`: a CURVE key folder.
    `past`: a recording to replay, and the instant and window to read (`--replay`, `--at`, `--since`);
    `news_since`: also collect what the recording's collector heard from `--since` to `--at`
    (`Opened.replayed`, for an event tail); `recorder`: told everything a live collector applies (the
    dashboard's ring); `dashboard`: read a running dashboard's model instead (`--model`), the one of
    `bootstrap`/`connect` when given, within `wait`; `log_events`: also keep the logs' events from `--since`
    (`Opened.loaded`: every other view reads the model alone, so a big log streams through it).

    Raises `BootstrapError` when the bootstrap address does not answer; `ModelUnavailable` or
    `ModelAmbiguous` (kvtop.attach.client) when no dashboard's model can be read or several could; exit 2
    (`typer.Exit`) when a log or a recording cannot be read, `--at` lies outside the recording, or the key
    folder cannot be used. Closed on the way out.
    """
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.live import Collector

    if dashboard is not None:
        yield _attached(dashboard, bootstrap, connect, wait)
        return
    past = past or Past()
    require_source(bootstrap, connect, sglang_log, past.replay)
    if past.replay:
        yield _replayed(past, model.journaling if model is not None else False, news_since)
        return
    if sglang_log:
        logs = open_sglang_logs(sglang_log)
        logs.until = past.when.at
        model = model or ClusterModel()
        try:
            loaded: list[tuple[str, Event]] = []
            if log_events:
                loaded = _events_since(logs.stream(model), past.when.since)
            else:
                logs.load(model)
            yield Opened(model, logs=logs, loaded=loaded, when=past.when, start=logs.start or logs.now)
        finally:
            logs.close()
        return
    curve = load_curve(curve_keys, serve=False)
    collector = Collector(bootstrap, connect, model, news=news, curve=curve, recorder=recorder)
    try:
        collector.start(discover_timeout_s=wait)
        if synced:
            collector.wait_synced(wait)
        yield Opened(collector.model, collector=collector, lock=collector.lock)
    finally:
        collector.close()


def _events_since(polls: Iterable[list[tuple[str, Event]]], since: float | None) -> list[tuple[str, Event]]:
    """The events the polls applied from `since` on (all of them when None)."""
    return [item for applied in polls for item in applied if since is None or item[1].ts >= since]


def _attached(choice: ModelChoice, bootstrap: str, connect: list[str], wait: float) -> Opened:
    """A running dashboard's model, as its model process answers within `wait`."""
    from kvtop.attach.client import choose, fetch

    attached = fetch(choose(choice.which, bootstrap, tuple(connect)), wait, 0 if choice.journal else -1)
    return Opened(attached.model, attached=attached, attach_wait=wait)


def _replayed(past: Past, journal: bool, news_since: bool) -> Opened:
    """A recording positioned at `--at` (or its end); exit 2 with one line when it cannot be read."""
    from kvtop.model.cluster import JOURNAL_EVENTS_KEPT
    from kvtop.record.format import RecordingError
    from kvtop.record.replay import Replay
    from kvtop.views.times import stamp

    try:
        replay = Replay(past.replay, JOURNAL_EVENTS_KEPT if journal else 0)
    except (RecordingError, OSError) as error:
        raise fail(f"cannot read the recording: {error}", 2) from None
    start, end = replay.start, replay.end
    at = end if past.when.at is None else past.when.at
    span = f"{stamp(start, dated=True)} to {stamp(end, dated=True)}"
    if not start <= at <= end:
        raise fail(f"--at {stamp(at, dated=True)} is outside the recording ({span})", 2)
    if past.when.since is not None and past.when.since > at:
        raise fail(f"--since {stamp(past.when.since, dated=True)} is after the instant read (recording: {span})", 2)
    if news_since:
        cursor = replay.at(max(start, past.when.since or start))
        heard = cursor.advance(at)
    else:
        cursor, heard = replay.at(at), []
    damage = replay.recording.damage.summary()
    if cursor.inexact:
        damage = (damage + "; " if damage else "") + "ops were lost before this instant: the model may be incomplete"
    return Opened(cursor.model, cursor=cursor, replayed=heard, when=past.when, damage=damage, start=start)


def nobody_answered(bootstrap: str, connect: list[str], wait: float, unreachable: dict[str, str]) -> str:
    """The one line a view prints when no agent answered within the wait (and, when kvtop could not open
    sockets for some, how many and why: its own limit may be why nobody answered)."""
    where = ", ".join([*([f"listed by {bootstrap}"] if bootstrap else []), *connect])
    line = f"no agent answered within {wait:g}s ({where})"
    if unreachable:
        line += f"; kvtop could not open a socket for {len(unreachable)} of them: {next(iter(unreachable.values()))}"
    return line
