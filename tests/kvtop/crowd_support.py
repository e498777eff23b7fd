"""A crowd of real agents for views to list, in one process of its own: `python crowd_support.py COUNT`.

COUNT event publishers (one thread publishes for all of them, as the fan-in bench's agent processes do),
each registered with a bootstrap service of the crowd's own, each saying hello and beating every second.
The bootstrap's address is the first line on stdout; the crowd runs until its stdin closes. Views of a
crowd that large hold more sockets and files than a process gets by default: what the tests of those
limits need, without a process per agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from transport import BootstrapClient, BootstrapServer
from transport.limits import size_context
from transport.plane.events import AgentHello, Heartbeat
from transport.plane.publisher import EventPublisher, PublisherGroup
from transport.version import __version__
from transport.wire import AgentInfo

TP = 8


def run(count: int) -> None:
    size_context(zmq.Context.instance())  # a PUB and a ROUTER per agent, and each view's connections to them
    server = BootstrapServer(entry_ttl_s=3600.0, max_per_client=count).start()
    publishers = []
    for index in range(count):
        info = AgentInfo(
            "decode", f"decode-{index // TP}", index % TP, TP, 4096, "", "", os.getpid(), "localhost", index + 1
        )
        publishers.append(EventPublisher(info))
    group = PublisherGroup(publishers, "crowd").start()
    with BootstrapClient(server.endpoint, timeout_s=30.0) as client:
        for publisher in publishers:
            client.register(publisher.info)
            publisher.emit(AgentHello(time.time(), publisher.info, __version__, publisher.endpoint,
                                      publisher.snapshot_endpoint))  # fmt: skip
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(server.endpoint, flush=True)
    while not stop.wait(1.0):
        for publisher in publishers:
            publisher.emit(Heartbeat(time.time(), {}, 0, 0, 0.0, 0, 0.0, publisher.snapshot_endpoint))
    group.close()
    for publisher in publishers:
        publisher.close()
    server.close()


@contextmanager
def crowd(count: int) -> Iterator[str]:
    """Run a crowd of `count` agents for the block; yields its bootstrap address."""
    process = subprocess.Popen(
        [sys.executable, __file__, str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        address = process.stdout.readline().strip()
        assert address.startswith("tcp://"), f"the crowd did not start (exit {process.poll()})"
        yield address
    finally:
        process.stdin.close()
        try:
            process.wait(30.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


if __name__ == "__main__":
    run(int(sys.argv[1]))
