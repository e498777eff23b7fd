"""Faults in a real TP=2 x TP=2 cluster: every failed room has one origin, and every other rank echoes it at debug.

Each test starts agent processes (prefill-0 and decode-0, two ranks each),
injects one fault on one rank, drives rooms through the agents' control
sockets, and reads what the agents published (through an `EventSubscriber`)
and what they logged (SGLang's scheduler lines, in `ClusterSpec.log_dir`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from transport import FaultSpec, KVPoll, Timeouts, TransferConfig
from transport.bootstrap import BootstrapClient
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient
from transport.plane.events import Failure
from transport.wire import RoomResult

PREFILL = ("prefill-0/TP0", "prefill-0/TP1")
DECODE = ("decode-0/TP0", "decode-0/TP1")
EVERY_RANK = (*PREFILL, *DECODE)
RANK_PAGE_BYTES = 4096
"""Each rank of a TP=2 instance holds half of an 8 KiB logical page."""
PAGES = 8
ROOMS = (0x1D2C_3B4A_5968_7001, 0x0BAD_F00D_0000_0002)
TRANSFER = TransferConfig(
    chunk_bytes=2 * RANK_PAGE_BYTES,  # 4 chunks per room and link, so a fault can hit the middle one
    window_bytes=8 * RANK_PAGE_BYTES,
    heartbeat_s=0.25,
    peer_timeout_s=1.5,
    timeouts=Timeouts(bootstrap_s=1.5, waiting_s=1.5, transfer_s=1.0),
)
FAILURE_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP(?P<rank>\d+)\] (?P<message>.+)")


def cluster_spec(
    log_dir: Path, faults: dict[str, str], log_level: str = "INFO", transfer: TransferConfig = TRANSFER
) -> ClusterSpec:
    """One prefill and one decode instance of TP 2, small pools, the given fault per agent label prefix."""
    return ClusterSpec(
        prefill_tp=2,
        decode_tp=2,
        num_pages=64,
        page_bytes=2 * RANK_PAGE_BYTES,
        transfer=transfer,
        faults={prefix: (FaultSpec.parse(text),) for prefix, text in faults.items()},
        log_dir=str(log_dir),
        log_level=log_level,
    )


def clients_of(cluster: LocalCluster, control, labels: tuple[str, ...]) -> dict[str, ControlClient]:
    """Control clients for the agents registered as `labels`, in that order."""
    agents = {agent.label: agent for agent in cluster.agents()}
    return {label: control(agents[label].control_endpoint) for label in labels}


def submit(clients: dict[str, ControlClient], room: int, prefill_instance: str = "prefill-0") -> None:
    """Submit `room` to every given rank, as a router would: prefill ranks first, then decode ranks."""
    for label, client in clients.items():
        if label.startswith("prefill"):
            client.submit(room, PAGES)
        else:
            client.submit(room, PAGES, prefill_instance=prefill_instance)


def results_of(clients: dict[str, ControlClient], room: int, timeout_s: float = 10.0) -> dict[str, RoomResult]:
    return {label: client.wait_result(room, timeout_s) for label, client in clients.items()}


def origin_level(label: str) -> str:
    """SGLang's level for an origin: warning on prefill, error on decode."""
    return "warning" if label.startswith("prefill") else "error"


def sglang_line(failure: Failure, failed_in: KVPoll | None) -> str:
    """The scheduler line SGLang logs for `failure` on its rank (DOMAIN.md's table; SGLang prints no level)."""
    instance, rank = failure.rank.split("/TP")
    room = failure.room
    early = failed_in is KVPoll.Bootstrapping
    if instance.startswith("prefill"):
        what = "Prefill bootstrap" if early else "Prefill transfer"
        request = f"req.rid='{room:x}' req.bootstrap_room={room}"
    else:
        what = "Decode handshake" if early else "Decode transfer"
        request = f"decode_req.req.rid='{room:x}' decode_req.req.bootstrap_room={room}"
    return f"{what} failed for request rank={rank} {request} with exception {failure_text(failure)}"


def failure_text(failure: Failure) -> str:
    return f"KVTransferError(bootstrap_room={failure.room}): {failure.reason}"


def logged_failures(log_dir: Path, room: int) -> list[tuple[str, str]]:
    """(rank label, message) of every line about `room` in the agents' log files, each in SGLang's format."""
    lines = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text().splitlines():
            if f"bootstrap_room={room}" not in line:
                continue
            match = FAILURE_LINE.fullmatch(line)
            assert match, f"not an SGLang scheduler line: {line!r}"
            lines.append((f"{path.stem}/TP{match['rank']}", match["message"]))
    return sorted(lines)


@dataclass(frozen=True)
class FaultCase:
    """One injected fault, where its rooms go, and the one origin every room must get."""

    faults: dict[str, str]
    ranks: tuple[str, ...]
    """The ranks each room is submitted to (all of them, or one side only to make a timeout happen)."""
    origin: str
    reason_class: str
    wording: str
    """How the origin's SGLang line starts."""
    reason: re.Pattern[str]
    log_level: str = "INFO"
    prefill_instance: str = "prefill-0"
    """Where decode ranks fetch the room from."""
    half_registered: bool = False
    """Register rank 0 of 2 of `prefill_instance` (its rank 1 never comes): known, so a Submit naming it is
    accepted, but never resolvable."""


CASES = {
    "corrupt-on-prefill-TP1": FaultCase(
        {"prefill-0/TP1": "corrupt"},
        EVERY_RANK,
        origin="decode-0/TP1",
        reason_class="checksum",
        wording="Decode transfer failed",
        reason=re.compile(r"KV chunk 2 of room \d+ from prefill rank 1 \(prefill-0/TP1\) failed its checksum .+"),
    ),
    "refuse-on-prefill-TP0-with-debug-log": FaultCase(
        {"prefill-0/TP0": "refuse"},
        EVERY_RANK,
        origin="prefill-0/TP0",
        reason_class="refused",
        wording="Prefill bootstrap failed",  # refused at the transfer request, before the room left Bootstrapping
        reason=re.compile(r"Prefill rank 0 refused the transfer request of room \d+"),
        log_level="DEBUG",
    ),
    "stall-on-prefill-TP1": FaultCase(
        {"prefill-0/TP1": "stall"},
        EVERY_RANK,
        origin="decode-0/TP1",
        reason_class="timeout_transfer",
        wording="Decode transfer failed",
        reason=re.compile(r"Request \d+ timed out after \d+\.\ds in KVPoll\.Transferring"),
    ),
    "timeout-in-bootstrapping-without-decode": FaultCase(
        {},
        PREFILL,
        origin="prefill-0/TP0",  # rank 1 would time out TIMEOUT_STAGGER_S later: it hears of rank 0's first
        reason_class="timeout_bootstrap",
        wording="Prefill bootstrap failed",
        reason=re.compile(r"Request \d+ timed out after \d+\.\ds in KVPoll\.Bootstrapping"),
    ),
    "timeout-in-bootstrapping-on-decode-for-a-prefill-whose-ranks-never-all-registered": FaultCase(
        {},
        DECODE,
        origin="decode-0/TP0",
        reason_class="timeout_bootstrap",
        wording="Decode handshake failed",
        reason=re.compile(r"Request \d+ timed out after \d+\.\ds in KVPoll\.Bootstrapping"),
        prefill_instance="prefill-9",
        half_registered=True,
    ),
    "timeout-in-waiting-for-input-without-prefill": FaultCase(
        {},
        DECODE,
        origin="decode-0/TP0",
        reason_class="timeout_waiting",
        wording="Decode transfer failed",
        reason=re.compile(r"Request \d+ timed out after \d+\.\ds in KVPoll\.WaitingForInput"),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_failed_room_has_one_origin_and_every_other_rank_echoes_it_at_debug(
    case: FaultCase, make_cluster, control, subscribe, tmp_path: Path
):
    """A fault on one rank fails the room everywhere, with one origin event and log line; the rest are echoes."""
    cluster = make_cluster(cluster_spec(tmp_path, case.faults, case.log_level))
    events = subscribe(cluster.agents())
    clients = clients_of(cluster, control, case.ranks)
    if case.half_registered:
        prefill = next(a for a in cluster.agents() if a.label == "prefill-0/TP0")
        with BootstrapClient(cluster.endpoint) as bootstrap:
            bootstrap.register(msgspec.structs.replace(prefill, instance=case.prefill_instance))

    for room in ROOMS:
        submit(clients, room, case.prefill_instance)
    results = {room: results_of(clients, room) for room in ROOMS}
    events.wait_flushed(case.ranks)

    for room in ROOMS:
        failures = events.failures(room)
        assert sorted(case.ranks) == sorted(f.rank for f in failures), "one Failure event per rank of the room"
        origins = [f for f in failures if f.level != "debug"]
        assert [(case.origin, case.origin, origin_level(case.origin))] == [(f.rank, f.origin, f.level) for f in origins]
        origin = origins[0]
        assert case.reason_class == origin.reason_class
        assert case.reason.fullmatch(origin.reason), origin.reason
        assert not origin.is_from_another_rank
        echoes = [f for f in failures if f is not origin]
        assert [("debug", case.origin)] * len(echoes) == [(f.level, f.origin) for f in echoes]
        assert {KVPoll.Failed} == {result.state for result in results[room].values()}
        assert {case.origin} == {result.origin for result in results[room].values()}

        logged = sglang_line(origin, events.failed_in(origin.rank, room))
        assert logged.startswith(f"{case.wording} for request rank={case.origin[-1]} ")
        assert logged.endswith(f" with exception {failure_text(origin)}")
        shown = failures if case.log_level == "DEBUG" else [origin]  # echoes are logged at debug
        expected = sorted((f.rank, sglang_line(f, events.failed_in(f.rank, room))) for f in shown)
        assert expected == logged_failures(tmp_path, room)


def test_a_killed_rank_fails_its_rooms_through_the_ranks_that_observe_it(
    make_cluster, control, subscribe, tmp_path: Path, wait_for
):
    """SIGKILL of prefill-0/TP1 mid-transfer fails every room; each origin is a live rank, each echo names one.

    The dead rank publishes nothing, so it can be nobody's origin. Two live ranks
    see it go, each first-hand and at about the same time: decode-0/TP1 loses
    its data link (peer lost, or no progress in Transferring) and prefill-0/TP0
    stops hearing its instance peer's votes (rank silent). Both are observations,
    not echoes, so a room can get one origin per observing side; every other
    rank's failure is an echo of whichever origin reached it first.
    """
    slow = TransferConfig(
        chunk_bytes=RANK_PAGE_BYTES,  # one page per chunk, each delayed 0.2 s: a room takes ~1.6 s per link
        window_bytes=4 * RANK_PAGE_BYTES,
        heartbeat_s=0.25,
        peer_timeout_s=1.5,
        timeouts=Timeouts(bootstrap_s=5.0, waiting_s=5.0, transfer_s=1.0),  # rooms queued behind others may wait
    )
    cluster = make_cluster(cluster_spec(tmp_path, {"prefill-0": "delay"}, transfer=slow))
    events = subscribe(cluster.agents())
    clients = clients_of(cluster, control, EVERY_RANK)
    killed = "prefill-0/TP1"
    live = {label: client for label, client in clients.items() if label != killed}
    for room in ROOMS:
        submit(clients, room)
    wait_for(lambda: clients["decode-0/TP1"].stats()["chunks_landed"] > 0, timeout=10, what="KV flows on TP1")

    cluster.kill(killed)
    killed_at = time.time()
    results = {room: results_of(live, room) for room in ROOMS}
    events.wait_flushed(live)

    assert cluster.process(killed).process.returncode == -9
    assert all(batch.sent_at < killed_at for batch in events.batches(killed)), "a dead rank publishes nothing"
    for room in ROOMS:
        failures = events.failures(room)
        assert sorted(live) == sorted(f.rank for f in failures), "one Failure event per live rank, none from the dead"
        origins = [f for f in failures if f.level != "debug"]
        assert origins, "every failed room has an origin"
        assert [(f.rank, origin_level(f.rank)) for f in origins] == [(f.origin, f.level) for f in origins]
        named = {f.rank for f in origins}
        assert killed not in named
        assert all(f.origin in named for f in failures), [(f.rank, f.origin) for f in failures]
        assert {KVPoll.Failed} == {result.state for result in results[room].values()}
        assert {result.origin for result in results[room].values()} <= named
        expected = sorted((f.rank, sglang_line(f, events.failed_in(f.rank, room))) for f in origins)
        assert expected == logged_failures(tmp_path, room)
