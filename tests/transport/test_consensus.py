"""Instance consensus in-process: the ranks of an instance agree on each room (MIN), and failures keep their origin."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from transport import BootstrapClient, FaultInjector, FaultSpec, KVManager, KVPoll, Role, Timeouts, TransferConfig
from transport.kv.engine import SILENT_VOTER_S
from transport.kv.reasons import from_another_rank
from transport.plane.events import AbortEvent

PAGE_BYTES = 4096
PAGES = np.arange(8, dtype=np.uint32)
CONFIG = TransferConfig(chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
ECHO_REASON = from_another_rank().text


def instance(make_manager, role: Role, name: str, config: TransferConfig = CONFIG, **faults: str) -> list[KVManager]:
    """The two ranks of a TP=2 instance; `faults` maps `TP<rank>` to a fault spec for that rank."""
    return [
        make_manager(
            role,
            name,
            rank=rank,
            tp=2,
            page_bytes=PAGE_BYTES,
            config=config,
            faults=FaultInjector((FaultSpec.parse(faults[f"TP{rank}"]),)) if f"TP{rank}" in faults else None,
        )
        for rank in range(2)
    ]


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_a_failure_on_one_rank_reaches_the_other_rank_as_an_echo_naming_its_origin(make_manager, wait_for, role):
    """Rank 0 times out first (rank 1 is staggered); rank 1 fails through the vote, with SGLang's echo text."""
    config = TransferConfig(timeouts=Timeouts(bootstrap_s=0.5))
    ranks = instance(make_manager, role, f"{role}-0", config)
    if role is Role.PREFILL:
        handles = [rank.sender(0x51) for rank in ranks]  # no decode ever asks
        for handle in handles:
            handle.send(PAGES)
    else:
        handles = [rank.receiver(0x51, "prefill-9") for rank in ranks]  # no such prefill instance
        for handle in handles:
            handle.init(PAGES)

    wait_for(lambda: all(h.poll() is KVPoll.Failed for h in handles), timeout=5, what="both ranks fail")

    origin, echo = handles[0].failure, handles[1].failure
    assert origin is not None and echo is not None
    assert (ranks[0].info.label, False, "timeout_bootstrap") == (
        origin.origin,
        origin.is_from_another_rank,
        handles[0].reason_class,
    )
    assert (ranks[0].info.label, True, ECHO_REASON, "propagated") == (
        echo.origin,
        echo.is_from_another_rank,
        echo.failure_reason,
        handles[1].reason_class,
    )
    assert echo.suspect == origin.suspect  # what the origin named travels with the vote to its echoes
    assert echo.origin_class == "timeout_bootstrap"  # and the class it recorded
    assert role is Role.PREFILL or origin.suspect == "prefill-9"
    assert f"KVTransferError(bootstrap_room={0x51}): {ECHO_REASON}" == str(echo)
    wait_for(lambda: all(h.agreed() is KVPoll.Failed for h in handles), what="the instance agrees")
    assert [origin, echo] == [h.agreed_failure for h in handles]


def test_agreed_is_success_only_once_every_rank_of_the_instance_succeeded(make_manager, subscribe, wait_for):
    """A rank whose own transfer is done still reports the instance's MIN until its peer rank is done too."""
    prefills = instance(make_manager, Role.PREFILL, "prefill-0")
    decodes = instance(make_manager, Role.DECODE, "decode-0")
    events = subscribe([m.info for m in (*prefills, *decodes)])
    senders = [prefill.sender(0x52) for prefill in prefills]
    receivers = [decode.receiver(0x52, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(PAGES)
    wait_for(lambda: senders[1].poll() is KVPoll.WaitingForInput, what="prefill rank 1 has its request")

    senders[0].send(PAGES)  # rank 0 of each instance finishes; rank 1 has not started
    wait_for(lambda: senders[0].poll() is KVPoll.Success and receivers[0].poll() is KVPoll.Success)
    events.wait_flushed([prefills[0].info.label, decodes[0].info.label])  # a whole engine tick ran since

    assert [KVPoll.WaitingForInput] * 4 == [h.agreed() for h in (*senders, *receivers)]
    assert [senders[0].agreed_failure, receivers[0].agreed_failure] == [None, None]

    senders[1].send(PAGES)

    wait_for(lambda: all(h.agreed() is KVPoll.Success for h in (*senders, *receivers)), what="all agree")
    assert [KVPoll.Success] * 4 == [h.poll() for h in (*senders, *receivers)]


def test_a_rank_that_succeeded_learns_that_its_instance_failed_the_room_and_from_whom(make_manager, wait_for):
    """Rank 0 finished its part; rank 1's part fails its checksum: rank 0 agrees Failed, naming decode-0/TP1."""
    prefills = instance(make_manager, Role.PREFILL, "prefill-0", TP1="corrupt")
    decodes = instance(make_manager, Role.DECODE, "decode-0")
    senders = [prefill.sender(0x53) for prefill in prefills]
    receivers = [decode.receiver(0x53, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(PAGES)
    senders[0].send(PAGES)
    wait_for(lambda: senders[0].poll() is KVPoll.Success and receivers[0].poll() is KVPoll.Success)

    senders[1].send(PAGES)

    handles = (*senders, *receivers)
    wait_for(lambda: all(h.agreed() is KVPoll.Failed for h in handles), what="both instances agree on Failed")
    origin = decodes[1].info.label
    assert [KVPoll.Success, KVPoll.Failed, KVPoll.Success, KVPoll.Failed] == [h.poll() for h in handles]
    for done in (senders[0], receivers[0]):
        done.failure_exception()  # its own part succeeded: nothing to raise
        agreed = done.agreed_failure
        assert agreed is not None
        assert (origin, True, ECHO_REASON) == (agreed.origin, agreed.is_from_another_rank, agreed.failure_reason)
    assert receivers[1].agreed_failure is receivers[1].failure
    assert (origin, "checksum") == (receivers[1].failure.origin, receivers[1].reason_class)
    assert senders[1].failure is not None and origin == senders[1].failure.origin


def test_an_abort_on_one_decode_rank_is_the_one_origin_and_every_other_rank_echoes_it(
    make_manager, subscribe, wait_for
):
    """receiver.abort() on decode-0/TP1: that rank is the origin (aborted); the three others fail as its echoes."""
    prefills = instance(make_manager, Role.PREFILL, "prefill-0")
    decodes = instance(make_manager, Role.DECODE, "decode-0")
    managers = (*prefills, *decodes)
    events = subscribe([m.info for m in managers])
    events.wait_synced([m.info.label for m in managers])  # abort events are not part of a snapshot
    room = 0x54
    senders = [prefill.sender(room) for prefill in prefills]
    receivers = [decode.receiver(room, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(PAGES)
    handles = (*senders, *receivers)
    wait_for(lambda: all(h.poll() is KVPoll.WaitingForInput for h in handles), what="every handshake done")

    receivers[1].abort()

    wait_for(lambda: all(h.agreed() is KVPoll.Failed for h in handles), what="both instances agree on Failed")
    wait_for(lambda: receivers[1].abort_acknowledged, what="prefill-0/TP1 acknowledges the abort")
    events.wait_flushed([m.info.label for m in managers])
    origin = decodes[1].info.label
    failure = receivers[1].failure
    assert failure is not None
    assert ("Aborted by AbortReq.", "aborted", origin) == (
        failure.failure_reason,
        receivers[1].reason_class,
        failure.origin,
    )
    assert [origin] * 4 == [h.failure.origin for h in handles if h.failure is not None]  # by whichever path came first

    failures = events.failures(room)
    assert [(origin, "error", "aborted", origin)] == [
        (f.rank, f.level, f.reason_class, f.origin) for f in failures if f.level != "debug"
    ]
    others = sorted(m.info.label for m in managers if m is not decodes[1])
    assert [(label, origin) for label in others] == sorted((f.rank, f.origin) for f in failures if f.level == "debug")
    aborts = [(label, e.direction, e.origin) for label, e in events.events() if isinstance(e, AbortEvent)]
    assert all(abort_origin == origin for _, _, abort_origin in aborts), aborts
    assert {("decode-0/TP1", "sent", origin), ("prefill-0/TP1", "received", origin)} <= set(aborts)


def test_a_rank_that_died_before_it_was_ever_heard_still_fails_the_rooms_of_its_instance(
    bootstrap, make_manager, wait_for
):
    """prefill-0/TP1 crashes before its first vote reaches TP0: TP0 counts it silent after the vote timeout.

    decode-0/TP1, which dials the dead rank, loses that link after its own peer timeout: at the prefill ranks' 0.5 s
    it raced TP0's vote timeout, and under load it won (the room's origin was decode-0/TP1); at 2 s it comes after."""
    config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5)
    decode_config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=2.0)
    crashed = make_manager(Role.PREFILL, "prefill-0", rank=1, tp=2, page_bytes=PAGE_BYTES, config=config)
    crashed.close()
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(crashed.info)  # a crashed rank stays registered (until its entry expires), a closed one not
    survivor = make_manager(Role.PREFILL, "prefill-0", rank=0, tp=2, page_bytes=PAGE_BYTES, config=config)
    decodes = instance(make_manager, Role.DECODE, "decode-0", decode_config)
    sender = survivor.sender(0x55)
    receivers = [decode.receiver(0x55, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(PAGES)
    sender.send(PAGES)

    wait_for(lambda: sender.agreed() is KVPoll.Failed, timeout=5, what="the survivor stops waiting for TP1")

    failure = sender.agreed_failure
    assert failure is not None
    assert ("Lost connection with rank prefill-0/TP1 of this instance", survivor.info.label) == (
        failure.failure_reason,
        failure.origin,
    )
    wait_for(lambda: all(r.agreed() is KVPoll.Failed for r in receivers), timeout=10, what="decode-0 agrees too")


def test_a_decode_rank_still_bootstrapping_learns_at_once_of_a_room_its_prefill_instance_failed_by_agreement(
    bootstrap, make_manager, subscribe, wait_for
):
    """prefill-0/TP1 dies before it is heard; prefill-0/TP0 sends its part to decode-0/TP0, then fails the room
    when its dead peer's votes never come (the origin). decode-0/TP1, which waits for the dead rank's welcome, hears
    of it at once as an echo of prefill-0/TP0 (prefill-0/TP0 tells decode-0/TP0, whose vote carries it): before, the
    rank that failed the room by agreement told no decode rank, and decode-0/TP1 waited out its own peer timeout
    (30 s here), to fail as an origin of its own."""
    config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=1.5)
    decode_config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=30.0)
    crashed = make_manager(Role.PREFILL, "prefill-0", rank=1, tp=2, page_bytes=PAGE_BYTES, config=config)
    crashed.close()
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(crashed.info)  # a crashed rank stays registered (until its entry expires)
    survivor = make_manager(Role.PREFILL, "prefill-0", rank=0, tp=2, page_bytes=PAGE_BYTES, config=config)
    decodes = instance(make_manager, Role.DECODE, "decode-0", decode_config)
    live = [survivor.info.label, *(decode.info.label for decode in decodes)]
    events = subscribe([survivor.info, *(decode.info for decode in decodes)])
    room = 0x57
    sender = survivor.sender(room)
    receivers = [decode.receiver(room, "prefill-0") for decode in decodes]
    for receiver in receivers:
        receiver.init(PAGES)
    sender.send(PAGES)
    wait_for(lambda: receivers[0].poll() is KVPoll.Success, what="decode-0/TP0 has its part")

    wait_for(lambda: receivers[1].poll() is KVPoll.Failed, timeout=10, what="decode-0/TP1 hears of the failure")

    origin = survivor.info.label
    assert sender.poll() is KVPoll.Success  # its own part went: the room failed by agreement alone
    agreed = sender.agreed_failure
    assert agreed is not None and (origin, False, "peer_lost") == (
        agreed.origin,
        agreed.is_from_another_rank,
        sender.agreed_reason_class,
    )
    echo = receivers[1].failure
    assert echo is not None
    assert (origin, True, ECHO_REASON, "propagated", "peer_lost", crashed.info.label) == (
        echo.origin,
        echo.is_from_another_rank,
        echo.failure_reason,
        receivers[1].reason_class,
        echo.origin_class,
        echo.suspect,
    )
    wait_for(lambda: receivers[0].agreed() is KVPoll.Failed, what="decode-0/TP0 agrees")
    told = receivers[0].agreed_failure
    assert told is not None and (origin, True, "propagated") == (
        told.origin,
        told.is_from_another_rank,
        receivers[0].agreed_reason_class,
    )
    events.wait_flushed(live)
    failures = events.failures(room)
    origins = [(f.rank, f.level, f.reason_class) for f in failures if f.origin == f.rank]
    assert [(origin, "warning", "peer_lost")] == origins  # one origin; decode-0/TP1 is no second one
    echoes = sorted((f.rank, f.origin, f.level) for f in failures if f.rank != origin)
    assert sorted((label, origin, "debug") for label in live[1:]) == echoes


def test_a_decode_instance_that_fails_a_room_its_rank_finished_tells_prefill_before_a_prefill_rank_times_out(
    make_manager, wait_for
):
    """decode-0/TP1 goes before it ever takes the room; decode-0/TP0 and prefill-0/TP0 moved their part. decode-0
    fails the room (TP0 the origin: its peer rank is gone), and prefill-0/TP1, whose request never comes, fails as
    its echo at once. It waited out its own bootstrap timeout and became a second origin of the room (a frozen
    decode rank under the dashboard: 187 origins for 91 rooms)."""
    config = TransferConfig(
        chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES, heartbeat_s=0.1, peer_timeout_s=0.5,
        timeouts=Timeouts(bootstrap_s=60.0, waiting_s=60.0),
    )  # fmt: skip
    prefills = instance(make_manager, Role.PREFILL, "prefill-0", config)
    decodes = instance(make_manager, Role.DECODE, "decode-0", config)
    room = 0x56
    senders = [prefill.sender(room) for prefill in prefills]
    for sender in senders:
        sender.send(PAGES)
    receiver = decodes[0].receiver(room, "prefill-0")
    receiver.init(PAGES)
    wait_for(lambda: senders[0].poll() is KVPoll.Success and receiver.poll() is KVPoll.Success, what="TP0s done")

    decodes[1].close()

    wait_for(lambda: all(s.agreed() is KVPoll.Failed for s in senders), timeout=10, what="prefill-0 fails the room")
    origin = decodes[0].info.label
    assert [origin, origin] == [s.agreed_failure.origin for s in senders if s.agreed_failure is not None]
    assert senders[1].poll() is KVPoll.Failed and senders[1].failure is not None
    assert (senders[1].failure.is_from_another_rank, senders[1].reason_class) == (True, "propagated")


@pytest.mark.parametrize("still", [0, 1], ids=["its-peer-stood-still", "it-stood-still-itself"])
def test_a_full_pool_names_the_rank_whose_votes_stopped_not_the_one_that_stopped_reading_them(
    make_manager, subscribe, wait_for, still
):
    """decode-0/TP1 refuses room 0x61 (its pool full) after one rank's engine stood still for twice the silent-voter
    time (a starved process on a loaded host). When TP0 stood still, its votes stopped: the pool filled with rooms
    waiting on it, and TP0 is the suspect. When TP1 stood still itself, TP0 voted all along (its votes wait in TP1's
    socket): TP1 is the suspect, not TP0 (it read 'decode-0/TP0 stopped answering (refused)' on a loaded host). The
    refusal that names TP0 says how long its vote was not heard."""
    ranks = instance(make_manager, Role.DECODE, "decode-0")
    labels = [rank.info.label for rank in ranks]
    events = subscribe([rank.info for rank in ranks])
    events.wait_synced(labels)
    heard = ranks[1].receiver(0x60, "prefill-9")
    heard.init(PAGES)
    ranks[0].refuse(0x60, "prefill-9")
    wait_for(lambda: heard.poll() is KVPoll.Failed, what="TP1 reads TP0's votes")
    receiver = ranks[0].receiver(0x61, "prefill-9")
    receiver.init(PAGES)
    resume = threading.Event()
    ranks[still]._call_soon(lambda: resume.wait(10))  # its engine stands still, as a starved process's does
    stood_from = time.monotonic()
    wait_for(lambda: time.monotonic() - stood_from > 2 * SILENT_VOTER_S, what="a silent voter's time passes")
    ranks[1].refuse(0x61, "prefill-9")
    if still == 0:  # TP1 judges while TP0 stands still (on a loaded host its engine ran it after TP0's votes came)
        judged = threading.Event()
        ranks[1]._call_soon(judged.set)  # after the refusal, in its engine's order
        wait_for(judged.is_set, what="TP1 refuses while TP0 stands still")
    resume.set()

    wait_for(lambda: receiver.poll() is KVPoll.Failed, what="TP0 learns of the refusal")
    assert receiver.failure is not None
    assert (ranks[1].info.label, ranks[still].info.label) == (receiver.failure.origin, receiver.failure.suspect)
    events.wait_flushed(labels)
    [refusal] = [failure for failure in events.failures(0x61) if failure.level != "debug"]
    assert (ranks[1].info.label, ranks[still].info.label) == (refusal.rank, refusal.suspect)
    waited = re.search(r"full \(its rooms wait on the vote of decode-0/TP0, not heard for (\S+)s\)$", refusal.reason)
    assert (still == 0) == (waited is not None), refusal.reason
    assert waited is None or float(waited[1]) >= 2 * SILENT_VOTER_S
