"""A bootstrap server a decode rank could not reach: a failure that names no room, so an incident of its address.

The fixture's first lines are a public report's (SGLang issue #9266, 2025-08-29: a decode server's
`Error fetching prefill parallel info from bootstrap: HTTPConnectionPool(host=..., port=30089): Max retries
exceeded ...`); I repeated the error on a second rank and 30 s later, and added a batch line and the loss of
that prefill instance with two rooms in the shapes SGLang prints. DOMAIN.md: failures that name no room
"belong to an incident of their address, never to a made-up room"; `check` said OK on the error alone before
(the line was a hint, and hints are context).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.record.keyframes import capture, restore
from kvtop.sources.sglang import SGLangLogs, load
from transport.plane.events import LogContext

pytestmark = pytest.mark.usefixtures("utc")

DECODE = Path(__file__).parent / "fixtures" / "sglang" / "bootstrap-unreachable" / "decode.log"
ADDRESS = "sglang-deploy-glm-4-5-prefill:30089"


def incidents(*logs: Path) -> list[dict[str, object]]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    return json.loads(kvtop_here("incidents", *args, "--json").stdout)["incidents"]


def test_a_check_is_critical_naming_the_address_that_did_not_answer():
    result = kvtop_here("check", "--sglang-log", str(DECODE))

    assert result.returncode == 2
    assert result.stdout.startswith(
        f"KVTOP CRITICAL - incident: prefill at {ADDRESS} stopped answering (bootstrap_error) since 11:56:51, "
        "2 rooms and 3 failures naming none; "
    )


def test_one_incident_holds_the_failures_that_named_no_room_and_the_rooms_lost_at_that_address():
    """One cause: the bootstrap server did not answer, then decode lost the instance at that address."""
    [incident] = incidents(DECODE)

    assert incident["suspect"] == {"kind": "instance", "name": ADDRESS, "role": "prefill"}
    assert (incident["room_count"], incident["roomless"], incident["origins"]) == (2, 3, 5)
    assert incident["classes"] == {"bootstrap_error": 3, "peer_lost": 2}
    assert incident["noticed_by"] == {"decode-0/TP0": 4, "decode-0/TP1": 1}
    assert incident["evidence"][0] == "its bootstrap server did not answer"


def test_failures_says_how_many_failures_named_no_room():
    """`failures` lists rooms' failure groups: the failures without one are counted in its last line."""
    result = kvtop_here("failures", "--sglang-log", str(DECODE))

    assert "2 failures, 0 client aborts, 3 failures naming no room (in the incidents above)" in result.stderr


def test_the_error_alone_is_critical_too(tmp_path: Path):
    """Before any room failed (it said OK): each failure that named no room counts as a room against
    --incident-rooms."""
    log = tmp_path / "decode.log"
    log.write_text("".join(line for line in DECODE.read_text().splitlines(keepends=True) if "11:57:30" not in line))

    result = kvtop_here("check", "--sglang-log", str(log))

    assert result.returncode == 2 and ", 3 failures naming no room; " in result.stdout


def test_a_bootstrap_error_that_names_no_address_suspects_the_prefill_side(tmp_path: Path):
    log = tmp_path / "decode.log"
    log.write_text("[2025-08-29 11:56:51 TP0] Error querying dp_ranks from bootstrap: connection refused\n")

    [incident] = incidents(log)

    assert incident["suspect_text"] == "the prefill side of decode-0"


def test_a_sidecar_publishes_it_once_as_its_rank_s_event_and_a_keyframe_keeps_the_incident():
    logs = SGLangLogs([DECODE])
    logs.fresh_context = []
    events = logs.poll(None, final=True)
    logs.close()
    published = [(label, event.kind) for label, event in events if isinstance(event, LogContext)]
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    load([DECODE], model)

    restored = restore(capture(model), JOURNAL_EVENTS_KEPT)

    assert published == [(f"decode-0/TP{tp}", "bootstrap_error") for tp in (0, 1, 0)]
    assert all(context.kind != "bootstrap_error" for context in logs.fresh_context)
    assert [incident.roomless for incident in restored.incidents.incidents.values()] == [3]


def test_a_bootstrap_address_that_did_not_parse_is_no_server_that_stopped_answering(tmp_path: Path):
    """SGLang issue #6017's line: the request's bootstrap port was None, so nothing was asked; the suspect is
    unknown (DOMAIN.md: say so rather than guess), not the prefill side."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2025-05-12 06:55:21 DP1 TP1] Error fetching prefill parallel info from bootstrap: Failed to parse: "
        "http://192.168.80.184:None/route?engine_rank=-1&target_dp_group=-1\n"
    )

    [incident] = incidents(log)

    assert (incident["suspect_text"], incident["kind"]) == ("unknown (noticed by decode-0)", "failing")
    assert incident["evidence"] == ["its bootstrap address did not parse"]
