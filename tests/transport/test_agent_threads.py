"""An agent process survives any consensus vote, and a thread of it that dies anyway is loud.

The hostile votes come over the real consensus socket of a rank of the same
instance (an in-process `KVManager`, decode-0/TP1) into a real agent process
(decode-0/TP0); the dying threads are real agent processes whose engine or
publisher meets an exception nobody planned for.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from transport import BootstrapServer, KVManager, KVPoll, Role, TransferConfig
from transport.harness.agent import AgentOptions, child_args
from transport.wire import Vote, VoteEntry, encode

pytestmark = pytest.mark.processes

PAGE_BYTES = 8192
PAGES = 8
FAST = TransferConfig(chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES, heartbeat_s=0.2, peer_timeout_s=2.0)

AgentSpawner = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn_agent(bootstrap: BootstrapServer, tmp_path: Path) -> Iterator[AgentSpawner]:
    """Start agent processes (`python -m transport.harness.agent`, or `script` in their place); all end at teardown."""
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(role: Role, instance: str, *, rank: int = 0, tp: int = 1, script: str = "") -> subprocess.Popen[bytes]:
        options = AgentOptions(
            role=role,
            instance=instance,
            rank=rank,
            tp=tp,
            bootstrap=bootstrap.endpoint,
            num_pages=64,
            page_bytes=PAGE_BYTES // (tp if role is Role.DECODE else 1),
            transfer=FAST,
            log_file=str(tmp_path / f"{instance}-{rank}.log"),
        )
        entry = ["-c", script] if script else ["-m", "transport.harness.agent"]
        process = subprocess.Popen([sys.executable, *entry, *child_args(options)], stdin=subprocess.DEVNULL)
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def registered(bootstrap: BootstrapServer, wait_for, label: str) -> str:
    """Wait until `label` registered; its control endpoint."""
    agent = wait_for(
        lambda: next((a for a in bootstrap.agents() if a.label == label), None), timeout=20, what=f"{label} registers"
    )
    return agent.control_endpoint


def hostile_votes(incarnation: int, room: int) -> list[bytes]:
    """Votes that break the consensus schema (state 7, an unknown class, NaN, huge numbers) or its sender."""
    return [
        encode(Vote(1, incarnation, [VoteEntry(room, 7)])),
        encode(Vote(1, incarnation, [VoteEntry(room, 0, "decode-0/TP1", "bad", "no_such_class")])),  # type: ignore[arg-type]
        encode(Vote(1, incarnation, [VoteEntry(room, math.nan)])),  # type: ignore[arg-type]
        encode(Vote(1, incarnation, [VoteEntry(room, 1 << 62)])),
        encode(Vote(1, incarnation, [VoteEntry((1 << 64) - 1, 4)])),
        encode(Vote(1, incarnation, [VoteEntry(room, 4, "x" * 100_000)])),
        msgspec.msgpack.encode(Vote(1, incarnation, [])),  # no version byte
        encode(Vote(9, incarnation, [VoteEntry(room, 0, "decode-0/TP9", "spoofed", "other")])),  # type: ignore[arg-type]
    ]


def test_hostile_consensus_votes_are_rejected_counted_and_the_agent_keeps_finishing_rooms(
    bootstrap, spawn_agent, make_manager, control, subscribe, wait_for
):
    """Every bad vote from decode-0/TP1 is counted as a rejection of the consensus socket (GetStats and heartbeat) by
    the decode-0/TP0 process, whose engine lives on: rooms before and after succeed on all three ranks."""
    spawn_agent(Role.PREFILL, "prefill-0")
    spawn_agent(Role.DECODE, "decode-0", rank=0, tp=2)
    peer: KVManager = make_manager(
        Role.DECODE, "decode-0", rank=1, tp=2, num_pages=64, page_bytes=PAGE_BYTES // 2, config=FAST
    )
    prefill = control(registered(bootstrap, wait_for, "prefill-0/TP0"))
    victim = control(registered(bootstrap, wait_for, "decode-0/TP0"))
    events = subscribe([a for a in bootstrap.agents() if a.label == "decode-0/TP0"])

    def run_room(room: int) -> list[KVPoll]:
        prefill.submit(room, PAGES)
        victim.submit(room, PAGES, prefill_instance="prefill-0")
        receiver = peer.receiver(room, "prefill-0")
        receiver.init(np.arange(PAGES, dtype=np.uint32))
        results = [client.wait_result(room, 15) for client in (prefill, victim)]
        wait_for(lambda: receiver.agreed().is_terminal, what=f"decode-0/TP1 agrees on room {room}")
        receiver.release()
        return [KVPoll(r.state) for r in results] + [receiver.agreed()]

    assert [KVPoll.Success] * 3 == run_room(0x2001)
    consensus = peer._consensus
    assert consensus is not None
    for frame in hostile_votes(peer.info.incarnation, 0x2002):
        peer._call_soon(lambda frame=frame: consensus.publisher.send(frame))  # on its engine thread, which owns the PUB

    expected = {"malformed": 6, "unknown_version": 1, "unexpected": 1}
    stats = wait_for(
        lambda: (s := victim.stats()) and s["rejected_unexpected"] == 1 and s, what="the votes are counted"
    )
    assert expected == {reason: stats[f"rejected_{reason}"] for reason in expected}
    heartbeat = events.wait(
        lambda: (hb := events.heartbeat("decode-0/TP0")) and hb.rejected.get("consensus", {}).get("unexpected") and hb,
        what="a heartbeat carrying the rejections",
    )
    assert expected == {reason: heartbeat.rejected["consensus"][reason] for reason in expected}
    assert [KVPoll.Success] * 3 == run_room(0x2002)
    assert [KVPoll.Success] * 3 == run_room(0x2003)


BROKEN_AGENT = """
import sys
from transport.harness.agent import main
from transport.kv.decode import DecodeSide
from transport.plane.publisher import EventPublisher

owner = {"engine": DecodeSide, "publisher": EventPublisher}[THREAD]
method = "tick" if owner is DecodeSide else "_publish"
original, calls = getattr(owner, method), []

def broken(self, *args):
    calls.append(None)
    if len(calls) == 5:
        raise RuntimeError("a bug nobody planned for")
    return original(self, *args)

setattr(owner, method, broken)
main(sys.argv[1:])
"""


@pytest.mark.parametrize(("thread", "name"), [("engine", "kv-engine-decode-0-0"), ("publisher", "events-decode-0/TP0")])
def test_an_agent_whose_thread_dies_logs_the_traceback_and_exits_1(
    bootstrap, spawn_agent, wait_for, tmp_path, thread, name
):
    """A RuntimeError on the engine (or publisher) thread of a real agent: the log holds the traceback and
    which thread died, and the process exits with status 1 instead of hanging; it stays listed, so views name it
    gone (it deregistered on its way out, and `check` said every rank alive)."""
    process = spawn_agent(Role.DECODE, "decode-0", script=BROKEN_AGENT.replace("THREAD", repr(thread)))

    assert process.wait(20) == 1
    assert [agent.label for agent in bootstrap.agents()] == ["decode-0/TP0"]

    log = (tmp_path / "decode-0-0.log").read_text()
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: a bug nobody planned for" in log
    assert f"thread {name} died" in log
