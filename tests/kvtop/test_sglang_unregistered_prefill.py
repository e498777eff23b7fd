"""A prefill whose ranks could not register with its own bootstrap server: no decode can find them.

The shape is a public report's (SGLang PR #25125, 2026-05: a small model's prefill ranks register before the
bootstrap server beside them listens, `Prefill instance failed to register to bootstrap server: ... [Errno 111]
Connection refused`, two seconds before `CommonKVBootstrapServer started successfully`; minutes later the client
gives up on a room, `Aborted by AbortReq.`). The fixture's hosts, rids and rooms are made up; `retries.log` is
SGLang's later wording (its retries, then `... after 5 retries`, naming no address). Before, the registration
lines were no lines kvtop knew: the prefill log read as one client abort and `check` said OK.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang" / "unregistered-prefill"
PREFILL = FIXTURES / "prefill.log"
RETRIES = FIXTURES / "retries.log"
ADDRESS = "10.20.0.7:8998"


def incidents(log: Path) -> list[dict[str, object]]:
    return json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]


def test_a_check_is_critical_naming_the_bootstrap_server_the_ranks_could_not_register_with():
    result = kvtop_here("check", "--sglang-log", str(PREFILL))

    assert result.returncode == 2
    assert result.stdout.startswith(
        f"KVTOP CRITICAL - incident: prefill at {ADDRESS} stopped answering (bootstrap_error) since 09:00:03, "
    )


def test_the_registrations_are_one_incident_of_that_server_and_the_abort_stays_the_client_s():
    by_suspect = {incident["suspect_text"]: incident for incident in incidents(PREFILL)}

    unregistered = by_suspect[f"prefill at {ADDRESS}"]
    assert unregistered["suspect"] == {"kind": "instance", "name": ADDRESS, "role": "prefill"}
    assert (unregistered["roomless"], unregistered["room_count"]) == (2, 0)
    assert unregistered["noticed_by"] == {"prefill-0/TP0": 1, "prefill-0/TP1": 1}
    assert unregistered["evidence"][0] == "its ranks could not register with its bootstrap server"
    assert by_suspect["the client"]["rooms"] == [7300000000000000011]


def test_the_give_up_that_names_no_address_suspects_the_prefill_instance_itself():
    """Not "the prefill side of prefill-0" (a side of itself names nothing): the retries before it are no failure
    (a later attempt may register), the give-up is one."""
    [incident] = incidents(RETRIES)

    assert incident["suspect"] == {"kind": "instance", "name": "prefill-0", "role": "prefill"}
    assert (incident["roomless"], incident["first_seen"]) == (1, incident["last_seen"])
    assert incident["evidence"][0] == "its ranks could not register with its bootstrap server"


def test_the_decode_that_asked_it_hears_the_ranks_are_missing_not_that_nobody_answered():
    """SGLang's bootstrap server answers 503 until every rank registered: it answered, its ranks are missing."""
    [incident] = incidents(FIXTURES / "decode.log")

    assert incident["suspect_text"] == "the prefill side of decode-0"
    assert incident["evidence"][0] == "its bootstrap server answered that not all its ranks had registered"


REFUSED = (
    "[2026-07-21 16:30:{s:02d} TP{tp}] Prefill instance failed to register to bootstrap server: HTTPConnectionPool("
    "host='10.31.4.9', port=9120): Max retries exceeded with url: /route (Caused by NewConnectionError('<urllib3."
    "connection.HTTPConnection object at 0x7f0d5a1c3b20>: Failed to establish a new connection: [Errno 111] "
    "Connection refused'))\n"
)
ANSWERED_503 = (
    "[2026-07-21 16:{m:02d}:{s:02d} TP{tp}] Failed to get prefill server info: 503, Prefill server not fully "
    "registered yet (0 workers registered).\n"
)
PREFILL_BATCH = (
    "[2026-07-21 16:30:40 TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0, #bootstrap-req: 0, #inflight-req: 0, input throughput (token/s): 12.50\n"
)


def _write(tmp_path: Path, name: str, text: str) -> list[str]:
    (tmp_path / name).write_text(text)
    return ["--sglang-log", str(tmp_path / name)]


def test_the_decode_s_503_joins_the_one_prefill_s_registration_incident_as_its_echo(tmp_path: Path):
    """Read from both sides it was two incidents: the prefill's address and "the prefill side of decode-0"."""
    prefill = _write(tmp_path, "p.log", REFUSED.format(s=2, tp=0) + REFUSED.format(s=2, tp=1))
    decode = _write(tmp_path, "d.log", "".join(ANSWERED_503.format(m=m, s=7, tp=tp) for m in (31, 33) for tp in (0, 1)))

    result = json.loads(kvtop_here("incidents", *prefill, *decode, "--json").stdout)

    [incident] = result["incidents"]
    assert incident["suspect"] == {"kind": "instance", "name": "10.31.4.9:9120", "role": "prefill"}
    assert (incident["origins"], incident["roomless"], incident["echoes"]) == (2, 2, 4)
    assert incident["noticed_by"] == {"prefill-0/TP0": 1, "prefill-0/TP1": 1}
    assert incident["last_seen"] - incident["first_seen"] == 185.0  # 16:30:02 to the decode's last 503 at 16:33:07


def test_the_decode_s_503_stays_its_own_where_two_prefills_were_read(tmp_path: Path):
    """Which prefill it asked the line does not say: the other's ranks may be the missing ones."""
    prefill = _write(tmp_path, "p.log", REFUSED.format(s=2, tp=0))
    other = _write(tmp_path, "q.log", PREFILL_BATCH)
    decode = _write(tmp_path, "d.log", ANSWERED_503.format(m=31, s=7, tp=0))

    result = json.loads(kvtop_here("incidents", *prefill, *other, *decode, "--json").stdout)

    suspects = sorted(incident["suspect_text"] for incident in result["incidents"])
    assert suspects == ["prefill at 10.31.4.9:9120", "the prefill side of decode-0"]


def test_a_decode_that_names_the_prefill_s_address_echoes_its_registration_incident(tmp_path: Path):
    """SGLang 0.5.9's attempts name the bootstrap server they asked: the same incident, its line an echo of it."""
    prefill = _write(tmp_path, "p.log", REFUSED.format(s=2, tp=0))
    other = _write(tmp_path, "q.log", PREFILL_BATCH)
    decode = _write(
        tmp_path,
        "d.log",
        "[2026-07-21 16:31:07 TP0] Prefill server info not available from 10.31.4.9:9120, retrying (1/20)...\n",
    )

    [incident] = json.loads(kvtop_here("incidents", *prefill, *other, *decode, "--json").stdout)["incidents"]

    assert incident["suspect_text"] == "prefill at 10.31.4.9:9120"
    assert (incident["origins"], incident["echoes"]) == (1, 1)


@pytest.mark.parametrize(
    "asked",
    [
        ANSWERED_503.format(m=29, s=58, tp=0),
        "[2026-07-21 16:29:58 TP0] Prefill server info not available from 10.31.4.9:9120, retrying (1/20)...\n",
    ],
    ids=["503-naming-no-address", "naming-its-address"],
)
def test_a_decode_s_bootstrap_error_read_before_the_registration_incident_joins_it_as_its_echo(
    tmp_path: Path, asked: str
):
    """The decode asked while the prefill's ranks still tried to register, 4 s before they gave up: it was an incident
    of its own ("the prefill side of decode-0"), as read after it is not."""
    prefill = _write(tmp_path, "p.log", REFUSED.format(s=2, tp=0) + REFUSED.format(s=2, tp=1))
    decode = _write(tmp_path, "d.log", asked + ANSWERED_503.format(m=31, s=7, tp=0))

    [incident] = json.loads(kvtop_here("incidents", *prefill, *decode, "--json").stdout)["incidents"]

    assert incident["suspect"] == {"kind": "instance", "name": "10.31.4.9:9120", "role": "prefill"}
    assert (incident["origins"], incident["roomless"], incident["echoes"]) == (2, 2, 2)
    assert incident["noticed_by"] == {"prefill-0/TP0": 1, "prefill-0/TP1": 1}


GAVE_UP = (
    "[2026-07-21 16:30:01 TP0] Prefill register attempt 1/2 failed: [Errno 111] Connection refused\n"
    "[2026-07-21 16:30:02 TP0] Prefill register attempt 2/2 failed: [Errno 111] Connection refused\n"
    "[2026-07-21 16:30:02 TP0] Prefill instance failed to register to bootstrap server after 2 retries\n"
)
ASKED = (
    "[2026-07-21 16:{m:02d}:{s:02d} TP0] Prefill server info not available from 10.31.4.9:9120, retrying (1/20)...\n"
)


@pytest.mark.parametrize("asked", [(29, 58), (31, 7)], ids=["asked-before-the-give-up", "asked-after-it"])
def test_a_decode_naming_the_address_echoes_the_give_up_that_names_none_in_one_read(
    tmp_path: Path, asked: tuple[int, int]
):
    """The prefill's give-up names no address (its instance is the suspect), the decode's error names the address
    the prefill's log can be at: one failure, read in one pass of both files. It was two incidents (`prefill at
    10.31.4.9:9120` beside `prefill-0`): the address was paired with the prefill's log only for a lost connection's
    line, and only after the lines had been applied."""
    prefill = _write(tmp_path, "p.log", GAVE_UP)
    decode = _write(tmp_path, "d.log", ASKED.format(m=asked[0], s=asked[1]))

    [incident] = json.loads(kvtop_here("incidents", *prefill, *decode, "--json").stdout)["incidents"]

    assert incident["suspect"] == {"kind": "instance", "name": "prefill-0", "role": "prefill"}
    assert (incident["origins"], incident["roomless"], incident["echoes"]) == (1, 1, 1)
    assert incident["noticed_by"] == {"prefill-0/TP0": 1}
