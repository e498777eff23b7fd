"""One source lifecycle for every headless command: open a live cluster or SGLang logs, read, close."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtop.cli.options import load_curve, open_sglang_logs, require_source

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.live import Collector, News
    from kvtop.sources.sglang import SGLangLogs
    from transport.events import Event


@dataclass
class Opened:
    """A source, opened: its model (read it under `lock`), and the collector or the logs behind it."""

    model: ClusterModel
    collector: Collector | None = None
    logs: SGLangLogs | None = None
    lock: contextlib.AbstractContextManager[object] = field(default_factory=threading.Lock)
    loaded: list[tuple[str, Event]] = field(default_factory=list)
    """What the logs held when opened, in time order (the logs' own event tail)."""

    def now(self) -> float:
        """The time the views judge at: the wall clock, or the latest time the logs mention."""
        return self.logs.now if self.logs is not None else time.time()

    def heard(self) -> bool:
        """Whether the source said anything: some agent answered (logs always count as heard)."""
        return self.collector is None or self.collector.heard()

    def refresh(self) -> list[tuple[str, Event]]:
        """Read what the logs gained, returned in time order (a live collector keeps the model current itself)."""
        if self.logs is None:
            return []
        with self.lock:
            return self.logs.poll(self.model)


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
) -> Iterator[Opened]:
    """The source, once every agent's snapshot is in (or `wait` passed) or the logs were read to their end.

    `model`: the model to fill (a fresh one by default); `synced=False` hands a live source over as soon
    as the agents are discovered (the dashboard shows them arriving); `curve_keys`: a CURVE key folder.

    Raises `BootstrapError` when the bootstrap address does not answer; exit 2 (`typer.Exit`) when a log
    cannot be read or the key folder cannot be used. Closed on the way out, whatever happened.
    """
    from kvtop.model.cluster import ClusterModel
    from kvtop.sources.live import Collector

    require_source(bootstrap, connect, sglang_log)
    if sglang_log:
        logs = open_sglang_logs(sglang_log)
        model = model or ClusterModel()
        try:
            loaded = logs.load(model)
            yield Opened(model, logs=logs, loaded=loaded)
        finally:
            logs.close()
        return
    collector = Collector(bootstrap, connect, model, news=news, curve=load_curve(curve_keys, serve=False))
    try:
        collector.start(discover_timeout_s=wait)
        if synced:
            collector.wait_synced(wait)
        yield Opened(collector.model, collector=collector, lock=collector.lock)
    finally:
        collector.close()


def nobody_answered(bootstrap: str, connect: list[str], wait: float) -> str:
    """The one line a view prints when no agent answered within the wait."""
    where = ", ".join([*([f"listed by {bootstrap}"] if bootstrap else []), *connect])
    return f"no agent answered within {wait:g}s ({where})"
