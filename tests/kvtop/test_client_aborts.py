"""Client aborts from real agents: their own class and count, kept out of the failure rate that `check` judges."""

from __future__ import annotations

import time

import numpy as np

from kvtop.model.cluster import SETTLE_S, ClusterModel
from kvtop.views.check import Thresholds, Verdict, evaluate
from kvtop.views.tables import status_json
from transport import KVPoll, Role, TransferConfig

PAGE_BYTES = 4096
PAGES = np.arange(8, dtype=np.uint32)
CONFIG = TransferConfig(chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
SUCCEEDED = (61, 62, 63)
ABORTED = 64


def test_a_client_abort_is_counted_apart_and_stays_out_of_the_failure_rate(make_manager, subscribe, wait_for):
    """Three rooms succeed and a client aborts one: failure rate 0, one abort (25 %), OK unless --max-abort-rate."""
    prefill = make_manager(Role.PREFILL, "prefill-0", page_bytes=PAGE_BYTES, config=CONFIG)
    decode = make_manager(Role.DECODE, "decode-0", page_bytes=PAGE_BYTES, config=CONFIG)
    labels = [prefill.info.label, decode.info.label]
    events = subscribe([prefill.info, decode.info])
    events.wait_synced(labels)
    senders = {room: prefill.sender(room) for room in (*SUCCEEDED, ABORTED)}
    receivers = {room: decode.receiver(room, "prefill-0") for room in senders}
    for room in SUCCEEDED:
        receivers[room].init(PAGES)
        senders[room].send(PAGES)
    receivers[ABORTED].init(PAGES)
    wait_for(lambda: senders[ABORTED].poll() is KVPoll.WaitingForInput, what="prefill has the aborted room's request")
    receivers[ABORTED].abort()
    handles = [*senders.values(), *receivers.values()]
    wait_for(lambda: all(h.poll() in (KVPoll.Success, KVPoll.Failed) for h in handles), what="every room ended")
    events.wait_flushed(labels)

    model = ClusterModel()
    for delivered in events.deliveries:
        model.apply(delivered.label, delivered.item, time.time())
    now = time.time() + SETTLE_S + 0.5
    model.sweep(now)
    result = evaluate(model, Thresholds(), now)
    capped = evaluate(model, Thresholds(max_abort_rate=0.2), now)
    status = status_json(model, now, 60.0)

    assert [room for room in senders if receivers[room].poll() is KVPoll.Failed] == [ABORTED]
    assert (result.verdict, result.rooms, result.failure_rate, result.aborted, result.abort_rate) == (
        Verdict.OK, 4, 0.0, 1, 0.25,
    )  # fmt: skip
    assert (capped.verdict, capped.problems) == (Verdict.CRITICAL, ["abort rate 25.0% > 20.0%"])
    assert (status["failure_rate"], status["failures"], status["aborted"], status["abort_rate"]) == (0.0, 0, 1, 0.25)
