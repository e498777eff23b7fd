"""Faults say what they do: each reaches the ranks it names, only where it can act, and holds for a room's life."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from transport import FaultInjector, FaultKind, FaultSpec, KVPoll, Role, TransferConfig
from transport.errors import ConfigError
from transport.harness.cluster import ClusterSpec

PAGE_BYTES = 4096


def spec_of(faults: dict[str, str], prefill: int = 2, decode: int = 1) -> ClusterSpec:
    """A 2P1D TP2 cluster spec (nothing started) with one fault per target."""
    return ClusterSpec(
        prefill=prefill,
        decode=decode,
        prefill_tp=2,
        decode_tp=2,
        faults={target: tuple(FaultSpec.parse(t) for t in text.split(",")) for target, text in faults.items()},
    )


def test_fault_plan_gives_each_fault_to_the_ranks_it_names_that_can_act_on_it():
    """ "" reaches every rank that can act, a role, an instance and a rank reach exactly those; @decode is no filter."""
    plan = spec_of(
        {"": "corrupt:0.1,die:0.01", "decode-0/TP1": "die", "prefill-1": "stall@decode-0", "prefill": "drop@decode"}
    ).fault_plan()

    corrupt, die, stall, drop = (
        FaultSpec.parse("corrupt:0.1"),
        FaultSpec.parse("die:0.01"),
        FaultSpec.parse("stall@decode-0"),
        FaultSpec.parse("drop"),
    )
    assert {
        "prefill-0/TP0": (corrupt, die, drop),
        "prefill-0/TP1": (corrupt, die, drop),
        "prefill-1/TP0": (corrupt, die, stall, drop),
        "prefill-1/TP1": (corrupt, die, stall, drop),
        "decode-0/TP0": (die,),
        "decode-0/TP1": (die, FaultSpec.parse("die")),
    } == plan


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"prefil-0": "corrupt"}, "fault target 'prefil-0' matches no agent"),
        ({"prefill-7": "corrupt"}, "fault target 'prefill-7' matches no agent"),
        ({"prefill-0/TP9": "corrupt"}, "fault target 'prefill-0/TP9' matches no agent"),
        ({"": "corrupt@nosuch"}, "peer 'nosuch' matches no agent on the other side"),
        ({"decode": "die@decode-0"}, "peer 'decode-0' matches no agent on the other side"),
        ({"decode-0": "corrupt"}, "fault corrupt:1 cannot act on 'decode-0': a decode rank acts only on die"),
    ],
    ids=["typo", "no-such-instance", "no-such-rank", "no-such-peer", "peer-of-the-same-role", "decode-corrupt"],
)
def test_a_fault_that_reaches_no_rank_is_an_error_naming_what_exists(faults, expected):
    """A target or peer matching no agent, or a kind no targeted rank acts on, raises and lists the cluster."""
    with pytest.raises(ConfigError) as raised:
        spec_of(faults).fault_plan()

    message = str(raised.value)
    assert expected in message
    if "cannot act" not in expected:
        assert "this cluster has prefill-0, prefill-1, decode-0 (ranks TP0, TP1)" in message


@pytest.mark.processes
def test_an_agent_process_refuses_a_fault_its_role_cannot_act_on():
    """`python -m transport.harness.agent --role decode --fault corrupt` exits 2 saying decode ranks act only on die."""
    command = [sys.executable, "-m", "transport.harness.agent", "--role", "decode", "--instance", "decode-0"]
    done = subprocess.run(
        [*command, "--bootstrap", "tcp://127.0.0.1:1", "--fault", "corrupt:0.5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 2
    assert "fault corrupt:0.5 cannot act on a decode rank: it acts only on die" in done.stderr
    assert "Traceback" not in done.stderr


def test_injector_keeps_a_rooms_decision_while_thousands_of_other_rooms_come_and_go():
    """20k other rooms decided and forgotten never re-roll a live room; forgetting it frees its decision."""
    injector = FaultInjector((FaultSpec.parse("corrupt:0.5"),), seed=11)
    live = {room: injector.pick(room, "decode-0/TP0") for room in range(50)}

    for other in range(10_000, 30_000):
        injector.pick(other, "decode-0/TP0")
        injector.forget(other)

    assert live == {room: injector.pick(room, "decode-0/TP0") for room in range(50)}
    assert {None, FaultKind.CORRUPT} == set(live.values())
    assert injector.rooms_decided == 50
    for room in live:
        injector.forget(room)
    assert injector.rooms_decided == 0


def test_a_rooms_fault_decision_holds_through_a_real_transfer_and_is_dropped_when_the_room_ends(make_manager, wait_for):
    """Rooms decided corrupt before 20k other decisions fail their checksum, the others succeed, and none stays."""
    injector = FaultInjector((FaultSpec.parse("corrupt:0.5"),), seed=5)
    rooms = range(101, 113)
    decided = {room: injector.pick(room, "decode-0/TP0") for room in rooms}
    for other in range(10**6, 10**6 + 20_000):  # more decisions than the old global clear allowed
        injector.pick(other, "decode-0/TP0")
        injector.forget(other)
    assert {None, FaultKind.CORRUPT} == set(decided.values())
    config = TransferConfig(chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", num_pages=256, config=config, faults=injector)
    decode = make_manager(Role.DECODE, "decode-0", num_pages=256, config=config)

    handles = {}
    for index, room in enumerate(rooms):
        pages = np.arange(index * 8, index * 8 + 8, dtype=np.uint32)
        prefill.pool.fill_pattern(pages, seed=room)
        sender, receiver = prefill.sender(room), decode.receiver(room, "prefill-0")
        receiver.init(pages)
        sender.send(pages)
        handles[room] = (sender, receiver)
    wait_for(
        lambda: all(s.poll().is_terminal and r.poll().is_terminal for s, r in handles.values()),
        timeout=30,
        what="every room ended on both sides",
    )

    outcomes = {room: receiver.reason_class or "ok" for room, (_, receiver) in handles.items()}
    assert {room: "checksum" if fault else "ok" for room, fault in decided.items()} == outcomes
    assert sum(f is FaultKind.CORRUPT for f in decided.values()) == prefill.counters()["fault_corrupt"]
    assert all(receiver.poll() is KVPoll.Success for room, (_, receiver) in handles.items() if not decided[room])
    for sender, receiver in handles.values():
        sender.release()
        receiver.release()
    wait_for(lambda: injector.rooms_decided == 0, what="every decision dropped once its room was released")
