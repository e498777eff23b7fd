"""A collector given a batch with one record outside its schema keeps the rest and says what it refused, and why,
where rejections are shown: `kvtop status` (text and JSON), the dashboard's health (the model's rejected events),
the exporter."""

from __future__ import annotations

import threading
import time

import msgspec
from prometheus_client import CollectorRegistry, generate_latest

from kvtop.export.metrics import ModelMetrics
from kvtop.sources.live import Collector
from kvtop.views.tables import status_json, status_text
from transport import BootstrapClient, BootstrapServer, KVPoll
from transport.plane.events import Failure, RoomState, TransferDone

LABEL = "prefill-0/TP0"


def test_a_collector_keeps_the_valid_records_of_a_half_bad_batch_and_says_the_one_it_refused(
    make_publisher, bootstrap: BootstrapServer, wait_for
):
    publisher = make_publisher()
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(msgspec.structs.replace(publisher.info, data_endpoint="tcp://127.0.0.1:9"))  # never dialed
    collector = Collector(bootstrap.endpoint).start()
    try:
        assert collector.wait_synced(10.0)
        now = time.time()
        for event in (
            RoomState(now, 1, int(KVPoll.Success), int(KVPoll.Transferring)),
            TransferDone(now, 1, 4096, -0.25),  # 'finished before it started': the engine's old clock bug
            Failure(now, 2, LABEL, "test", "other", "warning", False, LABEL),
        ):
            publisher.emit(event)
        wait_for(lambda: any(f.room == 2 for f in collector.model.failures), 10.0, "the batch's valid records")
        with collector.lock:
            model, now = collector.model, time.time()
            status, text = status_json(model, now, 60.0), status_text(model, now, 60.0)
            registry = CollectorRegistry()
            registry.register(ModelMetrics(model, threading.Lock(), lambda: now))
        exposition = generate_latest(registry).decode()
    finally:
        collector.close()

    assert (1 in model.rooms or 1 in model.finished) and model.gaps == 0
    collector_said = status["collector"]
    assert (status["rejected_events"], status["rejected_frames"], collector_said["records_rejected"]) == (1, 0, 1)
    [(label, refused)] = collector_said["records_refused"].items()
    assert label == LABEL and refused["count"] == 1
    assert refused["latest"].endswith("record 2 of 3 (done.seconds): Expected `float` >= 0.0 - at `$[4]`")
    assert ", 1 events rejected" in text
    assert (
        "collector rejected 1 records outside their schema (the rest of their batches and snapshots kept):\n"
        f"  {LABEL}: 1, latest {refused['latest']}"
    ) in text
    assert "kvtop_events_rejected_total 1.0" in exposition
