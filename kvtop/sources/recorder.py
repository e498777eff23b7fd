"""What the collector tells a recorder (kvtop.record's `Recorder` is one): each thing it does to the model."""

from __future__ import annotations

from typing import Protocol

from kvtop.model.cluster import ClusterModel
from transport.plane.events import EventBatch, Snapshot
from transport.wire import AgentInfo


class CollectorRecorder(Protocol):
    """Told, in order, everything the collector does to the model, so a reader can do it again."""

    def delivered(
        self, label: str, item: Snapshot | EventBatch, now: float, frame: bytes = b"", refused: int = 0
    ) -> None:
        """A delivery applied at `now`; `frame`: the frame a batch came in, or empty; `refused`: records of it the
        subscriber left out (counted in the model's rejected events)."""

    def swept(self, now: float, held: bool = False) -> None:
        """The model retired its finished rooms at `now` (`held`: and left the incidents alone)."""

    def registered(self, agent: AgentInfo, now: float) -> None:
        """An agent the bootstrap named was added to the model."""

    def expected(self, label: str, now: float) -> None:
        """An endpoint the collector was told of, not heard yet."""

    def forgot(self, label: str, now: float) -> None:
        """An endpoint the collector stopped waiting for."""

    def gapped(self, label: str, incarnation: int, batches: int, now: float) -> None:
        """`batches` batches of a rank's incarnation that never came."""

    def accounted(self, model: ClusterModel, now: float) -> None:
        """The collector's account (its intake counters) at `now`."""

    def tick(self, model: ClusterModel, now: float) -> None:
        """The end of one collector pass."""
