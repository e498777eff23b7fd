"""Every socket rejects and counts frames that break the wire format, and keeps serving.

The sockets: the bootstrap ROUTER, a prefill rank's data ROUTER, a decode
rank's data DEALERs (fed by a fake prefill), and an agent's control ROUTER
(in `test_cluster.py`). After the garbage, a normal transfer must succeed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest
import xxhash
import zmq

from transport import BootstrapClient, KVPoll, Role, TransferConfig
from transport.sockets import bind_ephemeral
from transport.wire import (
    MAX_CONTROL_FRAME,
    Ack,
    AgentInfo,
    Chunk,
    FrameDecoder,
    Heartbeat,
    Hello,
    LinkMessage,
    Register,
    Registered,
    Status,
    TransferRequest,
    Welcome,
    encode,
)

PAGE_BYTES = 4096


def bad_frames(
    valid: msgspec.Struct, wrong_union: msgspec.Struct, oversize: bool = True
) -> Iterator[tuple[str, bytes]]:
    """(counter reason, frame) for each way a single frame can break the format.

    `oversize` adds a frame just above the decoders' limit: only for sockets whose size bound
    (transport/sockets.py) lets it through; a smaller bound makes libzmq drop the connection instead.
    """
    good = encode(valid)
    yield "malformed", b""
    yield "malformed", b"\x01\xc1 not msgpack"
    yield "malformed", good[: len(good) // 2]  # truncated body
    yield "malformed", encode(wrong_union)  # a valid message of another socket
    yield "unknown_version", b"\x02" + good[1:]
    yield "unknown_version", b"\xff"
    if oversize:
        yield "oversize", b"\x01" + bytes(MAX_CONTROL_FRAME)


def expected_counts(
    valid: msgspec.Struct, wrong_union: msgspec.Struct, unexpected: int, oversize: bool = True
) -> dict[str, int]:
    counts = {"rejected_malformed": 0, "rejected_unknown_version": 0, "rejected_oversize": 0}
    for reason, _ in bad_frames(valid, wrong_union, oversize):
        counts[f"rejected_{reason}"] += 1
    counts["rejected_unexpected"] = unexpected
    return counts


def rejected(counters: dict[str, int]) -> dict[str, int]:
    keys = ("rejected_malformed", "rejected_unknown_version", "rejected_oversize", "rejected_unexpected")
    return {key: counters[key] for key in keys}


def fake_agent(role: str, instance: str, data_endpoint: str = "") -> AgentInfo:
    return AgentInfo(role, instance, 0, 1, PAGE_BYTES, data_endpoint, "", os.getpid(), "test", 7)


def dealer(context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def run_transfer(make_manager, wait_for, room: int, prefill_instance: str = "prefill-ok") -> None:
    """A fresh prefill/decode pair moves one room; asserts success and identical bytes."""
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, prefill_instance, config=config)
    decode = make_manager(Role.DECODE, f"decode-for-{prefill_instance}", config=config)
    check_transfer(prefill, decode, wait_for, room)


def check_transfer(prefill, decode, wait_for, room: int) -> None:
    src, dst = np.arange(3, 19, dtype=np.uint32), np.arange(30, 46, dtype=np.uint32)
    prefill.pool.fill_pattern(src, seed=room)
    sender = prefill.sender(room)
    receiver = decode.receiver(room, prefill.info.instance)
    receiver.init(dst)
    sender.send(src)
    wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what=f"room {room}")
    assert np.array_equal(prefill.pool.data[src], decode.pool.data[dst])


def test_bootstrap_rejects_bad_frames_counts_them_and_keeps_serving(bootstrap, make_manager, zmq_context, wait_for):
    """Garbage to the bootstrap ROUTER is counted by reason and unanswered; registration and transfers still work."""
    valid, wrong = Register(1, fake_agent("prefill", "x")), Registered(1)
    sock = dealer(zmq_context, bootstrap.endpoint)
    for _, frame in bad_frames(valid, wrong, oversize=False):
        sock.send(frame)
    sock.send_multipart([encode(valid), b"extra frame"])

    expected = expected_counts(valid, wrong, unexpected=1, oversize=False)
    wait_for(lambda: expected == rejected(bootstrap.counters.snapshot()), what="bootstrap counts every bad frame")
    assert bootstrap.counters["requests"] == 0
    assert sock.poll(50) == 0, "the bootstrap answered a rejected frame"
    with BootstrapClient(bootstrap.endpoint, context=zmq_context) as client:
        client.register(fake_agent("prefill", "registered-after-garbage", "tcp://127.0.0.1:9"))
        assert [a.instance for a in client.resolve("registered-after-garbage")] == ["registered-after-garbage"]
    run_transfer(make_manager, wait_for, room=71)


def test_prefill_data_socket_rejects_bad_frames_counts_them_and_keeps_serving(make_manager, zmq_context, wait_for):
    """Garbage to a prefill rank's data ROUTER is counted under rejected_*; the rank then serves a real decode."""
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config)
    valid, wrong = Hello(fake_agent("decode", "decode-9"), 1 << 20), Registered(1)
    sock = dealer(zmq_context, prefill.info.data_endpoint)
    for _, frame in bad_frames(valid, wrong):
        sock.send(frame)
    sock.send_multipart([encode(valid), b"extra frame"])
    sock.send(encode(Heartbeat(1.0)))  # well-formed, but this peer never said Hello

    expected = expected_counts(valid, wrong, unexpected=2)
    wait_for(lambda: expected == rejected(prefill.counters()), what="prefill counts every bad frame")
    assert sock.poll(50) == 0, "the prefill answered a rejected frame"
    decode = make_manager(Role.DECODE, "decode-0", config=config)
    check_transfer(prefill, decode, wait_for, room=72)


def test_an_ack_of_more_bytes_than_any_room_moves_is_malformed_and_the_rank_serves_on(
    make_manager, zmq_context, wait_for
):
    """A decode peer acked 2**64-1 bytes of a room: the prefill rank's progress event could not be encoded and its
    event publisher died (the rank exited). Acks are bounded where they enter, and a rank credits no more than it
    sent."""
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config)
    sock = dealer(zmq_context, prefill.info.data_endpoint)
    sock.send(encode(Hello(fake_agent("decode", "decode-9"), 1 << 20)))
    assert sock.poll(5000), "the prefill welcomes the peer"
    sock.recv()

    sock.send(encode(Ack([(5, 2**64 - 1), (5, 2**64 - 1)])))

    wait_for(lambda: prefill.counters()["rejected_malformed"] == 1, what="the ack counted malformed")
    assert prefill.dead_thread() is None
    check_transfer(prefill, make_manager(Role.DECODE, "decode-0", config=config), wait_for, room=73)


@pytest.mark.parametrize(
    "dst_pages",
    [b"\x01\x00\x00", b"\x00" * 9],
    ids=["three-bytes", "nine-bytes"],
)
def test_prefill_rejects_a_request_whose_page_list_is_not_whole_uint32s(make_manager, zmq_context, wait_for, dst_pages):
    """A transfer request whose destination list is not a whole number of uint32 is counted, not fatal."""
    config = TransferConfig(chunk_bytes=4 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config)
    sock = dealer(zmq_context, prefill.info.data_endpoint)
    sock.send(encode(Hello(fake_agent("decode", "decode-9"), 1 << 20)))
    assert sock.poll(3000) and isinstance(FrameDecoder(LinkMessage).decode(sock.recv()), Welcome)

    sock.send(encode(TransferRequest(73, 0, dst_pages, 0, 0, PAGE_BYTES, 1)))

    wait_for(lambda: prefill.counters()["rejected_malformed"] == 1, what="the bad request is counted")
    decode = make_manager(Role.DECODE, "decode-0", config=config)
    check_transfer(prefill, decode, wait_for, room=74)


def test_prefill_refuses_a_request_with_a_negative_source_offset(make_manager, zmq_context, wait_for):
    """A request for bytes before the start of a page fails the room as a layout mismatch instead of sending junk."""
    prefill = make_manager(Role.PREFILL, "prefill-0")
    sock = dealer(zmq_context, prefill.info.data_endpoint)
    decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
    sock.send(encode(Hello(fake_agent("decode", "decode-9"), 1 << 20)))
    assert sock.poll(3000) and isinstance(decoder.decode(sock.recv()), Welcome)
    sender = prefill.sender(75)
    sender.send(np.arange(2, dtype=np.uint32))

    sock.send(encode(TransferRequest(75, 0, np.arange(2, dtype="<u4").tobytes(), -PAGE_BYTES, 0, PAGE_BYTES, 1)))

    wait_for(lambda: sender.poll() is KVPoll.Failed)
    assert sender.failure is not None and "mismatched KV layouts" in sender.failure.failure_reason
    assert sock.poll(3000)
    status = decoder.decode(sock.recv())
    assert isinstance(status, Status) and KVPoll.Failed == status.state
    assert prefill.counters()["chunks_sent"] == 0


class FakePrefill:
    """A ROUTER registered as prefill instance `fake-prefill`, speaking the link protocol by hand."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], bootstrap_endpoint: str) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.info = fake_agent("prefill", "fake-prefill", bind_ephemeral(self.socket, "127.0.0.1"))
        self.decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
        self.peer = b""
        with BootstrapClient(bootstrap_endpoint, context=context) as client:
            client.register(self.info)

    def expect(self, kind: type, timeout_s: float = 3.0):
        """The next message of type `kind` from the decode (heartbeats and acks in between are skipped)."""
        while self.socket.poll(int(timeout_s * 1000)):
            identity, frame = self.socket.recv_multipart()
            message = self.decoder.decode(frame)
            if isinstance(message, kind):
                self.peer = identity
                return message
        raise AssertionError(f"no {kind.__name__} from the decode within {timeout_s}s")

    def send(self, *frames: bytes) -> None:
        self.socket.send_multipart([self.peer, *frames])

    def greet(self) -> TransferRequest:
        """Welcome the decode's Hello; its first transfer request."""
        self.expect(Hello)
        self.send(encode(Welcome(self.info)))
        return self.expect(TransferRequest)


def test_decode_link_rejects_bad_frames_and_truncated_chunks_and_keeps_serving(
    bootstrap, make_manager, zmq_context, wait_for
):
    """Garbage and chunk headers without their payload, sent by a prefill, are counted; the link still lands KV."""
    decode = make_manager(Role.DECODE, "decode-0", config=TransferConfig(peer_timeout_s=30.0))
    fake = FakePrefill(zmq_context, bootstrap.endpoint)
    good_room, broken_room = 81, 82
    good = decode.receiver(good_room, "fake-prefill")
    good.init(np.arange(10, 14, dtype=np.uint32))
    assert good_room == fake.greet().room
    broken = decode.receiver(broken_room, "fake-prefill")
    broken.init(np.arange(20, 22, dtype=np.uint32))
    assert broken_room == fake.expect(TransferRequest).room

    valid, wrong = Heartbeat(1.0), Registered(1)
    for _, frame in bad_frames(valid, wrong, oversize=False):
        fake.send(frame)
    fake.send(encode(TransferRequest(1, 0, b"", 0, 0, 1, 1)))  # a decode-to-prefill message, wrong way round
    fake.send(encode(Chunk(999, 0, True, 0, [2], 2 * PAGE_BYTES, 0)))  # unknown room, payload missing
    fake.send(encode(Chunk(broken_room, 0, True, 0, [2], 2 * PAGE_BYTES, 0)))  # live room, payload missing

    expected = expected_counts(valid, wrong, unexpected=1, oversize=False)
    wait_for(lambda: expected == rejected(decode.counters()), what="decode counts every bad frame")
    wait_for(lambda: decode.counters()["rejected_truncated"] == 2, what="both payload-less chunks are counted")
    wait_for(lambda: broken.poll() is KVPoll.Failed)
    assert broken.failure is not None and decode.info.label == broken.failure.origin
    assert KVPoll.WaitingForInput == good.poll()

    payload = np.arange(4 * PAGE_BYTES, dtype=np.uint64).astype(np.uint8)
    fake.send(
        encode(Chunk(good_room, 0, True, 0, [4], payload.nbytes, xxhash.xxh3_64_intdigest(payload.data))),
        payload.tobytes(),
    )
    fake.send(encode(Status(good_room, int(KVPoll.Success), 0)))

    wait_for(lambda: good.poll() is KVPoll.Success, what="the good room still lands")
    assert np.array_equal(payload.reshape(4, PAGE_BYTES), decode.pool.data[10:14])
    assert decode.counters()["chunks_landed"] == 1


@pytest.mark.parametrize(
    ("page_start", "frame_pages", "nbytes", "counter"),
    [
        (-1, [1], PAGE_BYTES, "rejected_malformed"),
        (0, [0, 2], 2 * PAGE_BYTES, "rejected_malformed"),
        (1, [-1, 2], PAGE_BYTES, "rejected_malformed"),
        (0, [], 0, "rejected_malformed"),
        (0, [2], 1, "rejected_malformed"),
        (0, [5], 5 * PAGE_BYTES, "rejected_malformed"),
    ],
    ids=["negative-start", "empty-frame", "negative-count", "no-frames", "nbytes-mismatch", "past-the-end"],
)
def test_decode_drops_chunk_headers_that_do_not_fit_the_room_and_keeps_the_room(
    bootstrap, make_manager, zmq_context, wait_for, page_start, frame_pages, nbytes, counter
):
    """A chunk header whose pages cannot be the room's is dropped and counted; the room then lands normally."""
    decode = make_manager(Role.DECODE, "decode-0", config=TransferConfig(peer_timeout_s=30.0))
    fake = FakePrefill(zmq_context, bootstrap.endpoint)
    receiver = decode.receiver(83, "fake-prefill")
    receiver.init(np.arange(4, dtype=np.uint32))
    fake.greet()

    payloads = [bytes(max(count, 0) * PAGE_BYTES) for count in frame_pages]
    fake.send(encode(Chunk(83, 0, False, page_start, frame_pages, nbytes, 0)), *payloads)

    wait_for(lambda: decode.counters()[counter] == 1, what=f"the header is counted under {counter}")
    assert decode.counters()["chunks_landed"] == 0
    assert receiver.poll() is KVPoll.WaitingForInput
    payload = np.full(4 * PAGE_BYTES, 7, dtype=np.uint8)
    fake.send(encode(Chunk(83, 0, True, 0, [4], payload.nbytes, xxhash.xxh3_64_intdigest(payload.data))), payload)
    fake.send(encode(Status(83, int(KVPoll.Success), 0)))
    wait_for(lambda: receiver.poll() is KVPoll.Success, what="the room still lands")
    assert np.array_equal(payload.reshape(4, PAGE_BYTES), decode.pool.data[:4])


@pytest.mark.parametrize("pages", [1, 2, 128], ids=["one-page", "received-in-place", "landed-a-block-at-a-time"])
def test_decode_counts_a_frame_beyond_a_chunks_payload_and_lands_the_chunk(
    bootstrap, make_manager, zmq_context, wait_for, pages
):
    """A chunk of sealed pages followed by a frame it does not describe: the frame is dropped and counted as
    unexpected, the pages land verified, and the next message is read as a message of its own. 128 pages are
    512 KiB, more than a block: received whole and copied a block at a time, the frame's own flag telling
    whether more follows."""
    decode = make_manager(Role.DECODE, "decode-0", config=TransferConfig(peer_timeout_s=30.0))
    fake = FakePrefill(zmq_context, bootstrap.endpoint)
    receiver = decode.receiver(84, "fake-prefill")
    receiver.init(np.arange(pages, dtype=np.uint32))
    fake.greet()

    payload = np.random.default_rng(84).integers(0, 256, size=(pages, PAGE_BYTES), dtype=np.uint8)
    digests = b"".join(xxhash.xxh3_64_digest(row.data) for row in payload)
    header = Chunk(84, 0, True, 0, [pages], payload.nbytes, None, digests)
    fake.send(encode(header), payload.tobytes(), b"a frame beyond the payload")
    fake.send(encode(Status(84, int(KVPoll.Success), 0)))

    wait_for(lambda: receiver.poll() is KVPoll.Success, what="the chunk lands and the status after it is read")
    assert decode.counters()["rejected_unexpected"] == 1
    assert decode.counters()["chunks_landed"] == 1
    assert decode.counters()["checksum_failures"] == 0
    assert np.array_equal(payload, decode.pool.data[:pages])


def _sealed(room: int, pages: int, seed: int) -> tuple[Chunk, np.ndarray]:
    """One chunk of `pages` sealed pages (page digests, no chunk checksum) and its payload."""
    payload = np.random.default_rng(seed).integers(0, 256, size=(pages, PAGE_BYTES), dtype=np.uint8)
    digests = b"".join(xxhash.xxh3_64_digest(row.data) for row in payload)
    return Chunk(room, 0, True, 0, [pages], payload.nbytes, None, digests), payload


@pytest.mark.parametrize("pool_pages", ["one-run", "two-runs"])
@pytest.mark.parametrize(
    ("sent_pages", "counter"),
    [(None, "rejected_truncated"), (3, "rejected_truncated"), (5, "rejected_oversize")],
    ids=["header-alone", "payload-short", "payload-long"],
)
def test_decode_fails_a_room_whose_sealed_chunk_has_no_payload_or_one_of_another_size_and_reads_on(
    bootstrap, make_manager, zmq_context, wait_for, pool_pages, sent_pages, counter
):
    """A chunk of sealed pages that ends at its header, or whose payload is not its pages' size, fails its room
    (layout mismatch, counted) whether the room's pages are one run (the short landing path) or not; the next
    message is read as a message of its own, not taken for a payload, and its room lands verified."""
    decode = make_manager(Role.DECODE, "decode-0", config=TransferConfig(peer_timeout_s=30.0))
    fake = FakePrefill(zmq_context, bootstrap.endpoint)
    pages = [10, 11, 12, 13] if pool_pages == "one-run" else [10, 11, 30, 31]
    broken = decode.receiver(85, "fake-prefill")
    broken.init(np.asarray(pages, dtype=np.uint32))
    fake.greet()
    good = decode.receiver(86, "fake-prefill")
    good.init(np.asarray([p + 40 for p in pages], dtype=np.uint32))
    assert fake.expect(TransferRequest).room == 86

    header, _ = _sealed(85, 4, 85)
    frames = [] if sent_pages is None else [bytes(sent_pages * PAGE_BYTES)]
    fake.send(encode(header), *frames)
    good_header, good_payload = _sealed(86, 4, 86)
    fake.send(encode(good_header), good_payload.tobytes())
    fake.send(encode(Status(86, int(KVPoll.Success), 0)))

    wait_for(lambda: broken.poll() is KVPoll.Failed, what="the room of the chunk that does not fit fails")
    assert broken.failure is not None and "mismatched KV layouts" in str(broken.failure)
    assert decode.counters()[counter] == 1
    wait_for(lambda: good.poll() is KVPoll.Success, what="the next chunk lands in its own room")
    assert np.array_equal(good_payload, decode.pool.data[[p + 40 for p in pages]])
    assert decode.counters()["chunks_landed"] == 1
    assert decode.counters()["checksum_failures"] == 0
