"""A running view of a rank whose entry another client took: the listing names the taker's entry under the rank's
label at every discovery. The view made the rank's view anew as the taker's (never heard: gone) each time, and the
rank's next batch made it anew again: its state flickered to gone and its counts started over every 2 s."""

from __future__ import annotations

import time

import msgspec

from kvtop.model.cluster import ClusterModel
from kvtop.model.shapes import Liveness
from transport.plane.events import EVENT_SCHEMA, AgentHello, EventBatch, Heartbeat
from transport.wire import AgentInfo


def test_a_listed_entry_of_another_incarnation_leaves_the_view_of_a_rank_heard_alive() -> None:
    now = time.time()
    own = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    taker = msgspec.structs.replace(own, data_endpoint="tcp://10.0.0.9:1", host="elsewhere", pid=1, incarnation=5)
    model = ClusterModel()
    hello = AgentHello(now - 1, own, "1.0", "tcp://10.0.0.3:3", "tcp://10.0.0.3:4")
    beat = Heartbeat(now - 1, {"rooms_ok": 12}, 2, 0, 1.0, 1 << 20, 10.0, registration="refused: taken")
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 1, [hello, beat]), now - 1)

    model.register(taker)

    view = model.ranks[own.label]
    assert (view.incarnation, view.host, view.pid, view.counters, view.inflight) == (
        77,
        "node-3",
        4321,
        {"rooms_ok": 12},
        2,
    )
    assert view.liveness(now) is Liveness.ALIVE and view.registration == "refused: taken"


def test_a_listed_new_incarnation_replaces_a_view_gone_quiet() -> None:
    """A restart the view did not hear yet (its old incarnation silent past `STALE_S`) is listed as before."""
    now = time.time()
    own = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 77)
    model = ClusterModel()
    model.apply(own.label, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 9, []), now - 9)
    model.sweep(now)

    model.register(msgspec.structs.replace(own, pid=4400, incarnation=78))

    assert (model.ranks[own.label].incarnation, model.ranks[own.label].pid) == (78, 4400)


def test_a_rank_heard_as_taken_and_then_under_its_own_label_is_one_view() -> None:
    """While another client holds its entry a rank is heard under `prefill-0/TP0~taken`, beside the taker's view;
    once it holds its entry again its batches come under its own label, and the taken view of it goes (it left a
    second row, gone, for good)."""
    now = time.time()
    taken, plain = "prefill-0/TP0~taken", "prefill-0/TP0"
    model = ClusterModel()
    model.apply(taken, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 1, now - 2, []), now - 2)
    model.apply(plain, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 5, 1, now - 2, []), now - 2)
    assert {label: view.incarnation for label, view in model.ranks.items()} == {taken: 77, plain: 5}
    assert (model.ranks[taken].instance, model.ranks[taken].rank) == ("prefill-0", 0)

    model.apply(plain, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 77, 2, now - 1, []), now - 1)

    assert {label: view.incarnation for label, view in model.ranks.items()} == {plain: 77}
