"""Registered memory (a KV pool) goes out zero-copy without pyzmq's garbage collector, byte for byte."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import zmq
from zmq.utils.garbage import gc as pyzmq_gc

from transport import KVPoll, Role
from transport.errors import ConfigError
from transport.kv import registered
from transport.kv.pool import KVPool
from transport.kv.registered import RegisteredMemory, registered_sends

_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)


@pytest.fixture
def pair():
    """A connected PAIR of sockets over TCP (the I/O thread sends, as on a data link)."""
    context = zmq.Context()
    server, client = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    server.rcvtimeo = 10_000
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port}")
    yield client, server
    client.close(linger=0)
    server.close(linger=0)
    context.term()


def _memory(nbytes: int = 1 << 16) -> tuple[np.ndarray, RegisteredMemory]:
    buffer = np.random.default_rng(3).integers(0, 256, size=nbytes, dtype=np.uint8)
    return buffer, RegisteredMemory(buffer.data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pyzmq's Linux wheels export libzmq's calls")
def test_this_process_sends_registered_memory_without_the_garbage_collector():
    """On Linux with pyzmq's wheels the libzmq calls resolve: a regression here costs every prefill rank a gc
    round trip per chunk."""
    assert registered_sends()


def test_slices_arrive_byte_identical_after_frames_pyzmq_sent(pair):
    """A multipart message: a pyzmq frame, then two registered slices; each frame holds exactly its bytes."""
    client, server = pair
    buffer, memory = _memory()
    client.send(b"header", _MORE)
    memory.send(client, 100, 5000, _MORE)
    memory.send(client, 40_000, 25_536, _NOBLOCK)

    frames = server.recv_multipart()

    assert frames == [b"header", buffer[100:5100].tobytes(), buffer[40_000:].tobytes()]


def test_registered_sends_file_nothing_with_pyzmq_garbage_collector(pair, monkeypatch):
    """Frames sent from registered memory are not filed with pyzmq's gc (no per-frame round trip through its
    thread); pyzmq's own zero-copy send files each, as the comparison shows."""
    if not registered_sends():
        pytest.skip("no libzmq calls here: registered memory goes through pyzmq")
    client, server = pair
    buffer, memory = _memory()
    filed: list[int] = []
    store = pyzmq_gc.store
    monkeypatch.setattr(pyzmq_gc, "store", lambda obj, event=None: filed.append(len(obj)) or store(obj, event))
    client.send(buffer.data, _NOBLOCK, copy=False)  # 64 KiB: pyzmq's copy threshold, so zero-copy
    assert filed == [1 << 16], "pyzmq's zero-copy send files its buffer"
    server.recv()

    for offset in range(0, 1 << 16, 4096):
        memory.send(client, offset, 4096, _NOBLOCK)

    assert filed == [1 << 16]
    assert b"".join(server.recv() for _ in range(16)) == buffer.tobytes()


def test_without_libzmq_calls_the_same_bytes_go_through_pyzmq(pair, monkeypatch):
    """Where libzmq's zmq_send_const is not at hand, a registered send is pyzmq's zero-copy send of the slice."""
    monkeypatch.setattr(registered, "_SEND_CONST", None)
    client, server = pair
    buffer, memory = _memory()
    memory.send(client, 7, 1000, _NOBLOCK)

    assert server.recv() == buffer[7:1007].tobytes()


@pytest.mark.parametrize(("offset", "nbytes"), [(-1, 10), (0, (1 << 16) + 1), ((1 << 16) - 4, 5), (5, -1)])
def test_a_slice_outside_the_buffer_is_refused_before_anything_is_read(pair, offset, nbytes):
    """Memory safety: a slice that is not inside the registered buffer raises ValueError and sends nothing."""
    client, server = pair
    _, memory = _memory()
    with pytest.raises(ValueError, match="outside a registered buffer"):
        memory.send(client, offset, nbytes, _NOBLOCK)
    client.send(b"after", _NOBLOCK)
    assert server.recv() == b"after"


def test_a_send_that_would_block_raises_again_like_pyzmq():
    """No peer and NOBLOCK: zmq.Again, as pyzmq raises it, and the socket stays usable."""
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    try:
        _, memory = _memory()
        with pytest.raises(zmq.Again):
            memory.send(push, 0, 4096, _NOBLOCK)
        with pytest.raises(zmq.Again):
            push.send(b"x", _NOBLOCK)
    finally:
        push.close(linger=0)
        context.term()


def test_a_page_outside_the_pool_is_refused_where_the_scheduler_hands_it_over(make_manager):
    """send() and init() raise ConfigError for a page the pool does not have: the engine never reads or lands
    outside its pool (its sends of pool rows are registered memory, which would not be bounds-checked by Python
    slicing)."""
    prefill = make_manager(Role.PREFILL, "prefill-0", num_pages=8)
    decode = make_manager(Role.DECODE, "decode-0", num_pages=8)
    sender = prefill.sender(5)
    receiver = decode.receiver(5, "prefill-0")

    with pytest.raises(ConfigError, match="page 8 is outside a pool of 8 pages"):
        sender.send([0, 8])
    with pytest.raises(ConfigError, match="page 9 is outside a pool of 8 pages"):
        receiver.init([9, 1])
    assert sender.poll() is KVPoll.Bootstrapping


def test_pool_check_pages_passes_its_own_pages_through():
    pool = KVPool(4, 64)
    pages = pool.allocate(4)
    assert pool.check_pages(pages) is pages
