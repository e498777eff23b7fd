"""The live dashboard's source as the model process opens it: a collector, the ring it records, the exporter.

`kvtop top --bootstrap/--connect` and bare `kvtop` run their collector, recorder and `--export` server in the
model process (`kvtop.tui.model_server`), so that ingest and the dashboard's paint do not share one
interpreter lock; the dashboard's process keeps the terminal, the embedded cluster's agents and the rewind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import typer

from kvtop.cli.export_cmd import exporting
from kvtop.record.dashboard import RecordChoice, dashboard_recording
from kvtop.tui.model_server import ModelStartError, ServedModel


@dataclass(frozen=True)
class LiveModel:
    """A collector on `bootstrap` and `connect` (as `kvtop top`'s), recording as `record` says, its model also
    served as Prometheus metrics on `export` ("" serves none; `kind` names the source there)."""

    bootstrap: str
    connect: tuple[str, ...] = ()
    wait: float = 2.0
    curve_keys: str = ""
    record: RecordChoice = field(default_factory=RecordChoice)
    export: str = ""
    kind: str = "bootstrap"
    service: str = "bootstrap"
    """What `bootstrap` was given as (`bootstrap`, `relay`): what its errors call it."""

    def _named(self) -> str:
        """The source in a few words, for the advert other commands find the model by (`bootstrap tcp://...`)."""
        more = f" (+{len(self.connect) - 1} more)" if len(self.connect) > 1 else ""
        return " ".join([self.kind, self.bootstrap or (self.connect[0] + more if self.connect else "")])

    def open(self, stack: contextlib.ExitStack) -> ServedModel:
        from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
        from kvtop.source import SourceError, SourceSpec
        from kvtop.source.live import LiveSource
        from transport.errors import BootstrapError

        spec = SourceSpec(
            self.bootstrap, self.connect, wait=self.wait, curve_keys=self.curve_keys, service=self.service
        )
        try:
            recording = stack.enter_context(dashboard_recording(self.record))
            recorder = recording.recorder
            live = LiveSource.opened(spec, ClusterModel(JOURNAL_EVENTS_KEPT), synced=False, recorder=recorder)
            try:
                source = stack.enter_context(live)
            except (SourceError, BootstrapError):
                if recorder is not None:  # it never reached the cluster: a run of no agent at the ring's end hid
                    recorder.discard()  # the runs before it from a replay read at its end
                raise
            stack.enter_context(exporting(self.export, source.model, source.lock, self.kind))
        except typer.Exit as said:  # its line is on stderr already
            raise ModelStartError("", said.exit_code) from None
        except SourceError as error:
            raise ModelStartError(str(error), error.code) from None
        except BootstrapError as error:
            raise ModelStartError(str(error)) from None
        collector = source.collector
        return ServedModel(
            collector.model,
            collector.lock,
            error=lambda: collector.error,
            recorder_error=lambda: recorder.error if recorder is not None else "",
            warnings=(recording.warning,) if recording.warning else (),
            record_folder=str(recording.folder) if recorder is not None else "",
            heard=collector.heard,
            synced=collector.synced,
            source=self._named(),
            bootstrap=self.bootstrap,
            connect=self.connect,
        )
