"""A rank whose registration was refused, restarted (a new incarnation, listed fine): the views said it `unlisted`
until the new incarnation's first heartbeat, since the first thing a view gets of a new incarnation is its snapshot
(its batches wait for it), and a snapshot kept the earlier incarnation's view, its warning and counts with it."""

from __future__ import annotations

import time

from kvtop.model.cluster import ClusterModel
from kvtop.views.tables import ranks_json
from transport.plane.events import EVENT_SCHEMA, AgentHello, EventBatch, Heartbeat, Snapshot
from transport.wire import AgentInfo

WHY = "bootstrap tcp://10.0.0.1:7000 refused: registration of decode-0/TP0 refused: 10.0.0.9 holds it live"


def test_a_new_incarnations_snapshot_clears_the_earlier_ones_registration_warning() -> None:
    now = time.time()
    first = AgentInfo("decode", "decode-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    again = AgentInfo("decode", "decode-0", 0, 1, 4096, "tcp://10.0.0.3:5", "tcp://10.0.0.3:6", 4400, "node-3", 78)
    model = ClusterModel()
    refused = Heartbeat(now - 5, {"rooms_failed": 9}, 3, 0, 1.0, 1 << 20, 10.0, registration=WHY)
    model.apply(first.label, EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 77, 1, now - 5, [refused]), now - 5)
    hello = AgentHello(now - 1, again, "1.0", "tcp://10.0.0.3:7", "tcp://10.0.0.3:8")
    model.apply(first.label, Snapshot(1, EVENT_SCHEMA, 78, 1, hello, None, [], [], []), now - 1)  # before its heartbeat

    view = model.ranks[first.label]
    (row,) = ranks_json(model, now)
    assert (view.incarnation, view.pid, view.registration, view.inflight) == (78, 4400, "", 0)
    assert row["unlisted"] is None
