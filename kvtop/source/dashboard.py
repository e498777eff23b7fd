"""A running dashboard's model (`--model`), as its model process answers; asked again on refresh."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvtop.source.base import Events, Said, Source, Told

if TYPE_CHECKING:
    from kvtop.attach.client import Attached
    from kvtop.source.spec import SourceSpec

ASK_EVERY_S = 1.0
"""A followed tail asks the model process again this often (each ask costs it a keyframe)."""


class DashboardSource(Source):
    """The model a dashboard's model process sent; `now()` is the instant it was read at."""

    def __init__(self, spec: SourceSpec, attached: Attached) -> None:
        super().__init__(spec, attached.model)
        self.attached = attached
        self._gaps_said = 0

    @classmethod
    @contextlib.contextmanager
    def opened(cls, spec: SourceSpec, tail: bool = False) -> Iterator[DashboardSource]:
        """The dashboard's model as it answers within `spec.wait`; `tail` also brings its event journal.
        Raises `ModelUnavailable` or `ModelAmbiguous` (kvtop.attach.errors) when none or several could be read."""
        from kvtop.attach.client import choose, fetch

        assert spec.dashboard is not None
        endpoint = choose(spec.dashboard.which, spec.bootstrap, spec.connect)
        yield cls(spec, fetch(endpoint, spec.wait, 0 if tail else -1))

    def now(self) -> float:
        return self.attached.state.captured_at

    def heard(self) -> bool:
        return self.attached.state.heard

    def silence(self) -> str:
        state = self.attached.state
        return f"no agent answered the dashboard's model ({state.source}) in its {state.listening_s:.0f}s"

    def waited(self) -> float:
        return self.attached.state.listening_s

    def notes(self) -> list[str]:
        """Its source's error, and the asks its model process refused (counted)."""
        state, lines = self.attached.state, []
        if state.error:
            lines.append(f"kvtop: the dashboard's source: {state.error}")
        if state.refused:
            counts = ", ".join(f"{reason} {count}" for reason, count in sorted(state.refused.items()))
            lines.append(f"kvtop: the dashboard's model refused {sum(state.refused.values())} asks ({counts})")
        return lines

    def feed_error(self) -> str:
        error = self.attached.state.error
        return f"the dashboard's source: {error}" if error else ""

    def refresh(self) -> None:
        """Ask again (bringing what the journal gained, when it was asked for); the model is swapped under the
        lock. Raises `ModelUnavailable` once it does not answer."""
        from kvtop.attach.client import fetch

        journal = self.attached.state.journal_total if self.attached.with_journal else -1
        attached = fetch(self.attached.endpoint, self.spec.wait, journal)
        with self.lock:
            self.attached, self.model = attached, attached.model

    def tail(self, follow: bool) -> Iterator[list[Told]]:
        """The journal's events, then (following) what it gains; lost batches counted as the model counts them."""
        while True:
            yield self._news()
            if not follow:
                return
            time.sleep(ASK_EVERY_S)
            self.refresh()

    def _news(self) -> list[Told]:
        told: list[Told] = [Events([(label, event) for label, batch in self.attached.journal for event in batch])]
        if self.model.gaps > self._gaps_said:
            lost = self.model.gaps - self._gaps_said
            told.append(Said(f"kvtop: {lost} event batches lost (counted by the dashboard's model)"))
            self._gaps_said = self.model.gaps
        if not self.attached.state.journaling:
            told.append(Said("kvtop: the dashboard's model keeps no event journal"))
        return told
