"""Who misses a rank whose registration fails, in `status`' line and `check`'s finding. The service lists a rank
refused because another client holds its entry apart, as taken, and views given it (or a relay) subscribe to it:
`no peer or new view finds it` was false for that one. Its words now follow the refusal and the rank's source."""

from __future__ import annotations

import time

import msgspec
import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.views.check import Thresholds, evaluate
from kvtop.views.tables import unlisted_lines
from transport.plane.events import EVENT_SCHEMA, AgentHello, EventBatch, Heartbeat
from transport.wire import SGLANG_PLUGIN, AgentInfo

SERVICE = "bootstrap tcp://10.0.0.1:7000 refused: registration of prefill-0/TP0 refused: "
TAKEN = SERVICE + (
    "registered from 10.0.0.3, but incarnation 5 (tcp://10.0.0.9:1) from 10.0.0.9 holds it live; it is taken only "
    "once that expires"
)
MOVED = SERVICE + "event_endpoint: 'tcp://10.0.0.3:1' is not the client's address (from 10.0.0.3)"


def model_of(registration: str, kind: str = "") -> ClusterModel:
    now = time.time()
    info = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://10.0.0.3:1", "tcp://10.0.0.3:2", 4321, "node-3", 7)
    info = msgspec.structs.replace(info, kind=kind)
    hello = AgentHello(now - 1, info, "1.0", "tcp://10.0.0.3:3", "tcp://10.0.0.3:4")
    beat = Heartbeat(now - 1, {}, 0, 0, 1.0, 1 << 20, 10.0, registration=registration)
    model = ClusterModel()
    model.apply(info.label, EventBatch(EVENT_SCHEMA, "prefill", "prefill-0", 0, 7, 1, now - 1, [hello, beat]), now - 1)
    return model


@pytest.mark.parametrize(
    ("registration", "kind", "line", "finding"),
    [
        (
            TAKEN,
            "",
            "another client holds its entry: no peer finds it; new views hear it as taken",
            "another client holds their entry: no peer finds them; new views hear them as taken",
        ),
        (
            MOVED,
            "",
            "its registration fails: no peer or new view finds it",
            "their registration fails: no peer or new view finds them",
        ),
        (
            TAKEN,
            SGLANG_PLUGIN,
            "another client holds its entry: new views hear it as taken",
            "another client holds their entry: new views hear them as taken",
        ),
        (
            MOVED,
            SGLANG_PLUGIN,
            "its registration fails: no new view finds it",
            "their registration fails: no new view finds them",
        ),
    ],
)
def test_status_and_check_say_who_misses_an_unlisted_rank(registration, kind, line, finding) -> None:
    model = model_of(registration, kind)

    [said] = unlisted_lines(model)
    verdict = evaluate(model, Thresholds(), time.time())

    assert said == f"unlisted prefill-0/TP0 ({line}): {registration}"
    assert verdict.summary.startswith(f"ranks unlisted ({finding}): prefill-0/TP0 ({registration})")
