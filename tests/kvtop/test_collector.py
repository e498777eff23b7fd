"""The collector never dies of input, and if it dies of a bug, that is loud: logged, kept, and an exit code."""

from __future__ import annotations

import logging

from typer.testing import CliRunner

from kvtop.cli.app import command_line
from kvtop.model.cluster import ClusterModel
from kvtop.sources.live import Collector
from transport.harness.cluster import ClusterSpec

SPEC = ClusterSpec(num_pages=16, page_bytes=4096)


class ModelThatFailsOnce(ClusterModel):
    """A model with a bug that fires on the first delivery only."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def apply(self, label, item, now) -> None:
        if not self.failed:
            self.failed = True
            raise ValueError("a bug in apply")
        super().apply(label, item, now)


def test_a_delivery_the_model_cannot_apply_is_counted_logged_and_the_next_ones_apply(make_cluster, wait_for, caplog):
    """One delivery raising in the model costs that delivery (counted, logged with its traceback), nothing more."""
    cluster = make_cluster(SPEC)
    model = ModelThatFailsOnce()
    collector = Collector(cluster.endpoint, model=model).start()
    try:
        wait_for(lambda: model.intake.counters.get("deliveries_failed") == 1, what="the failed delivery is counted")
        wait_for(
            lambda: len(model.ranks) == 2 and all(view.last_seen for view in model.ranks.values()),
            what="both ranks heard from after the failed delivery",
        )
        assert not collector.died
    finally:
        collector.close()
    [record] = [r for r in caplog.records if r.name == "kvtop.collector"]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "a bug in apply" in str(record.exc_info[1])


def test_a_collector_thread_that_dies_logs_its_traceback_and_status_follow_exits_1(make_cluster, monkeypatch, caplog):
    """A bug that ends the collecting thread is an error with its traceback, and `status --follow` exits 1 with it."""
    cluster = make_cluster(SPEC)

    def broken_sweep(self, now, hold_incidents=False) -> None:
        raise RuntimeError("a bug in sweep")

    monkeypatch.setattr(ClusterModel, "sweep", broken_sweep)
    result = CliRunner().invoke(
        command_line(), ["status", "--bootstrap", cluster.endpoint, "--follow", "--interval", "0.2"]
    )

    assert result.exit_code == 1
    assert "the collector stopped: RuntimeError: a bug in sweep" in result.stderr
    [record] = [r for r in caplog.records if r.name == "kvtop.collector"]
    assert record.levelno == logging.ERROR and "a bug in sweep" in str(record.exc_info[1])
