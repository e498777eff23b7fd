"""A small cluster driven past its pool capacity, with faults, partial submits and a killed rank: every room ends."""

from __future__ import annotations

import random
import time
from collections import Counter

from transport import FaultSpec, KVPoll, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec
from transport.harness.control import ControlClient

PAGE_BYTES = 8192
POOL_PAGES = 64
KILLED = "prefill-0/TP1"
CONFIG = TransferConfig(
    chunk_bytes=2 * PAGE_BYTES,
    window_bytes=8 * PAGE_BYTES,
    heartbeat_s=0.2,
    peer_timeout_s=1.0,
    timeouts=Timeouts(bootstrap_s=3.0, waiting_s=3.0, transfer_s=1.0),
)
FAULTS = tuple(FaultSpec.parse(text) for text in ("corrupt:0.1", "stall:0.1", "refuse:0.1"))


def test_every_room_accepted_under_overload_faults_and_a_killed_rank_ends_and_every_page_returns(
    make_cluster, control, wait_for
):
    """A TP=2 prefill and a TP=2 decode instance get more rooms than their pools hold, some on one rank of
    each only, with corrupt, stalled and refused transfers, and prefill-0/TP1 is SIGKILLed two thirds in:
    every surviving rank answers every room it accepted, and ends with all its pages free."""
    spec = ClusterSpec(
        prefill_tp=2,
        decode_tp=2,
        num_pages=POOL_PAGES,
        page_bytes=PAGE_BYTES,
        transfer=CONFIG,
        faults={"prefill": FAULTS},
    )
    cluster = make_cluster(spec)
    agents = {a.label: a for a in cluster.agents()}
    clients: dict[str, ControlClient] = {label: control(a.control_endpoint) for label, a in agents.items()}
    prefills = sorted(label for label in agents if label.startswith("prefill-"))
    decodes = sorted(label for label in agents if label.startswith("decode-"))
    rng = random.Random(12)
    rooms: dict[str, dict[int, int]] = {label: {} for label in agents}
    """req_id -> room of every Submit, per rank."""
    results: dict[str, dict[int, KVPoll]] = {label: {} for label in agents}
    refused: dict[str, set[int]] = {label: set() for label in agents}

    def collect() -> None:
        for label, client in clients.items():
            if label == KILLED and cluster.process(KILLED).process.poll() is not None:
                continue
            for result in client.results():
                results[label][result.req_id] = KVPoll(result.state)
            refused[label].update(refusal.req_id for refusal in client.refusals)
            client.refusals.clear()

    for index in range(120):  # ~15 rooms/s of 8-24 pages, each held ~0.1-1 s: more than 64 pages hold
        if index == 80:
            cluster.kill(KILLED)
        room, pages = rng.getrandbits(63), rng.randint(8, 24)
        # every 8th room reaches TP0 of each instance only (as lost Submits would): it succeeds there, and
        # the pools drift apart, so one rank refuses what its sibling accepts
        targets = ["prefill-0/TP0", "decode-0/TP0"] if index % 8 == 3 else [*prefills, *decodes]
        for label in targets:
            if label == KILLED and index >= 80:
                continue
            req_id = clients[label].submit_nowait(room, pages, "prefill-0" if label in decodes else "")
            rooms[label][req_id] = room
        collect()
        time.sleep(0.05)

    def unanswered() -> dict[str, int]:
        collect()
        survivors = [label for label in agents if label != KILLED]
        return {
            label: left
            for label in survivors
            if (left := len(rooms[label].keys() - refused[label] - results[label].keys()))
        }

    wait_for(lambda: not unanswered(), timeout=20, what="a result for every accepted room")
    for label in agents.keys() - {KILLED}:
        stats = wait_for(
            lambda c=clients[label]: (s := c.stats())["rooms_live"] == 0 and s, what=f"{label} releases every room"
        )
        assert (label, POOL_PAGES) == (label, stats["pool_free_pages"])
    outcomes = Counter(state for label in decodes for state in results[label].values())
    assert outcomes[KVPoll.Success] > 0
    assert outcomes[KVPoll.Failed] > 0
    assert sum(len(refused[label]) for label in agents) > 0, "the pools never ran full: the load is too light"
    assert cluster.process(KILLED).process.returncode == -9
