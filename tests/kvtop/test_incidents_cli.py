"""`kvtop incidents` and `kvtop check` name what broke: on SGLang logs of a dead decode instance and of a lost
prefill instance, and live, on clusters of real agents with a corrupting rank, a rank that dies and a rank
that is stopped (SIGSTOP) under load."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from cluster_support import Running
from kvtop_cli import kvtop

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("utc")]

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"


def logs(name: str) -> list[str]:
    return [arg for path in sorted((FIXTURES / name).glob("*.log")) for arg in ("--sglang-log", str(path))]


def incidents(*args: str) -> list[dict[str, Any]]:
    result = kvtop("incidents", "--json", *args)
    assert result.returncode == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)["incidents"]
    return found


def test_a_dead_decode_instance_is_one_incident_of_the_decode_side_not_one_origin_per_room():
    """26 Bootstrapping timeouts over five minutes on both prefill ranks: one incident, the decode side of
    prefill-0 its suspect, every room listed; check exits 2 naming it."""
    found = incidents(*logs("decode-gone"))
    check = kvtop("check", *logs("decode-gone"))

    assert [(i["suspect"], i["kind"], i["class"], i["room_count"]) for i in found] == [
        ({"kind": "side", "name": "prefill-0", "role": "decode"}, "unresponsive", "timeout_bootstrap", 26)
    ]
    assert (len(found[0]["rooms"]), found[0]["origins"], found[0]["echoes"]) == (26, 26, 26)
    assert check.returncode == 2
    assert check.stdout.startswith(
        "KVTOP CRITICAL - incident: the decode side of prefill-0 stopped answering (timeout_bootstrap) since "
        "14:22:41, 26 rooms;"
    )


@pytest.mark.parametrize("name", ["lost-prefill", "losing-prefill"])
def test_a_lost_prefill_instance_is_one_incident_of_the_prefill_at_its_bootstrap_address(name: str):
    """`Lost` (0.5.23) or `Losing` (early 2026) connection with prefill instance (bootstrap_addr: X), then a
    failure per affected room on both decode ranks: one incident, suspect the prefill instance at X."""
    found = incidents(*logs(name))

    assert [(i["suspect"], i["suspect_text"], i["class"], i["room_count"]) for i in found] == [
        ({"kind": "instance", "name": "10.0.0.5:8998", "role": "prefill"}, "prefill at 10.0.0.5:8998", "peer_lost", 5)
    ]


def test_a_check_from_just_after_an_incident_s_last_room_still_judges_it_under_way():
    """The prefill at 10.0.0.5:8998 stops answering at 09:00:32 and never comes back: `check --since 09:00:33` said
    OK (no room failed in its window), though the incident was under way; one within a quiet gap of `--since` counts."""
    check = kvtop("check", *logs("lost-prefill"), "--since", "2026-03-05 09:00:33")

    assert check.returncode == 2
    assert check.stdout.startswith("KVTOP CRITICAL - incident: prefill at 10.0.0.5:8998 stopped answering")


def test_a_long_suspect_is_shown_whole_its_column_as_wide_as_it():
    """`prefill at sglang-deploy-glm-4-5-prefill:30089` (SGLang issue #9266's host) was cut to `prefill at
    sgl…5-prefill:30089`: the host name, what tells one prefill server from another, was the part lost. The column
    widens to the suspect; the header's columns stay over the row's."""
    header, row = kvtop("incidents", *logs("bootstrap-unreachable")).stdout.splitlines()

    assert row.startswith("ongoing  prefill at sglang-deploy-glm-4-5-prefill:30089 stopped answering ")
    assert header.index("WHAT") == row.index("stopped answering")
    assert header.index("EVIDENCE") == row.index("its bootstrap server")


def test_a_suspect_past_the_widest_column_keeps_its_end_an_address_its_port(tmp_path: Path):
    """A host name longer than any column keeps its start and its end: the port, what tells one prefill server from
    another on a host, is never the part lost."""
    host = "prefill-" + "x" * 80 + "-7.svc.cluster.local"
    log = tmp_path / "decode.log"
    log.write_text(
        f"[2026-03-05 09:00:32 TP0] Lost connection with prefill instance (bootstrap_addr: {host}:30089), 1 requests "
        "affected\n"
    )

    header, row = kvtop("incidents", "--sglang-log", str(log)).stdout.splitlines()

    suspect = row[header.index("SUSPECT") : header.index("WHAT") - 1]
    assert len(suspect) == 64 and "…" in suspect
    assert suspect.startswith("prefill at prefill-xxx") and suspect.endswith("-7.svc.cluster.local:30089")


def test_client_aborts_are_listed_as_aborts_and_never_counted_ongoing(tmp_path: Path):
    """`check` calls them no incident (SGLang issue #23342: a request each side aborted): `incidents` lists them
    under STATE `aborts` and counts none ongoing, as the dashboard does."""
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-03-01 12:00:00 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='a' "
        "decode_req.req.bootstrap_room=653 with exception KVTransferError(bootstrap_room=653): Aborted by AbortReq.\n"
    )

    text = kvtop("incidents", "--sglang-log", str(log))
    listed = json.loads(kvtop("incidents", "--json", "--sglang-log", str(log)).stdout)

    assert text.stdout.splitlines()[1].startswith("aborts   the client ")
    assert "1 incident from 12:00:00 to 12:00:00 (0 ongoing, 1 of client aborts)" in text.stderr
    assert (listed["ongoing"], listed["incidents"][0]["state"], listed["incidents"][0]["client"]) == (
        0,
        "ongoing",
        True,
    )


def test_check_on_logs_without_failures_is_ok_and_says_what_logs_can_judge():
    """A decode log of batch lines alone: OK, no `0/0 ranks alive`, no failure rate made up (JSON null)."""
    text = kvtop("check", "--sglang-log", str(FIXTURES / "decode-gone" / "decode.log"))
    verdict = json.loads(kvtop("check", "--json", "--sglang-log", str(FIXTURES / "decode-gone" / "decode.log")).stdout)

    assert text.returncode == 0, text.stdout
    assert "0/0 ranks alive" not in text.stdout and "1 rank from logs (no liveness in logs)" in text.stdout
    assert (verdict["failure_rate"], verdict["incidents"], verdict["judged"]) == (None, [], "span")


def test_incident_thresholds_decide_critical_or_warning_and_a_bad_one_is_unknown():
    """26 rooms: CRITICAL by default, WARNING under --incident-rooms 30 or with its class off; a class
    threshold that is no number, or for a class no failure has (a typo that would never take effect), exits 3."""
    gone = logs("decode-gone")

    assert kvtop("check", *gone).returncode == 2
    assert kvtop("check", "--incident-rooms", "30", *gone).returncode == 1
    assert kvtop("check", "--incident-class", "timeout_bootstrap=off", *gone).returncode == 1
    assert kvtop("check", "--incident-rate", "100", *gone).returncode == 1
    assert kvtop("check", "--incident-class", "timeout_bootstrap=0", *gone).returncode == 3
    typo = kvtop("check", "--incident-class", "timeout_bootsrap=off", *gone)
    assert typo.returncode == 3
    assert "'timeout_bootsrap' is no class of failure (one of: timeout_bootstrap, " in typo.stdout


def test_check_names_the_incidents_that_made_it_critical_before_those_switched_off():
    """With three classes off, check named the three biggest incidents (all of them off) after `and 5 more
    incidents`, and never the ones that made it CRITICAL."""
    off = ("send_failed", "other", "peer_lost")
    args = [arg for name in off for arg in ("--incident-class", f"{name}=off")]

    check = kvtop("check", *args, *logs("new-era"))

    assert check.returncode == 2
    first = check.stdout.removeprefix("KVTOP CRITICAL - ").split("; ")[0]
    assert first.startswith("incident: ") and not any(f"({name})" in first for name in off), first


def cluster_incidents(found: list[dict[str, Any]], kind: str = "") -> list[tuple[str, str]]:
    """(suspect, kind) of each cluster incident (of `kind` only, when given)."""
    return [(i["suspect"]["name"], i["kind"]) for i in found if not i["client"] and kind in ("", i["kind"])]


def of_kind(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one incident of `kind` (a test machine overloaded by other work may add others of their own kinds:
    pools that fill, ranks starved past their timeouts)."""
    matching = [incident for incident in found if incident["kind"] == kind]
    assert len(matching) == 1, [(i["headline"], i["evidence"], i["noticed_by"], i["first_seen"]) for i in found]
    return matching[0]


def biggest_of_kind(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The incident of `kind` with the most rooms (a loaded machine may add a straggler of the same kind: a send
    that failed once the stopped rank woke, later than its silence explains; the caller bounds their rooms)."""
    matching = [incident for incident in found if incident["kind"] == kind]
    assert matching, [i["headline"] for i in found]
    return max(matching, key=lambda incident: incident["room_count"])


def test_live_a_corrupting_prefill_rank_is_one_incident_naming_it_and_check_says_so(cluster_up, wait_for):
    """prefill-0/TP1 corrupts 8 % of what it sends to two decode instances: the decode ranks notice, the incident
    names the sender, its rooms are every room that failed its checksum, and check exits 2 naming it."""
    running = cluster_up(
        "--prefill", "1", "--decode", "2", "--tp", "2", "--rate", "15", "--fault", "prefill-0/TP1=corrupt:0.08"
    )
    running.wait_line(r"failed ([5-9]|\d\d+),")

    def checksum_failures() -> list[dict[str, Any]]:
        groups = json.loads(kvtop("failures", "--json", "--bootstrap", running.bootstrap).stdout)["groups"]
        return [group for group in groups if group["origin"] and group["origin"]["reason_class"] == "checksum"]

    def noticed_on_both_decode_instances() -> list[dict[str, Any]]:
        """The checksum failures once each decode instance has one (rooms go to either: the first few may all
        have gone to one)."""
        groups = checksum_failures()
        noticed = {group["origin_label"].rsplit("/", 1)[0] for group in groups}
        assert noticed <= {"decode-0", "decode-1"}, noticed
        return groups if len(noticed) == 2 else []

    checksums = wait_for(noticed_on_both_decode_instances, 60, "a corrupt chunk noticed on each decode instance")
    found = incidents("--bootstrap", running.bootstrap)
    check = kvtop("check", "--bootstrap", running.bootstrap)

    corrupt = of_kind(found, "corrupt")
    assert corrupt["suspect"] == {"kind": "rank", "name": "prefill-0/TP1", "role": "prefill"}
    assert {group["room"] for group in checksums} <= set(corrupt["rooms"])
    assert not [name for name, _ in cluster_incidents(found) if name.startswith("decode-")]  # who noticed: no suspect
    assert check.returncode == 2, check.stdout
    assert "incident: prefill-0/TP1 sends corrupt KV (checksum) since " in check.stdout


def test_live_a_rank_that_dies_is_one_incident_naming_it(cluster_up, wait_for):
    """prefill-0/TP1 kills itself on a room: its peers lose it, its instance stops hearing its votes: one
    incident, suspect prefill-0/TP1."""
    running = cluster_up("--prefill", "1", "--decode", "2", "--tp", "2", "--rate", "15", "--fault",
                         "prefill-0/TP1=die:0.1")  # fmt: skip
    running.wait_line(r"kvtop: rank prefill-0/TP1 \(pid \d+\) killed by SIGKILL")

    found = wait_for(lambda: cluster_incidents(incidents("--bootstrap", running.bootstrap), "unresponsive"), 30,
                     "an incident")  # fmt: skip

    assert found == [("prefill-0/TP1", "unresponsive")]


def test_live_a_rank_stopped_under_load_is_one_incident_naming_it_not_one_origin_per_room(cluster_up, wait_for):
    """prefill-0/TP1 SIGSTOPped under load until kvtop calls it gone, then let go: its peers lost it, its
    instance's pool filled and refused rooms, it judged its own peers lost when it woke, and the cluster works
    again: one incident throughout, suspect prefill-0/TP1."""
    running = cluster_up("--prefill", "1", "--decode", "2", "--tp", "2", "--rate", "15", "--fault", "none")
    rooms_ok(running, at_least=20)
    pid = next(rank["pid"] for rank in ranks(running.bootstrap) if rank["label"] == "prefill-0/TP1")

    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: state(running.bootstrap, "prefill-0/TP1") == "gone", 40, "prefill-0/TP1 gone")
        stopped = incidents("--bootstrap", running.bootstrap)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: state(running.bootstrap, "prefill-0/TP1") == "alive", 30, "prefill-0/TP1 alive again")
    rooms_ok(running, at_least=rooms_ok(running) + 30)  # the cluster works again
    after = incidents("--bootstrap", running.bootstrap)

    during, then = biggest_of_kind(stopped, "unresponsive"), biggest_of_kind(after, "unresponsive")
    assert (during["suspect"]["name"], then["suspect"]["name"]) == ("prefill-0/TP1", "prefill-0/TP1"), after
    assert then["room_count"] >= during["room_count"] > 1
    assert then["room_count"] >= 0.8 * sum(i["room_count"] for i in after if not i["client"]), after


def test_live_an_instance_that_stalls_whole_is_one_incident_of_the_instance_naming_its_ranks(cluster_up, wait_for):
    """Both ranks of prefill-0 stall rooms (they stop sending halfway): the decode ranks time them out, each naming the
    prefill rank it waited on. Once both ranks have stalled rooms it is one incident, `prefill-0 stopped answering`,
    its evidence naming the two ranks, no incident of either rank beside it; check names the instance."""
    running = cluster_up("--prefill", "1", "--decode", "1", "--tp", "2", "--rate", "15", "--fault",
                         "prefill-0=stall:0.1")  # fmt: skip

    def the_instance() -> dict[str, Any] | None:
        found = incidents("--bootstrap", running.bootstrap)
        return next((i for i in found if i["suspect"]["name"] == "prefill-0" and i["kind"] == "unresponsive"), None)

    instance = wait_for(the_instance, 90, "an incident of prefill-0")
    found = incidents("--bootstrap", running.bootstrap)
    check = kvtop("check", "--bootstrap", running.bootstrap)

    assert instance["headline"].startswith("prefill-0 stopped answering (timeout_"), instance
    assert instance["evidence"][0] in (
        "its ranks prefill-0/TP0, prefill-0/TP1 failed together",
        "its ranks prefill-0/TP1, prefill-0/TP0 failed together",
    )
    assert not [name for name, _ in cluster_incidents(found, "unresponsive") if name.startswith("prefill-0/")], found
    assert "incident: prefill-0 stopped answering (timeout_" in check.stdout, check.stdout


def test_live_an_instance_whose_every_rank_corrupts_its_sends_is_one_incident_of_the_instance(cluster_up, wait_for):
    """Both ranks of prefill-0 corrupt 5 % of what they send: once each has, it is one incident, `prefill-0 sends
    corrupt KV`, its evidence naming the two ranks, no incident of either rank beside it (it was two: one cause)."""
    running = cluster_up("--prefill", "1", "--decode", "1", "--tp", "2", "--rate", "20", "--fault",
                         "prefill-0=corrupt:0.05")  # fmt: skip

    def the_instance() -> dict[str, Any] | None:
        found = incidents("--bootstrap", running.bootstrap)
        return next((i for i in found if i["suspect"]["name"] == "prefill-0" and i["kind"] == "corrupt"), None)

    instance = wait_for(the_instance, 90, "an incident of prefill-0 sending corrupt KV")
    found = incidents("--bootstrap", running.bootstrap)

    assert instance["headline"] == "prefill-0 sends corrupt KV (checksum)", instance
    assert instance["suspect"] == {"kind": "instance", "name": "prefill-0", "role": "prefill"}
    assert instance["evidence"][0] in (
        "its ranks prefill-0/TP0, prefill-0/TP1 failed together",
        "its ranks prefill-0/TP1, prefill-0/TP0 failed together",
    )
    assert not [i["suspect"]["name"] for i in found if i["suspect"]["name"].startswith("prefill-0/")], found


def ranks(bootstrap: str) -> list[dict[str, Any]]:
    result = kvtop("ranks", "--json", "--bootstrap", bootstrap)
    assert result.returncode == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def state(bootstrap: str, label: str) -> str:
    return next((rank["state"] for rank in ranks(bootstrap) if rank["label"] == label), "")


def rooms_ok(running: Running, at_least: int = 0) -> int:
    """The rooms `cluster up` says succeeded, once a status line says at least `at_least`."""
    while (ok := int(running.wait_line(r"rooms ok (\d+),", timeout_s=90)[1])) < at_least:
        pass
    return ok


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("fatal-signal", "prefill-0/TP0 stopped answering (peer_lost), 1 room since 09:43:53"),
        ("bootstrap-unreachable", "(bootstrap_error), 2 rooms and 3 failures naming none since 11:56:51"),
    ],
)
def test_status_counts_an_incident_s_rooms_as_check_does(name: str, said: str):
    """`status` said `1 rooms since`, and `2 rooms` where three failures named no room: check's words now."""
    status = kvtop("status", *logs(name))

    assert status.returncode == 0, status.stderr
    assert said in status.stdout, status.stdout
