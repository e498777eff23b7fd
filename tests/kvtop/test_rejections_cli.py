"""Hostile frames on every socket kind of real agents are counted where `kvtop ranks --json` shows them.

The sockets: control, data and snapshot ROUTERs (DEALERs send garbage), event and consensus PUBs (XSUBs
send topics and non-subscriptions), and an agent's bootstrap DEALER (a bootstrap address that greets each
client with garbage replies before forwarding to the real service). Afterwards, rooms still end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque

import zmq
from kvtop_cli import kvtop

from transport import KVPoll
from transport.harness.cluster import ClusterSpec
from transport.sockets import bind_ephemeral

PAGE_BYTES = 8192
GARBAGE = [b"", b"\x01\xc1 not msgpack", b"\x02 a future wire version"]
GARBAGE_COUNTS = {"malformed": 2, "unknown_version": 1}
NOT_SUBSCRIPTIONS = [b"\x01a-topic", b"\x07 no subscription at all"]
NOT_SUBSCRIPTION_COUNTS = {"unexpected": 1, "malformed": 1}


class HostileBootstrap:
    """A bootstrap address that sends each new client `GARBAGE` replies, then forwards its requests upstream."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], upstream: str) -> None:
        self._context, self._upstream = context, upstream
        self._front = context.socket(zmq.ROUTER)
        self._front.linger = 0
        self.endpoint = bind_ephemeral(self._front, "127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        back = self._context.socket(zmq.DEALER)
        back.linger = 0
        back.connect(self._upstream)
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        greeted: set[bytes] = set()
        waiting: deque[bytes] = deque()  # the service answers in request order
        while not self._stop.is_set():
            ready = dict(poller.poll(50))
            if self._front in ready:
                identity, frame = self._front.recv_multipart()
                if identity not in greeted:
                    greeted.add(identity)
                    for garbage in GARBAGE:
                        self._front.send_multipart([identity, garbage])
                back.send(frame)
                waiting.append(identity)
            if back in ready:
                self._front.send_multipart([waiting.popleft(), back.recv()])
        back.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._front.close(linger=0)


def send_each(context: zmq.Context[zmq.Socket[bytes]], kind: int, endpoint: str, frames: list[bytes]) -> None:
    sock = context.socket(kind)
    sock.linger = 10_000  # close waits until every frame is out, even on a loaded machine
    sock.connect(endpoint)
    for frame in frames:
        sock.send(frame)
    sock.close()


def ranks_by_label(endpoint: str) -> dict[str, dict]:
    return {rank["label"]: rank for rank in json.loads(kvtop("ranks", "--bootstrap", endpoint, "--json").stdout)}


def test_hostile_frames_on_every_socket_are_counted_in_kvtop_ranks_and_rooms_still_end(
    make_cluster, control, zmq_context, wait_for
):
    """Garbage to control, data, snapshot, event, consensus and bootstrap sockets: each counted, rooms succeed."""
    cluster = make_cluster(ClusterSpec(prefill_tp=2, num_pages=64, page_bytes=PAGE_BYTES))
    hostile = HostileBootstrap(zmq_context, cluster.endpoint)
    extra = subprocess.Popen(
        [sys.executable, "-m", "transport.harness.agent", "--role", "decode", "--instance", "decode-7",
         "--bootstrap", hostile.endpoint, "--pages", "64", "--page-bytes", str(PAGE_BYTES)],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: "decode-7/TP0" in {a.label for a in cluster.agents()}, timeout=20, what="decode-7 registers")
        target = next(a for a in cluster.agents() if a.label == "prefill-0/TP0")
        send_each(zmq_context, zmq.DEALER, target.control_endpoint, GARBAGE)
        send_each(zmq_context, zmq.DEALER, target.data_endpoint, GARBAGE)
        send_each(zmq_context, zmq.DEALER, target.snapshot_endpoint, GARBAGE)
        send_each(zmq_context, zmq.XSUB, target.event_endpoint, NOT_SUBSCRIPTIONS)
        send_each(zmq_context, zmq.XSUB, target.consensus_endpoint, NOT_SUBSCRIPTIONS)

        expected = {
            "control": GARBAGE_COUNTS,
            "data": GARBAGE_COUNTS,
            "snapshot": GARBAGE_COUNTS,
            "events": NOT_SUBSCRIPTION_COUNTS,
            "consensus": NOT_SUBSCRIPTION_COUNTS,
        }

        seen: list[dict] = []

        def counted() -> bool:
            ranks = ranks_by_label(cluster.endpoint)
            rejected = {socket: ranks["prefill-0/TP0"]["rejected"].get(socket) for socket in expected}
            seen[:] = [rejected, ranks["decode-7/TP0"]["rejected"]]
            return rejected == expected and seen[1].get("bootstrap") == {"malformed": 4, "unknown_version": 2}

        try:
            wait_for(counted, timeout=30, what="every socket's rejections in kvtop ranks --json")
        except AssertionError as missing:
            raise AssertionError(f"{missing}; last seen: {seen}") from None

        prefills = [control(a.control_endpoint) for a in cluster.agents() if a.instance == "prefill-0"]
        decode = control(next(a.control_endpoint for a in cluster.agents() if a.label == "decode-7/TP0"))
        for prefill in prefills:
            prefill.submit(0x7E57, 8)
        decode.submit(0x7E57, 8, prefill_instance="prefill-0")
        assert KVPoll.Success == decode.wait_result(0x7E57, 15.0).state
        assert [KVPoll.Success] * 2 == [prefill.wait_result(0x7E57, 15.0).state for prefill in prefills]
        assert ranks_by_label(cluster.endpoint)["prefill-0/TP0"]["state"] == "alive"
    finally:
        extra.terminate()
        extra.wait(10)
        hostile.close()
