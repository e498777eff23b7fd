"""A live cluster: a collector on a bootstrap address (or a relay) and agent endpoints."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvtop.source.base import Events, Gap, Source, Told
from kvtop.source.errors import SourceError
from kvtop.views.tables import refused_ago

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.record.writer import Recorder
    from kvtop.source.spec import SourceSpec
    from kvtop.sources.live import Collector, News
    from transport.curve import CurveKeys


class LiveSource(Source):
    """What the agents publish, as a collector applies it; `now()` is the wall clock."""

    def __init__(self, spec: SourceSpec, collector: Collector, news: queue.SimpleQueue[News] | None) -> None:
        super().__init__(spec, collector.model, collector.lock)
        self.collector = collector
        self._news = news

    @classmethod
    @contextlib.contextmanager
    def opened(
        cls,
        spec: SourceSpec,
        model: ClusterModel | None = None,
        synced: bool = True,
        recorder: Recorder | None = None,
        tail: bool = False,
        stop: threading.Event | None = None,
    ) -> Iterator[LiveSource]:
        """Once every agent's snapshot is in or `spec.wait` passed (`synced=False`: as soon as the agents are
        discovered); `recorder` is told everything the collector applies; `tail` keeps the news for `tail()`.
        Raises `BootstrapError` when the bootstrap address does not answer (`CallAbandoned` once `stop` is set
        while it waits)."""
        from kvtop.sources.live import Collector

        news: queue.SimpleQueue[News] | None = queue.SimpleQueue() if tail else None
        collector = Collector(spec.bootstrap, list(spec.connect), model, news=news, curve=_curve(spec.curve_keys),
                              recorder=recorder, service=spec.service)  # fmt: skip
        try:
            collector.start(discover_timeout_s=spec.wait, stop=stop)
            if synced:
                collector.wait_synced(spec.wait)
            yield cls(spec, collector, news)
        finally:
            collector.close()

    def now(self) -> float:
        return time.time()

    def heard(self) -> bool:
        return self.collector.heard()

    def last_heard(self) -> float | None:
        return self.collector.last_heard()

    def silence(self) -> str:
        with self.lock:
            unreachable = dict(self.model.intake.unreachable)
            listed = bool(self.model.ranks)
            upstream = self.model.intake.upstream_down()  # why nobody did: said first
            now = time.time()
            refused = self.model.intake.refusal_explaining(now)
        said = refused_ago(refused.line, now - refused.at) if refused else ""
        line = nobody_answered(self.spec.bootstrap, list(self.spec.connect), self.spec.wait, unreachable, said, listed)
        return f"{upstream}; {line}" if upstream else line

    def notes(self) -> list[str]:
        with self.lock:
            return [f"kvtop: skipped {name}: {why}" for name, why in self.model.intake.bad_entries.items()]

    def stopped(self) -> str:
        return self.collector.error if self.collector.died else ""

    def status_extra(self) -> tuple[str, dict[str, object]]:
        """While the bootstrap service (or relay) does not answer its discovery: said, not left to look like ranks
        that went quiet on their own (a relay's upstream that does not answer it is the model's: `status_text`)."""
        from kvtop.sources.live import DISCOVER_EVERY_S

        error = "" if self.collector.died else self.collector.error
        if not error:
            return "", {}
        return f"source  {error}; asked again every {DISCOVER_EVERY_S:g} s", {"source_error": error}

    def tail(self, follow: bool) -> Iterator[list[Told]]:
        """Read once: what arrived until now, and what happened until now that was still on its way (an echo's
        origin in another rank's later batch: `HOLD_S`). Following: each arrival, and nothing every 0.1 s of
        quiet (a view's held events settle meanwhile)."""
        from kvtop.views.settling import HOLD_S

        assert self._news is not None, "opened without tail=True"
        if not follow:
            asked = time.time()
            told = [_told(item) for item in _drained(self._news)]
            yield told + [_happened_by(asked, _told(item)) for item in _arriving(self._news, HOLD_S)]
            return
        while True:
            try:
                news = [_told(self._news.get(timeout=0.1))]
            except queue.Empty:
                news = []
            yield news


def _drained(news: queue.SimpleQueue[News]) -> Iterator[News]:
    with contextlib.suppress(queue.Empty):
        while True:
            yield news.get_nowait()


def _arriving(news: queue.SimpleQueue[News], within_s: float) -> Iterator[News]:
    """What arrives within the next `within_s` seconds."""
    deadline = time.monotonic() + within_s
    with contextlib.suppress(queue.Empty):
        while (left := deadline - time.monotonic()) > 0:
            yield news.get(timeout=left)


def _happened_by(ts: float, told: Told) -> Told:
    """`told` without the events after `ts` (a view read once shows the cluster until it was asked)."""
    if isinstance(told, Events):
        return Events([(label, event) for label, event in told.items if event.ts <= ts])
    return told


def _told(item: News) -> Told:
    from kvtop.sources.live import Lost

    if isinstance(item, Lost):
        return Gap(item.label, item.batches, item.ts)
    return Events.heard(item.label, item.events, item.snapshot)


def _curve(folder: str) -> CurveKeys | None:
    """The CURVE keys a view uses (None without a folder); `SourceError` when they cannot be used."""
    if not folder:
        return None
    from transport.curve import CurveKeys
    from transport.errors import CurveError

    try:
        return CurveKeys.load(folder, serve=False)
    except CurveError as error:
        raise SourceError(f"--curve-keys: {error}") from None


def nobody_answered(
    bootstrap: str,
    connect: list[str],
    wait: float,
    unreachable: dict[str, str],
    refused: str = "",
    listed: bool = True,
) -> str:
    """The one line a view prints when no agent answered within the wait (and, when kvtop could not open
    sockets for some, how many and why: its own limit may be why nobody answered; and `refused`, the latest
    registration the bootstrap service refused lately: a rank refused is why it is not listed). A bootstrap
    address that answered listing no agent (`listed` False) is said so: no agent hung, none is there."""
    if bootstrap and not connect and not listed:
        line = f"no agent listed by {bootstrap} (none registered there, or every one deregistered)"
    else:
        where = ", ".join([*([f"listed by {bootstrap}"] if bootstrap else []), *connect])
        line = f"no agent answered within {wait:g}s ({where})"
    if unreachable:
        line += f"; kvtop could not open a socket for {len(unreachable)} of them: {next(iter(unreachable.values()))}"
    if refused:
        line += f"; the bootstrap service refused {refused}"
    return line
