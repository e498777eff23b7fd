"""Every socket bounds its inbound frames: a 64 MiB frame costs an agent a dropped connection, not memory."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

import transport
from transport import KVPoll
from transport.harness.cluster import ClusterSpec
from transport.plane.events import EventBatch, Heartbeat
from transport.plane.subscriber import EventSubscriber

GROWTH_ALLOWED = 40 << 20
HOSTILE = """
import socket, struct, sys, time
# ZMTP 3.0 by hand (a libzmq XSUB would itself choke on a 64 MiB subscription): greeting, READY, one long frame
body = b"\\x01" + bytes(64 << 20)  # to a PUB, a subscription to a 64 MiB topic; to a ROUTER, a 64 MiB request
for endpoint, socket_type in zip(sys.argv[1:], (b"SUB", b"SUB", b"DEALER", b"DEALER")):
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    conn.sendall(b"\\xff" + bytes(8) + b"\\x7f\\x03\\x00" + b"NULL".ljust(20, b"\\0") + bytes(32))
    ready = b"\\x05READY\\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    conn.sendall(b"\\x04" + bytes([len(ready)]) + ready)
    try:
        conn.sendall(b"\\x02" + struct.pack(">Q", len(body)) + body)
    except OSError:
        pass  # the agent hung up before the whole frame: what a bound does
    conn.close()
"""


def test_every_transport_socket_is_opened_through_the_bounded_helper():
    """No module of transport/ creates a ZeroMQ socket except `sockets.open_socket`, which sets MAXMSGSIZE."""
    root = Path(transport.__file__).parent
    offenders = [
        path.name
        for path in root.rglob("*.py")
        if path.name != "sockets.py" and re.search(r"\.socket\((zmq\.|kind)", path.read_text())
    ]
    assert offenders == []


def test_a_64_mib_frame_to_the_event_pub_consensus_pub_and_routers_does_not_grow_the_agent(
    make_cluster, control, wait_for
):
    """64 MiB frames to an agent's event PUB, consensus PUB, control and data ROUTERs: RSS flat, its events still
    flow, rooms still end."""
    cluster = make_cluster(ClusterSpec(prefill_tp=2, num_pages=64, page_bytes=8192))
    target = next(a for a in cluster.agents() if a.label == "prefill-0/TP0")
    agent = psutil.Process(target.pid)
    before = agent.memory_info().rss

    endpoints = [target.event_endpoint, target.consensus_endpoint, target.control_endpoint, target.data_endpoint]
    hostile = subprocess.Popen([sys.executable, "-c", HOSTILE, *endpoints])
    peak = before
    while hostile.poll() is None:
        peak = max(peak, agent.memory_info().rss)
        time.sleep(0.005)
    assert hostile.returncode == 0

    def fresh_heartbeat() -> bool:
        """Whether a heartbeat newer than the attack arrived; RSS is sampled meanwhile (the io thread may
        still be digesting what was sent)."""
        nonlocal peak
        peak = max(peak, agent.memory_info().rss)
        return any(
            isinstance(event, Heartbeat) and event.ts > since
            for delivered in subscriber.poll(0.05)
            if isinstance(delivered.item, EventBatch)
            for event in delivered.item.events
        )

    subscriber = EventSubscriber()
    try:
        subscriber.connect(target)
        since = time.time()
        assert wait_for(fresh_heartbeat, what="a fresh heartbeat: its events still flow")
    finally:
        subscriber.close()
    growth = peak - before
    assert growth < GROWTH_ALLOWED, f"the agent grew by {growth >> 20} MiB"
    prefills = [
        control(a.control_endpoint) for a in sorted(cluster.agents(), key=lambda a: a.label) if a.role == "prefill"
    ]
    decode = control(next(a.control_endpoint for a in cluster.agents() if a.role == "decode"))
    for room in (0xB16, 0xB17):
        for prefill in prefills:
            prefill.submit(room, 8)
        decode.submit(room, 8, prefill_instance="prefill-0")
        assert KVPoll.Success == decode.wait_result(room, 15.0).state
        assert [KVPoll.Success] * 2 == [prefill.wait_result(room, 15.0).state for prefill in prefills]
