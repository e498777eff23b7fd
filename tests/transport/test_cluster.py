"""Real agent processes on loopback: transfers, a hostile control socket, and a rank killed mid-transfer."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from transport import FaultSpec, KVPoll, TransferConfig
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.harness.control import ControlClient, ControlError
from transport.wire import GetStats, Submitted, encode

PAGE_BYTES = 8192


def control_of(cluster: LocalCluster, control, label: str) -> ControlClient:
    """A control client for the agent registered as `label`."""
    agent = next(a for a in cluster.agents() if a.label == label)
    return control(agent.control_endpoint)


def run_room(prefill: ControlClient, decode: ControlClient, room: int, pages: int, timeout_s: float = 10.0):
    """Submit `room` to both ranks and return (prefill result, decode result)."""
    prefill.submit(room, pages)
    decode.submit(room, pages, prefill_instance="prefill-0")
    return prefill.wait_result(room, timeout_s), decode.wait_result(room, timeout_s)


def test_pages_arrive_byte_identical_between_processes(make_cluster, control):
    """Rooms moved between two agent processes succeed, and both ranks report the same digest of their pages."""
    spec = ClusterSpec(
        num_pages=128,
        page_bytes=PAGE_BYTES,
        transfer=TransferConfig(chunk_bytes=3 * PAGE_BYTES, window_bytes=12 * PAGE_BYTES),
    )
    cluster = make_cluster(spec)
    prefill = control_of(cluster, control, "prefill-0/TP0")
    decode = control_of(cluster, control, "decode-0/TP0")

    for room, pages in ((0x1111, 1), (0x2222, 40), (0x3333, 127)):
        prefill_result, decode_result = run_room(prefill, decode, room, pages)

        assert (KVPoll.Success, KVPoll.Success) == (prefill_result.state, decode_result.state)
        assert pages * PAGE_BYTES == decode_result.nbytes
        assert prefill.digest(room) == decode.digest(room)
    assert prefill.stats()["bytes_sent"] == decode.stats()["bytes_landed"] == 168 * PAGE_BYTES


def test_agent_control_socket_rejects_bad_frames_counts_them_and_keeps_serving(make_cluster, control):
    """Garbage to an agent's control ROUTER is counted under control_rejected_*; rooms still go through."""
    cluster = make_cluster(ClusterSpec(num_pages=64, page_bytes=PAGE_BYTES))
    prefill = control_of(cluster, control, "prefill-0/TP0")
    decode = control_of(cluster, control, "decode-0/TP0")
    request = encode(GetStats(1))
    bad = [
        b"",
        b"\x01\xc1 not msgpack",
        request[:-1],  # truncated
        encode(Submitted(1, 2)),  # a reply, not a request
        b"\x02" + request[1:],
        b"\x00",
    ]  # a frame above the socket's bound drops the connection instead: see test_size_bounds.py
    for client in (prefill, decode):
        for frame in bad:
            client.socket.send(frame)
        client.socket.send_multipart([request, b"extra frame"])

    for client in (prefill, decode):
        stats = client.stats()
        rejected = {key: value for key, value in stats.items() if key.startswith("control_rejected_")}
        assert rejected == {
            "control_rejected_malformed": 4,
            "control_rejected_unknown_version": 2,
            "control_rejected_oversize": 0,
            "control_rejected_truncated": 0,
            "control_rejected_unexpected": 1,
            "control_rejected_invalid": 0,
        }
        assert client.rejected == 0, "the agent answered a rejected frame with something unreadable"
    prefill_result, decode_result = run_room(prefill, decode, 0xC0FFEE, 20)
    assert (KVPoll.Success, KVPoll.Success) == (prefill_result.state, decode_result.state)
    assert prefill.digest(0xC0FFEE) == decode.digest(0xC0FFEE)


def test_sigkill_of_decode_mid_transfer_fails_the_room_on_prefill_within_the_liveness_timeout(
    make_cluster, control, wait_for, tmp_path: Path
):
    """Killing the decode process while chunks flow fails the prefill's room as its origin, in peer_timeout."""
    peer_timeout_s = 1.0
    spec = ClusterSpec(
        num_pages=64,
        page_bytes=4096,
        transfer=TransferConfig(
            chunk_bytes=4096, window_bytes=4 * 4096, heartbeat_s=0.2, peer_timeout_s=peer_timeout_s
        ),
        faults={"prefill-0": (FaultSpec.parse("delay"),)},  # 0.2 s per chunk: 48 chunks take ~10 s
        log_dir=str(tmp_path),
    )
    cluster = make_cluster(spec)
    prefill = control_of(cluster, control, "prefill-0/TP0")
    decode = control_of(cluster, control, "decode-0/TP0")
    room = 0xDEAD
    prefill.submit(room, 48)
    decode.submit(room, 48, prefill_instance="prefill-0")
    wait_for(lambda: decode.stats()["chunks_landed"] > 0, timeout=10, what="chunks land on decode")

    cluster.kill("decode-0/TP0")
    killed_at = time.monotonic()
    result = prefill.wait_result(room, 10)
    elapsed = time.monotonic() - killed_at

    assert result.state == KVPoll.Failed
    assert result.reason_class in {"peer_lost", "send_failed"}
    assert result.origin == "prefill-0/TP0"
    assert elapsed < 10  # the liveness timeout (1 s), not the transfer timeout (60 s); the rest: a loaded machine
    assert result.nbytes < 48 * 4096
    assert cluster.process("decode-0/TP0").process.returncode == -9
    log = (tmp_path / "prefill-0.log").read_text()
    assert f"Prefill transfer failed for request rank=0 req.rid='{room:x}' req.bootstrap_room={room}" in log
    assert f"with exception KVTransferError(bootstrap_room={room}): " in log


def test_prefill_tp_larger_than_decode_tp_succeeds_on_every_rank_between_processes(make_cluster, control):
    """Two prefill rank processes fill one decode rank process; all three report Success with every byte."""
    cluster = make_cluster(ClusterSpec(prefill_tp=2, decode_tp=1, num_pages=64, page_bytes=PAGE_BYTES))
    prefills = [control_of(cluster, control, f"prefill-0/TP{rank}") for rank in range(2)]
    decode = control_of(cluster, control, "decode-0/TP0")
    room = 0x7A7A

    for client in prefills:
        client.submit(room, 30)
    decode.submit(room, 30, prefill_instance="prefill-0")
    results = [client.wait_result(room, 10) for client in [*prefills, decode]]

    assert [KVPoll.Success] * 3 == [result.state for result in results]
    assert [result.nbytes for result in results] == [30 * PAGE_BYTES // 2] * 2 + [30 * PAGE_BYTES]


def test_cluster_stop_ends_every_agent_process(make_cluster):
    """Stopping a cluster ends all its agents and the bootstrap service answers no more registrations."""
    cluster = make_cluster(ClusterSpec(prefill=1, decode=2, num_pages=16, page_bytes=4096))
    assert {"prefill-0/TP0", "decode-0/TP0", "decode-1/TP0"} == {a.label for a in cluster.agents()}

    cluster.stop()

    assert all(p.process.returncode is not None for p in cluster.processes)


def test_agent_refuses_the_digest_of_a_room_it_never_finished(make_cluster, control):
    """Asking for the digest of an unknown room gets a refusal naming the room, not a made-up digest."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    prefill = control_of(cluster, control, "prefill-0/TP0")

    with pytest.raises(ControlError, match="no finished room 12345"):
        prefill.digest(12345, timeout_s=3)


@pytest.mark.processes
def test_a_stop_landing_while_an_agent_is_forked_still_ends_that_agent(monkeypatch):
    """SIGTERM raised in `Popen` (or before the cluster listed what it returned) lost that child: `stop()`
    never ended it, and `kvtop cluster up` stopped that way left an agent running (CI saw it). The signal here
    lands right after the second agent's fork; every child forked must have ended when `start` gives up."""
    forked: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen_then_sigterm(*args, **kwargs):
        forked.append(real_popen(*args, **kwargs))
        if len(forked) == 2:
            signal.raise_signal(signal.SIGTERM)
        return forked[-1]

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", popen_then_sigterm)
    previous = signal.signal(signal.SIGTERM, interrupt)
    cluster = LocalCluster(ClusterSpec(prefill=1, decode=2, num_pages=16, page_bytes=4096))
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.start()
        assert len(forked) == 2, "the stop came before the third agent"
        assert [child.poll() is not None for child in forked] == [True, True]
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in forked:
            if child.poll() is None:
                child.kill()
                child.wait()
