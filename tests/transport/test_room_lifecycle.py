"""Every room an agent accepted ends, with a result for its submitter and its pages back in the pool."""

from __future__ import annotations

import numpy as np
import pytest

from transport import KVPoll, Role, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient, ControlError

PAGE_BYTES = 8192
VOTE_TIMEOUT_S = 1.0
FAST = TransferConfig(
    chunk_bytes=4 * PAGE_BYTES, window_bytes=16 * PAGE_BYTES, heartbeat_s=0.2, peer_timeout_s=VOTE_TIMEOUT_S
)


def control_of(cluster: LocalCluster, control, label: str) -> ControlClient:
    """A control client for the agent registered as `label`."""
    agent = next(a for a in cluster.agents() if a.label == label)
    return control(agent.control_endpoint)


def test_a_room_submitted_to_one_rank_of_each_instance_fails_on_the_vote_timeout_and_frees_its_pages(
    make_cluster, control, subscribe, wait_for
):
    """The partial submit of issue 12: TP1 of both instances never get the room; each TP0 fails it one vote
    timeout after taking it (timeout_consensus, itself the origin) and tells the other (decode-0/TP0 its ABORT,
    prefill-0/TP0, whose part was sent, a Failed status), which fails it as that echo when its own vote timeout
    had not come yet; each answers and frees its pages."""
    spec = ClusterSpec(prefill_tp=2, decode_tp=2, num_pages=64, page_bytes=2 * PAGE_BYTES, transfer=FAST)
    cluster = make_cluster(spec)
    events = subscribe(cluster.agents())
    labels = ["prefill-0/TP0", "decode-0/TP0"]
    events.wait_synced(labels)
    prefill, decode = (control_of(cluster, control, label) for label in labels)
    room = 0x1201

    prefill.submit(room, 50)
    decode.submit(room, 50, prefill_instance="prefill-0")
    results = [client.wait_result(room, VOTE_TIMEOUT_S + 10) for client in (prefill, decode)]

    echoes = [result.origin != label for result, label in zip(results, labels, strict=True)]
    assert echoes != [True, True], "one of them timed out first"
    assert [(r.state, r.reason_class, r.origin) for r in results] == [
        (KVPoll.Failed, "propagated", other) if echo else (KVPoll.Failed, "timeout_consensus", label)
        for echo, label, other in zip(echoes, labels, labels[::-1], strict=True)
    ]
    for result, label, echo in zip(results, labels, echoes, strict=True):
        own_silent_rank = label.replace("TP0", "TP1")
        assert echo or f"waiting for the vote of rank {own_silent_rank}" in result.reason
    for client in (prefill, decode):
        stats = wait_for(lambda c=client: (s := c.stats())["rooms_live"] == 0 and s, what="the room is released")
        assert stats["pool_pages"] == stats["pool_free_pages"] == 64
    events.wait_flushed(labels)
    for label in labels:  # published, so kvtop counts the room failed on the ranks that took it
        assert KVPoll.Failed == events.room_states(label)[room]
    origins = [(f.rank, f.reason_class) for f in events.failures(room) if f.origin == f.rank]
    assert sorted(
        (label, "timeout_consensus") for label, echo in zip(labels, echoes, strict=True) if not echo
    ) == sorted(origins)


@pytest.mark.parametrize("sweeper", [Role.PREFILL, Role.DECODE])
def test_a_room_the_retention_sweep_fails_reaches_every_rank_of_both_instances_as_one_origin(
    make_manager, wait_for, sweeper
):
    """TP1 of both instances take the room and never finish it (prefill-0/TP1 never gets its pages), so neither
    instance agrees; TP0 of each finish their part. When the `sweeper` side's TP0 forgets its finished room, it
    fails its agreement first (timeout_consensus) and tells its peer (a Failed status, or an ABORT) and its
    instance (its vote): every rank of both instances fails the room as its echo, long before their own timeouts.
    Before, the sweep told nobody: the peer heard nothing, and the sweeper's other rank, missing the room from its
    votes, failed it as a second origin."""
    timeouts = Timeouts(bootstrap_s=30, waiting_s=30, transfer_s=30)
    retain = {role: 0.5 if role is sweeper else 60.0 for role in Role}
    configs = {role: TransferConfig(timeouts=timeouts, retain_finished_s=retain[role]) for role in Role}
    prefills = [make_manager(Role.PREFILL, "prefill-0", rank=r, tp=2, config=configs[Role.PREFILL]) for r in range(2)]
    decodes = [make_manager(Role.DECODE, "decode-0", rank=r, tp=2, config=configs[Role.DECODE]) for r in range(2)]
    pages = np.arange(4, dtype=np.uint32)
    room = 0x1202
    senders = [prefill.sender(room) for prefill in prefills]
    receivers = [decode.receiver(room, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(pages)
    senders[0].send(pages)  # TP1's sender never gets its pages: it waits for them, and its decode rank for it
    wait_for(lambda: senders[0].poll() is KVPoll.Success and receivers[0].poll() is KVPoll.Success)
    managers, rooms = [*prefills, *decodes], [*senders, *receivers]
    handles = {manager.info.label: handle for manager, handle in zip(managers, rooms, strict=True)}
    origin = f"{sweeper.value}-0/TP0"

    for label, handle in handles.items():
        wait_for(lambda h=handle: h.agreed() is KVPoll.Failed, timeout=10, what=f"{label} learns the room failed")

    failures = {label: handle.agreed_failure for label, handle in handles.items()}
    assert {label: failure.origin for label, failure in failures.items() if failure} == dict.fromkeys(handles, origin)
    swept, failure = handles[origin], failures[origin]
    assert failure is not None and not failure.is_from_another_rank
    assert (KVPoll.Success, "timeout_consensus") == (swept.poll(), swept.agreed_reason_class)
    assert "waiting for its instance to agree" in failure.failure_reason


def test_a_submit_of_fewer_than_one_page_is_refused_and_the_agent_keeps_serving(make_cluster, control, wait_for):
    """Submit with 0 or -5 pages gets a refusal that says why; a real room afterwards succeeds."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=PAGE_BYTES))
    prefill, decode = (control_of(cluster, control, label) for label in ("prefill-0/TP0", "decode-0/TP0"))

    for pages in (0, -5):
        with pytest.raises(ControlError, match=rf"num_pages {pages} is outside 1\.\.16"):
            prefill.submit(0x1204, pages)

    prefill.submit(0x1205, 4)
    decode.submit(0x1205, 4, prefill_instance="prefill-0")
    assert [KVPoll.Success] * 2 == [client.wait_result(0x1205, 10).state for client in (prefill, decode)]
    stats = wait_for(lambda: (s := prefill.stats())["pool_free_pages"] == 16 and s, what="pages back")
    assert stats["submits_refused"] == 2


def test_a_room_of_an_instance_whose_other_rank_never_registers_fails_on_the_vote_timeout(make_manager, wait_for):
    """prefill-0/TP1 never comes up: TP0 cannot join its instance, and fails the room one vote timeout after
    taking it (timeout_consensus, naming how many ranks it reached), long before its bootstrap timeout."""
    config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5, timeouts=Timeouts(30, 30, 30))
    prefill = make_manager(Role.PREFILL, "prefill-0", rank=0, tp=2, config=config)
    sender = prefill.sender(0x1206)
    sender.send(np.arange(4, dtype=np.uint32))

    wait_for(lambda: sender.agreed() is KVPoll.Failed, what="the room fails")

    failure = sender.agreed_failure
    assert failure is not None
    assert (prefill.info.label, "timeout_consensus") == (failure.origin, sender.reason_class)
    assert "waiting for every rank of prefill-0 to join (1 of 2 reachable)" in failure.failure_reason


def test_a_room_a_full_prefill_refuses_fails_on_its_decode_at_once_and_frees_the_decodes_pages(
    make_cluster, control, subscribe, wait_for
):
    """prefill-0/TP0's pool is held by another room, so it refuses room 0x1301; decode-0/TP0, which took the
    room, is told Failed (origin prefill-0/TP0, refused) long before its 30 s waiting timeout and frees its
    pages; the refusal is published as the room's origin."""
    waiting = Timeouts(bootstrap_s=30.0, waiting_s=30.0, transfer_s=30.0)
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, heartbeat_s=0.2, timeouts=waiting)
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=PAGE_BYTES, transfer=config))
    labels = ["prefill-0/TP0", "decode-0/TP0"]
    events = subscribe(cluster.agents())
    events.wait_synced(labels)
    prefill, decode = (control_of(cluster, control, label) for label in labels)
    prefill.submit(0x1300, 16)  # no decode asks for it: it holds every prefill page for 30 s

    with pytest.raises(ControlError, match="KV pool full"):
        prefill.submit(0x1301, 4)
    decode.submit(0x1301, 4, prefill_instance="prefill-0")
    result = decode.wait_result(0x1301, 10)

    assert (result.state, result.origin) == (KVPoll.Failed, "prefill-0/TP0")
    stats = wait_for(lambda: (s := decode.stats())["rooms_live"] == 0 and s, what="the decode releases the room")
    assert stats["pool_free_pages"] == 16
    events.wait_flushed(labels)
    origins = [(f.rank, f.reason_class) for f in events.failures(0x1301) if f.origin == f.rank]
    assert origins == [("prefill-0/TP0", "refused")]


def test_a_room_a_full_decode_rank_refuses_fails_on_its_instance_at_once_naming_the_refusal(
    make_cluster, control, subscribe, wait_for
):
    """decode-0/TP1's pool is held by another room, so it refuses room 0x1401; decode-0/TP0 and prefill-0/TP0, which
    took the room, fail it long before the 30 s vote timeout, the refusal its origin. Before, the refusal was only a
    control counter: decode-0/TP0 waited for decode-0/TP1's vote, and its consensus timeout named a rank that
    was voting all along as one that stopped answering (a live cluster at load, no fault injected)."""
    waiting = Timeouts(bootstrap_s=30.0, waiting_s=30.0, transfer_s=30.0)
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, heartbeat_s=0.2, peer_timeout_s=30.0, timeouts=waiting)
    cluster = make_cluster(ClusterSpec(decode_tp=2, num_pages=16, page_bytes=PAGE_BYTES, transfer=config))
    labels = ["prefill-0/TP0", "decode-0/TP0", "decode-0/TP1"]
    events = subscribe(cluster.agents())
    events.wait_synced(labels)
    prefill, decode, full = (control_of(cluster, control, label) for label in labels)
    full.submit(0x1400, 16, prefill_instance="prefill-0")  # only this rank has it: it holds every page for 30 s

    prefill.submit(0x1401, 4)
    decode.submit(0x1401, 4, prefill_instance="prefill-0")
    with pytest.raises(ControlError, match="KV pool full"):
        full.submit(0x1401, 4, prefill_instance="prefill-0")
    results = [client.wait_result(0x1401, 10) for client in (prefill, decode)]

    assert [(r.state, r.origin) for r in results] == [(KVPoll.Failed, "decode-0/TP1")] * 2
    events.wait_flushed(labels)
    origins = [(f.rank, f.reason_class, f.suspect, f.reason) for f in events.failures(0x1401) if f.origin == f.rank]
    assert origins == [
        ("decode-0/TP1", "refused", "decode-0/TP1", "Decode rank 1 refused room 5121: its KV pool is full")
    ]
    echoes = {(f.rank, f.suspect, f.origin_class) for f in events.failures(0x1401) if f.origin != f.rank}
    assert echoes == {("prefill-0/TP0", "decode-0/TP1", "refused"), ("decode-0/TP0", "decode-0/TP1", "refused")}
