"""SGLang server logs: read to their end (or to `--at`) when opened, followed as they grow."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from kvtop.source.base import Events, Said, Source, Told
from kvtop.source.errors import SourceError

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.model.fold import FailureGroup
    from kvtop.source.spec import SourceSpec
    from kvtop.source.when import When
    from kvtop.sources.sglang import SGLangLogs
    from kvtop.sources.sglang.context import Context
    from transport.plane.events import Event

POLL_S = 0.25
"""A followed tail reads what the logs gained this often."""


class LogSource(Source):
    """The model the logs' lines build; `now()` is the latest time they mention (or `--at`)."""

    rooms_named_once_ended = True

    def __init__(
        self, spec: SourceSpec, logs: SGLangLogs, model: ClusterModel, loaded: list[tuple[str, Event]]
    ) -> None:
        super().__init__(spec, model, start=logs.start or logs.now)
        self.logs = logs
        self._loaded = loaded
        from kvtop.sources.sglang.missing import MissingPaths

        self._missing = MissingPaths([file.spec.path for file in logs.files])
        self.shown: Callable[[str], str] = str
        """A line for the user with a log piped in named `stdin`, not its temporary copy's path."""

    @classmethod
    @contextlib.contextmanager
    def opened(cls, spec: SourceSpec, model: ClusterModel | None = None, tail: bool = False) -> Iterator[LogSource]:
        """The logs read into `model` (a fresh one by default); `tail` also keeps their events from `--since`
        for `tail()` (every other view reads the model alone, so a big log streams through it). SourceError when
        nothing was read from any file and some file is no SGLang server log."""
        from kvtop.source.stdin import spooled
        from kvtop.sources.sglang import SGLangLogs

        with spooled(spec.sglang_log) as (paths, shown):
            try:
                logs = SGLangLogs(list(paths))
            except OSError as error:
                raise SourceError(f"cannot read an SGLang log: {error}") from None
            with cls._read(spec, logs, model, tail) as source:
                source.shown = shown
                yield source

    @classmethod
    @contextlib.contextmanager
    def _read(cls, spec: SourceSpec, logs: SGLangLogs, model: ClusterModel | None, tail: bool) -> Iterator[LogSource]:
        """`opened`, once the files are named."""
        from kvtop.model.cluster import ClusterModel

        logs.until = spec.when.at
        model = model or ClusterModel()
        try:
            loaded: list[tuple[str, Event]] = []
            if tail:
                loaded = _events_since(logs.stream(model), spec.when.since)
            else:
                logs.load(model)
            stats = logs.stats()
            if stats.no_log:  # a wrong path: said, not shown as a cluster with nothing in it
                raise SourceError(f"nothing to read in the logs given: {stats.unread_text()}")
            _within(spec.when, logs.told_span)
            yield cls(spec, logs, model, loaded)
        finally:
            logs.close()

    def now(self) -> float:
        return self.logs.now

    def notes(self) -> list[str]:
        return [self.shown(self.logs.stats().summary())]

    def refresh(self) -> None:
        self._poll()

    def said(self) -> list[str]:
        return self._missing.news()

    def _poll(self) -> list[tuple[str, Event]]:
        with self.lock:
            return self.logs.poll(self.model)

    def tail(self, follow: bool) -> Iterator[list[Told]]:
        yield [Events(self._loaded)]
        while follow:
            time.sleep(POLL_S)
            yield [Events(self._poll()), *(Said(line) for line in self.said())]

    def context_for(self, groups: Sequence[FailureGroup]) -> list[list[Context]] | None:
        return self.logs.context_for(groups)

    def nothing_to_judge(self) -> str:
        """Every log given was empty: a check has nothing to judge (a view shows the empty cluster, and a
        followed log may grow)."""
        stats = self.logs.stats()
        return self.shown(f"nothing to read in the logs given: {stats.unread_text()}") if stats.nothing_read else ""

    def partly_read(self) -> str:
        """Some logs given held nothing kvtop reads (an empty file, no SGLang server log: silence is no health), some
        were read only up to damage (a gzip cut short: what came after is unknown), some ended in a line without its
        newline (copied while written: that line not read), or one holds two servers' lines (read as one)."""
        stats = self.logs.stats()
        found = [f"a log holds both servers' lines: {mixed}" for mixed in stats.mixed]
        if stats.cut:
            found.insert(0, f"last line cut: not read in {'; '.join(stats.cut)}")
        damaged = [d for d in stats.damaged if not any(d.startswith(f"{path}: ") for path in stats.unread)]
        if damaged:  # one damaged before its first line is among those nothing was read from
            found.insert(0, f"{len(damaged)} of the logs read only up to damage: {'; '.join(damaged)}")
        if stats.unread and not stats.nothing_read:
            found.insert(
                0, f"nothing read from {len(stats.unread)} of the {stats.files} logs given: {stats.unread_text()}"
            )
        return self.shown("; ".join(found))

    def clocks_differ(self) -> tuple[str, dict[str, float]]:
        """The logs' servers whose clocks differ (times corrected) or stepped back, and the offsets corrected."""
        stats = self.logs.stats()
        corrected = {name: clock.offset_s for name, clock in stats.clocks.items() if clock.corrected}
        return "; ".join(stats.clock_findings()), corrected

    def transport_errors(self, since: float, until: float) -> list[Context]:
        return sorted((line for line in self.logs.errors if since <= line.ts <= until), key=lambda line: line.ts)

    def status_extra(self) -> tuple[str, dict[str, object]]:
        stats = self.logs.stats()
        clocks = [f"\nclock   {line}" for line in stats.clock_lines()]
        line = self.shown(f"logs    {stats.summary(clocks=False).removeprefix('sglang logs: ')}" + "".join(clocks))
        return line, {"logs": dataclasses.asdict(stats)}


def _within(when: When, span: tuple[float, float] | None) -> None:
    """SourceError when `--at` lies outside the span the logs' lines tell, or `--since` after what is read: a view
    of a window the logs do not cover would judge nothing (a check said OK on logs full of failures)."""
    from kvtop.source.when import on_their_day
    from kvtop.views.times import stamp

    if span is None or (when.at is None and when.since is None):
        return
    start, end = span
    told = f"the logs' lines run from {stamp(start, dated=True)} to {stamp(end, dated=True)}"
    if when.at is not None and not start <= when.at <= end:
        hint = on_their_day("--at", when.at, start, end)
        raise SourceError(f"--at {stamp(when.at, dated=True)} is outside what the logs tell: {told}{hint}")
    if when.since is not None and when.since > (end if when.at is None else when.at):
        hint = on_their_day("--since", when.since, start, end if when.at is None else when.at)
        raise SourceError(f"--since {stamp(when.since, dated=True)} is after what the logs tell: {told}{hint}")


def _events_since(polls: Iterable[list[tuple[str, Event]]], since: float | None) -> list[tuple[str, Event]]:
    """The events the polls applied from `since` on (all of them when None)."""
    return [item for applied in polls for item in applied if since is None or item[1].ts >= since]
