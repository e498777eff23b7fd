"""A subscriber's close ends whatever its context holds: a Ctrl-C that lands while a socket is being made leaves one
nobody tracks, and `Context.term()` waited on it forever (`kvtop status --connect ...` interrupted while it
connected hung in 5 of 30 tries on a loaded machine)."""

from __future__ import annotations

import threading

import zmq

from transport.plane.subscriber import EventSubscriber


def test_close_ends_even_a_socket_of_its_context_it_never_tracked():
    subscriber = EventSubscriber()
    orphan = subscriber._context.socket(zmq.DEALER)  # as a Ctrl-C between a socket's making and its keeping leaves it
    orphan.connect("tcp://127.0.0.1:9")
    orphan.send(b"queued: a linger would hold it")
    closing = threading.Thread(target=subscriber.close, daemon=True)

    closing.start()
    closing.join(timeout=10)

    assert not closing.is_alive(), "close() waited on a socket its context still held"
    assert orphan.closed
