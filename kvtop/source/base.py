"""The one interface every source is read through: its model and lock, its time, whether anyone answered,
and what it gains. Each kind opens as a context manager (`opened`): leaving it closes the source."""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.model.fold import FailureGroup
    from kvtop.source.spec import SourceSpec
    from kvtop.source.when import When
    from kvtop.sources.sglang.context import Context
    from transport.plane.events import Event


@dataclass(frozen=True, slots=True)
class Events:
    """Tail news: events the model accepted, by agent label, in each agent's own order."""

    items: Sequence[tuple[str, Event]]

    @classmethod
    def heard(cls, label: str, events: Sequence[Event], snapshot: bool) -> Events:
        """One delivery of `label`'s: of a snapshot (an agent's memory), what a tail shows of it."""
        from kvtop.views.event_lines import snapshot_events

        return cls([(label, event) for event in (snapshot_events(events) if snapshot else events)])


@dataclass(frozen=True, slots=True)
class Gap:
    """Tail news: `batches` event batches of one agent never arrived (as its collector counted them at `ts`)."""

    label: str
    batches: int
    ts: float


@dataclass(frozen=True, slots=True)
class Said:
    """Tail news: one line for stderr about the source itself (what its model process counted)."""

    text: str


Told = Events | Gap | Said


class Source(ABC):
    """A source, opened: its model (read it under `lock`), judged at `now()`; `start` is where a span read
    starts (the earliest time logs mention, a recording's start; None for a live source)."""

    rooms_named_once_ended = False
    """Whether it names a room only once it ended (a log names a room where it failed): views list those too."""

    def __init__(
        self,
        spec: SourceSpec,
        model: ClusterModel,
        lock: contextlib.AbstractContextManager[object] | None = None,
        start: float | None = None,
    ) -> None:
        self.spec = spec
        self.model = model
        self.lock: contextlib.AbstractContextManager[object] = lock or threading.Lock()
        self.start = start
        self.damage = ""
        """What of the source could not be read, one line ("" when nothing)."""

    @abstractmethod
    def now(self) -> float:
        """The time views judge at: the wall clock, the latest time logs mention (or `--at`), the replayed instant,
        or the instant a dashboard's model was read at."""

    def heard(self) -> bool:
        """Whether the source said anything (logs and recordings always count as heard)."""
        return True

    def silence(self) -> str:
        """The one line a view prints when nobody answered (`heard()` is False)."""
        return ""

    def last_heard(self) -> float | None:
        """When an agent was last heard (wall time; 0.0 before any) for a source that listens to agents; None for
        one that does not (logs, a recording, a dashboard's model)."""
        return None

    def unheard_why(self) -> str:
        """Why no rank is heard, when the relay the source subscribes through says it: its upstream that stopped
        answering it (`Intake.upstream_down`), while ranks it keeps from that upstream are unheard ("" otherwise)."""
        from kvtop.model.shapes import Liveness

        with self.lock:
            unheard = Liveness.UNHEARD in self.model.liveness(self.now()).values()
            return self.model.intake.upstream_down() if unheard else ""

    def waited(self) -> float:
        """How long the source listened before the views read it."""
        return self.spec.wait

    def notes(self) -> list[str]:
        """Lines for stderr once opened: what the logs held, what of a recording is damaged, what a dashboard's
        model process said."""
        return [f"kvtop: {self.damage}"] if self.damage else []

    def said(self) -> list[str]:
        """Lines for stderr about the source since last asked, while it is followed (a followed log gone from its
        path, and there again): a view that follows says them, as a tail does."""
        return []

    def stopped(self) -> str:
        """Why the source stopped for good ("" while it runs: a live collector's error once it died)."""
        return ""

    def feed_error(self) -> str:
        """An error the source's own feed reports, which a check judges ("" when none)."""
        return ""

    def refresh(self) -> None:  # noqa: B027 (a live collector keeps its model current: nothing to do)
        """Bring the model up to date: what logs gained, a dashboard's model asked again (a live collector keeps
        its model current itself)."""

    @abstractmethod
    def tail(self, follow: bool) -> Iterator[list[Told]]:
        """The event tail, chunk by chunk: what the source held from `--since` when opened, then, with `follow`,
        what it gains (each chunk as it arrives) until Ctrl-C."""

    def context_for(self, groups: Sequence[FailureGroup]) -> list[list[Context]] | None:
        """The lines near each failure group: those log sidecars published (None when none did)."""
        from kvtop.sources.sglang.context import published_context

        return published_context(self.model, groups)

    def status_extra(self) -> tuple[str, dict[str, object]]:
        """A line and JSON fields `kvtop status` adds for this source (logs: what they held)."""
        return "", {}

    def nothing_to_judge(self) -> str:
        """Why a check has nothing to judge in what the source read ("" when it has: every live source)."""
        return ""

    def partly_read(self) -> str:
        """What of the source a check could not read although the rest it judges ("" when nothing: live sources)."""
        return ""

    def clocks_differ(self) -> tuple[str, dict[str, float]]:
        """What a check says of the source's clocks (logs whose servers' clocks differ: their times corrected), and
        each such server's offset in seconds ("" and none for live sources: `kvtop.model.clock` corrects ranks)."""
        return "", {}

    def transport_errors(self, since: float, until: float) -> list[Context]:
        """The transfer's own errors its logs hold from `since` to `until` (`is_transport_error`): those log
        sidecars published, earliest first."""
        if not self.model.transport_errors:  # none published (and nothing more to import: a check out of files)
            return []
        from kvtop.sources.sglang.context import published_errors

        return sorted(published_errors(self.model, since, until), key=lambda line: line.ts)

    @property
    def when(self) -> When:
        return self.spec.when

    @property
    def span(self) -> bool:
        """Whether the source is a span read whole (logs, a recording, `--since`), not a live "now"."""
        return self.start is not None or self.when.since is not None

    def window(self, default_s: float) -> float:
        """The view's window: from `--since` to now when given, else `default_s`."""
        return self.when.window(default_s, self.now())

    def span_window(self) -> float:
        """The whole span read, in seconds: from `--since`, else from the source's start, to now."""
        since = self.when.since if self.when.since is not None else self.start
        return max(1.0, self.now() - since) if since is not None else 1.0
