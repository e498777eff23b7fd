"""A decode rank's lines that announce failures whose own lines come next: read alone, each is a failure that names
no room (DOMAIN.md); beside the failure lines it announces, it counts nothing twice.

- SGLang's timeout hint, logged once per process just before a decode rank records a room's timeout in
  WaitingForInput (`common/conn.py`, `_check_waiting_timeout`: `logger.warning_once(...)`, then `record_failure`).
  A public report (SGLang issue #9926, 2025-08-31) pasted five ranks' hints and no failure line: `check` said
  UNKNOWN, "no rank named in what was read", where the lines tell five ranks timing out rooms.
- The heartbeat checker's `Lost connection with prefill instance (bootstrap_addr: X), N requests affected`, logged
  after it failed each affected room (`_handle_node_failure`): alone (an excerpt cut after it, or no room in
  flight) `check` said OK while a prefill instance was gone.

The lines below are in the reports' and SGLang 0.5.23's shapes, times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import SGLangLogs

pytestmark = pytest.mark.usefixtures("utc")

HINT = (
    "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean TTFT is "
    "acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the timeout "
    "condition. "
)


def timeout_line(ts: str, tp: int, room: int) -> str:
    return decode_failure(ts, room, f"Request {room} timed out after 300.0s in KVPoll.WaitingForInput", tp, f" EP{tp}")


def write(tmp_path: Path, *lines: str) -> Path:
    log = tmp_path / "decode.log"
    log.write_text("".join(lines))
    return log


def incidents(log: Path) -> list[dict[str, object]]:
    return json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]


def test_hints_alone_are_the_timeouts_of_their_ranks_naming_no_room(tmp_path: Path):
    log = write(tmp_path, *(f"[2026-11-30 07:32:08 TP{tp} EP{tp}] {HINT}\n" for tp in (6, 1, 4)))

    result = kvtop_here("check", "--sglang-log", str(log))
    [incident] = incidents(log)
    ranks = json.loads(kvtop_here("ranks", "--sglang-log", str(log), "--json").stdout)

    assert result.returncode == 2
    assert result.stdout.startswith(
        "KVTOP CRITICAL - incident: the prefill side of decode-0 stopped answering (timeout_waiting) since "
        "07:32:08, 3 failures naming no room; "
    )
    assert (incident["room_count"], incident["roomless"], incident["classes"]) == (0, 3, {"timeout_waiting": 3})
    assert incident["noticed_by"] == {"decode-0/TP1": 1, "decode-0/TP4": 1, "decode-0/TP6": 1}
    assert [rank["label"] for rank in ranks] == ["decode-0/TP1", "decode-0/TP4", "decode-0/TP6"]


def test_the_ranks_own_timeout_line_claims_its_hint(tmp_path: Path):
    log = write(
        tmp_path,
        f"[2026-11-30 07:32:08 TP0 EP0] {HINT}\n",
        timeout_line("2026-11-30 07:32:08", 0, 1234),
        f"[2026-11-30 07:32:09 TP1 EP1] {HINT}\n",
        timeout_line("2026-11-30 07:32:09", 1, 1234),
    )

    [incident] = incidents(log)

    assert (incident["room_count"], incident["roomless"]) == (1, 0)
    assert incident["suspect_text"] == "the prefill side of decode-0"


def test_a_hint_another_ranks_line_follows_is_still_its_own_ranks_timeout(tmp_path: Path):
    """Each rank waits for its own KV: TP1's line records TP1's room, not the one TP0's hint came before."""
    log = write(tmp_path, f"[2026-11-30 07:32:08 TP0 EP0] {HINT}\n", timeout_line("2026-11-30 07:32:08", 1, 1234))

    [incident] = incidents(log)

    assert (incident["room_count"], incident["roomless"]) == (1, 1)
    assert incident["noticed_by"] == {"decode-0/TP0": 1, "decode-0/TP1": 1}


def test_a_followed_log_waits_for_the_line_that_claims_a_hint(tmp_path: Path):
    """Read while it is written: a hint whose line comes in the next read is claimed, never counted alone."""
    log = write(tmp_path, f"[2026-11-30 07:32:08 TP0 EP0] {HINT}\n")
    model = ClusterModel()
    logs = SGLangLogs([log])
    logs.poll(model)
    with log.open("a") as out:
        out.write(timeout_line("2026-11-30 07:32:09", 0, 1234))
        out.write("[2026-11-30 07:32:20 TP0 EP0] Decode batch, #running-req: 0, #prealloc-req: 0\n")
    logs.poll(model, final=True)
    model.update_incidents()

    [incident] = model.incidents.incidents.values()
    assert (incident.room_count, incident.roomless) == (1, 0)


def lost_line(ts: str, affected: int) -> str:
    return (
        f"[{ts} TP0] Lost connection with prefill instance (bootstrap_addr: 10.0.0.6:8998), {affected} requests "
        "affected\n"
    )


def lost_room_line(ts: str, room: int) -> str:
    return decode_failure(ts, room, "Lost connection with prefill instance (bootstrap_addr: 10.0.0.6:8998)")


@pytest.mark.parametrize("affected", [2, 0])
def test_a_lost_prefill_instance_alone_is_an_incident_of_its_address(tmp_path: Path, affected: int):
    """With its rooms' lines cut, or with no room in flight: the instance at that address is gone either way."""
    log = write(tmp_path, lost_line("2026-11-30 10:00:10", affected))

    result = kvtop_here("check", "--sglang-log", str(log))
    [incident] = incidents(log)

    assert result.returncode == 2
    assert result.stdout.startswith(
        "KVTOP CRITICAL - incident: prefill at 10.0.0.6:8998 stopped answering (peer_lost) since 10:00:10, "
        "1 failure naming no room; "
    )
    assert (incident["room_count"], incident["roomless"], incident["evidence"]) == (0, 1, ["decode lost its heartbeat"])


@pytest.mark.parametrize("order", ["rooms-first", "rooms-after"])
def test_the_rooms_lines_claim_the_loss_before_or_after_it(tmp_path: Path, order: str):
    """SGLang fails the rooms, then logs the loss; its scheduler logs each room's line when it polls them."""
    rooms = [lost_room_line("2026-11-30 10:00:10", room) for room in (1111, 2222)]
    lost = lost_line("2026-11-30 10:00:10", 2)
    log = write(tmp_path, *([*rooms, lost] if order == "rooms-first" else [lost, *rooms]))

    [incident] = incidents(log)

    assert (incident["room_count"], incident["roomless"]) == (2, 0)
    assert incident["suspect_text"] == "prefill at 10.0.0.6:8998"


PREFILL_HINT = (
    "Some requests timed out when bootstrapping, which means prefill instances fail to receive the KV indices from "
    "the decode instance of this request. If a greater mean TTFT is acceptable, you can 'export "
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=600' (10 minutes) to relax the timeout condition. "
)


def test_a_prefill_ranks_hint_alone_is_a_bootstrapping_timeout_of_the_decode_side(tmp_path: Path):
    """The prefill's hint (SGLang 0.5.23 `common/conn.py`, once per process before it records a room's timeout in
    Bootstrapping): sglang #20485's abridged paste holds it and a failure line cut from its room; kvtop named only
    the crash that followed. The decode never sent the room's request: its side is the suspect."""
    log = tmp_path / "prefill.log"
    log.write_text(f"[2026-03-13 09:47:58 DP3 TP3 EP3 PP1] {PREFILL_HINT}\n")

    [incident] = incidents(log)

    assert (incident["suspect_text"], incident["class"], incident["roomless"]) == (
        "the decode side of prefill-0",
        "timeout_bootstrap",
        1,
    )


def test_a_prefill_ranks_hint_is_claimed_by_its_rooms_bootstrapping_timeout(tmp_path: Path):
    log = tmp_path / "prefill.log"
    log.write_text(
        f"[2026-03-13 09:47:58 TP3] {PREFILL_HINT}\n"
        "[2026-03-13 09:47:58 TP3] Prefill bootstrap failed for request rank=3 req.rid='p1' req.bootstrap_room=9001 "
        "with exception KVTransferError(bootstrap_room=9001): Request 9001 timed out after 600.0s in "
        "KVPoll.Bootstrapping\n"
    )

    [incident] = incidents(log)

    assert (incident["class"], incident["room_count"], incident["roomless"]) == ("timeout_bootstrap", 1, 0)


def test_a_decode_s_hint_in_a_prefill_s_log_names_no_side_of_it(tmp_path: Path):
    """The hint in a log whose lines are a prefill's (one log of both servers, read as one): it named "the prefill
    side of prefill-0", which is no server; the suspect is unknown, noticed by that log's instance."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-01-02 03:04:30.250 TP0] Prefill bootstrap failed for request rank=0 req.rid='d4p' "
        "req.bootstrap_room=4444 with exception KVTransferError(bootstrap_room=4444): Request 4444 timed out after "
        f"300.0s in KVPoll.Bootstrapping\n[2026-01-02 03:05:30.250 TP0] {HINT}\n"
    )

    suspects = {incident["suspect_text"] for incident in incidents(log)}

    assert suspects == {"the decode side of prefill-0", "unknown (noticed by prefill-0)"}
