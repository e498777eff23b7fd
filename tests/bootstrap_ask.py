"""One request to a bootstrap service from a chosen source address, for tests of its border (tests/transport and
tests/kvtop alike: this folder is on their import path, as `process_guard` is)."""

from __future__ import annotations

import zmq

from transport.wire import BootstrapReply, BootstrapRequest, FrameDecoder, encode


def ask(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, source: str, request: BootstrapRequest
) -> BootstrapReply:
    """One request to the service from the address `source` (ZeroMQ's source;destination form), its answer."""
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://{source}:0;{endpoint.removeprefix('tcp://')}")
    try:
        dealer.send(encode(request))
        assert dealer.poll(10_000), "the service did not answer"
        return FrameDecoder(BootstrapReply).decode(dealer.recv())
    finally:
        dealer.close()
