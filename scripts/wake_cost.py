"""CPU a thread spends per wake-up on this machine: a blocking `recv` against an engine's `zmq_poll`.

A rank's engines wake for nearly every ack and every few chunks; on a small VM each wake-up (the context
switch, the scheduler, the caches refilled) costs more thread CPU than the Python that follows it. This
script measures that cost alone: a sender process sends a small message every `--period-ms`; the receiving
thread waits for each one either in a blocking `recv` (the least work's receiver) or in `zmq.Poller.poll`
over the data socket, a pipe and `--idle` more sockets (a rank's engine: wake pipe, bootstrap DEALER,
consensus), then reads until the socket is empty, as the engine does. Rounds alternate; medians of thread
CPU per wake-up are printed with their ratio. Exits 1 when a message is lost. Not part of the tests.

    .venv/bin/python scripts/wake_cost.py                # 5 rounds of 2000 messages each way
    .venv/bin/python scripts/wake_cost.py --idle 3 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import zmq

_END = b"end"
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def _sender(endpoint: str, messages: int, period_s: float) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.connect(endpoint)
    for _ in range(messages):
        sock.send(b"ack" * 8)
        time.sleep(period_s)
    sock.send(_END)
    sock.close(linger=-1)
    context.term()


def _wait_in_recv(sock: zmq.Socket[bytes]) -> tuple[int, int]:
    """(wake-ups, messages) until the end message, blocking in `recv`."""
    wakes = received = 0
    while True:
        frames = sock.recv_multipart()
        wakes += 1
        received += 1
        if frames[-1] == _END:
            return wakes, received


def _wait_in_poll(sock: zmq.Socket[bytes], idle: int) -> tuple[int, int]:
    """(wake-ups, messages) until the end message, waiting in `zmq_poll` as an engine does."""
    poller = zmq.Poller()
    read_end, write_end = os.pipe()
    poller.register(read_end, zmq.POLLIN)
    spare = [sock.context.socket(zmq.DEALER) for _ in range(idle)]
    for other in spare:
        poller.register(other, zmq.POLLIN)
    poller.register(sock, zmq.POLLIN)
    wakes = received = 0
    try:
        while True:
            poller.poll(1000)
            wakes += 1
            while sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option
                frames = sock.recv_multipart(zmq.NOBLOCK)
                received += 1
                if frames[-1] == _END:
                    return wakes, received
    finally:
        for other in spare:
            other.close(linger=0)
        os.close(read_end)
        os.close(write_end)


def measure(way: str, messages: int, period_s: float, idle: int) -> float:
    """Thread CPU microseconds per wake-up of one round."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sender = mp.get_context("spawn").Process(target=_sender, args=(f"tcp://127.0.0.1:{port}", messages, period_s))
    sender.start()
    try:
        sock.recv_multipart()  # the first message: the sender is up
        started = time.thread_time()
        wakes, received = _wait_in_recv(sock) if way == "recv" else _wait_in_poll(sock, idle)
        spent = time.thread_time() - started
    finally:
        sender.join(30)
        sock.close()
        context.term()
    if received != messages:  # every message but the first, and the end message
        sys.exit(f"{way}: {received} messages of {messages} arrived")
    return spent / wakes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--period-ms", type=float, default=0.7, help="between messages (an ack's spacing)")
    parser.add_argument("--idle", type=int, default=1, help="idle sockets beside the data socket and the pipe")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"recv": [], "poll": []}
    for _ in range(args.rounds):
        for way, runs in results.items():
            runs.append(measure(way, args.messages, args.period_ms / 1000, args.idle))
    recv, poll = (statistics.median(runs) for runs in results.values())
    print(f"thread CPU per wake-up, medians of {args.rounds} rounds of {args.messages} messages:")
    print(f"  blocking recv                              {recv:6.1f} us")
    print(f"  zmq_poll over socket, pipe, {args.idle} idle socket(s) {poll:6.1f} us  ({poll / recv:.2f} x)")


if __name__ == "__main__":
    main()
