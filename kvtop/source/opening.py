"""Open the source a spec names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtop.model.cluster import ClusterModel
    from kvtop.record.writer import Recorder
    from kvtop.source.base import Source
    from kvtop.source.spec import SourceSpec


@contextlib.contextmanager
def open_source(
    spec: SourceSpec,
    model: ClusterModel | None = None,
    synced: bool = True,
    recorder: Recorder | None = None,
    tail: bool = False,
    journal: bool = False,
) -> Iterator[Source]:
    """The source of `spec`, once every agent's snapshot is in (or `spec.wait` passed), the logs were read to
    their end (or to `--at`), the recording was positioned at `--at`, or a dashboard's model answered.

    `model`: the model a live cluster or logs fill (a fresh one by default); `synced=False` hands a live
    source over as soon as its agents are discovered; `recorder` is told everything a live collector applies;
    `tail`: keep the news for `Source.tail()`; `journal`: a recording's model keeps its event journal.
    Raises `SourceError` when what was given cannot be used, `BootstrapError` when the bootstrap address does
    not answer, `ModelUnavailable`/`ModelAmbiguous` when no dashboard's model can be read or several could.
    Closed on the way out.
    """
    kind = spec.kind
    opened: contextlib.AbstractContextManager[Source]
    if kind == "model":  # each kind's module only where it is read: a check loads one
        from kvtop.source.dashboard import DashboardSource

        opened = DashboardSource.opened(spec, tail)
    elif kind == "replay":
        from kvtop.source.recording import RecordingSource

        opened = RecordingSource.opened(spec, tail, journal)
    elif kind == "sglang-log":
        from kvtop.source.logs import LogSource

        opened = LogSource.opened(spec, model, tail)
    else:
        from kvtop.source.live import LiveSource

        opened = LiveSource.opened(spec, model, synced, recorder, tail)
    with opened as source:
        yield source
