"""Failures in-process: each starts on the rank that saw it (the origin) and echoes to the peer."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import xxhash
import zmq

from tests.transport.test_bad_frames import FakePrefill
from transport import FaultInjector, FaultSpec, KVManager, KVPoll, Role, Timeouts, TransferConfig
from transport.kv.pool import LAND_BLOCK_BYTES
from transport.wire import (
    Abort,
    AbortAck,
    Ack,
    Chunk,
    FrameDecoder,
    Hello,
    LinkMessage,
    Status,
    TransferRequest,
    Welcome,
    encode,
)

PAGE_BYTES = 4096
TIMEOUT_S = 0.5


def timed_out_pattern(room: int, state: str) -> re.Pattern[str]:
    """SGLang's timeout line for `room` in `state`, with the seconds captured."""
    return re.compile(rf"Request {room} timed out after (\d+\.\d)s in KVPoll\.{state}")


def short(**timeouts: float) -> TransferConfig:
    """Small chunks, and the given timeouts (the others stay at their long defaults)."""
    return TransferConfig(chunk_bytes=2 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES, timeouts=Timeouts(**timeouts))


def test_prefill_times_out_in_bootstrapping_when_no_decode_asks(make_manager, wait_for):
    """A sender whose decode never sends a transfer request fails in Bootstrapping with SGLang's wording."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short(bootstrap_s=TIMEOUT_S))
    started = time.monotonic()
    sender = prefill.sender(41)
    sender.send(np.arange(4, dtype=np.uint32))

    wait_for(lambda: sender.poll() is KVPoll.Failed, timeout=10, what="bootstrap timeout")

    elapsed = time.monotonic() - started
    failure = sender.failure
    assert failure is not None
    match = timed_out_pattern(41, "Bootstrapping").fullmatch(failure.failure_reason)
    assert match, failure.failure_reason
    # the bootstrap timeout fired, not a later one (the others are 60 s and more; 10 s: a loaded machine's margin)
    assert float(match.group(1)) + 0.05 >= TIMEOUT_S and elapsed < 10
    assert sender.reason_class == "timeout_bootstrap"
    assert prefill.info.label == failure.origin
    assert f"KVTransferError(bootstrap_room=41): {failure.failure_reason}" == str(failure)


def test_decode_times_out_in_waiting_for_input_when_prefill_never_sends(make_manager, wait_for):
    """Decode fails in WaitingForInput when the prefill never calls send(); the prefill room echoes it."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    decode = make_manager(Role.DECODE, "decode-0", config=short(waiting_s=TIMEOUT_S))
    sender = prefill.sender(42)
    receiver = decode.receiver(42, "prefill-0")
    receiver.init(np.arange(4, dtype=np.uint32))
    wait_for(lambda: receiver.poll() is KVPoll.WaitingForInput, what="handshake done")

    wait_for(lambda: receiver.poll() is KVPoll.Failed, timeout=TIMEOUT_S + 3, what="waiting timeout")

    failure = receiver.failure
    assert failure is not None
    assert timed_out_pattern(42, "WaitingForInput").fullmatch(failure.failure_reason), failure.failure_reason
    assert receiver.reason_class == "timeout_waiting"
    assert decode.info.label == failure.origin
    wait_for(lambda: sender.poll() is KVPoll.Failed, what="prefill echoes the decode's failure")
    assert sender.failure is not None
    assert decode.info.label == sender.failure.origin
    assert sender.reason_class == "propagated"


def _room_that_times_out_transferring(make_manager, wait_for, fault: str, room: int):
    """A 16-page room from a prefill with `fault` to a decode with a short transfer timeout, once decode failed."""
    faults = FaultInjector((FaultSpec.parse(fault),))
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short(), faults=faults)
    decode = make_manager(Role.DECODE, "decode-0", config=short(transfer_s=TIMEOUT_S))
    sender = prefill.sender(room)
    receiver = decode.receiver(room, "prefill-0")
    receiver.init(np.arange(16, dtype=np.uint32))
    sender.send(np.arange(16, dtype=np.uint32))
    wait_for(lambda: receiver.poll() is KVPoll.Failed, timeout=TIMEOUT_S + 3, what="transfer timeout")
    return prefill, decode, sender, receiver


def test_decode_times_out_in_transferring_when_prefill_stalls(make_manager, wait_for):
    """A prefill that stops after half the chunks makes decode fail in Transferring, with half the bytes landed."""
    prefill, decode, sender, receiver = _room_that_times_out_transferring(make_manager, wait_for, "stall", 43)

    failure = receiver.failure
    assert failure is not None
    assert timed_out_pattern(43, "Transferring").fullmatch(failure.failure_reason), failure.failure_reason
    assert receiver.reason_class == "timeout_transfer"
    assert decode.info.label == failure.origin
    assert receiver.bytes_done == 8 * PAGE_BYTES
    assert prefill.counters()["fault_stall"] == 1
    wait_for(lambda: sender.poll() is KVPoll.Failed, what="prefill echoes the decode's failure")
    assert sender.failure is not None and decode.info.label == sender.failure.origin


def test_decode_times_out_in_transferring_when_prefill_drops_a_chunk(make_manager, wait_for):
    """A prefill that skips the middle chunk still sends the rest; decode lands them and times out in Transferring."""
    prefill, decode, _, receiver = _room_that_times_out_transferring(make_manager, wait_for, "drop", 48)

    assert receiver.reason_class == "timeout_transfer"
    assert receiver.bytes_done == 14 * PAGE_BYTES
    assert prefill.counters()["fault_drop"] == 1
    assert prefill.counters()["chunks_sent"] == decode.counters()["chunks_landed"] == 7
    assert receiver.failure is not None  # the sender said it sent all: the bytes it owes are what is missing
    assert prefill.info.label == receiver.failure.suspect


def test_a_lost_first_chunk_fails_on_decode_naming_the_sender_not_on_the_prefill_backstop(make_manager, wait_for):
    """The room's only chunk is dropped: decode waits in WaitingForInput for its waiting timeout, longer than
    twice the transfer timeout the prefill's backstop waited. The backstop named the decode (alive, answering
    heartbeats) "whose acknowledgements never came" for a chunk prefill never delivered; now decode fails first,
    naming the sender, and prefill echoes it."""
    config = short(transfer_s=TIMEOUT_S, waiting_s=4 * TIMEOUT_S)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config, faults=FaultInjector((FaultSpec.parse("drop"),)))
    decode = make_manager(Role.DECODE, "decode-0", config=config)
    sender = prefill.sender(49)
    receiver = decode.receiver(49, "prefill-0")
    receiver.init(np.arange(2, dtype=np.uint32))
    sender.send(np.arange(2, dtype=np.uint32))

    wait_for(lambda: sender.poll() is KVPoll.Failed, timeout=4 * TIMEOUT_S + 5, what="the room fails")

    assert (receiver.poll(), receiver.reason_class) == (KVPoll.Failed, "timeout_waiting")
    assert receiver.failure is not None and prefill.info.label == receiver.failure.suspect
    assert sender.failure is not None and decode.info.label == sender.failure.origin
    assert sender.reason_class == "propagated"


def test_delayed_chunks_all_arrive(make_manager, wait_for):
    """The delay fault holds back every chunk of the room, and the room still succeeds byte-identical."""
    delay = FaultInjector((FaultSpec.parse("delay"),), delay_s=0.02)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short(), faults=delay)
    decode = make_manager(Role.DECODE, "decode-0", config=short())
    pages = np.arange(16, dtype=np.uint32)
    prefill.pool.fill_pattern(pages, seed=49)
    sender = prefill.sender(49)
    receiver = decode.receiver(49, "prefill-0")
    receiver.init(pages)
    started = time.monotonic()
    sender.send(pages)

    wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what="both succeed")

    assert time.monotonic() - started >= 8 * 0.02
    assert prefill.counters()["fault_delay"] == 8
    assert prefill.pool.digest(pages) == decode.pool.digest(pages)


@pytest.mark.parametrize("sealed", [True, False], ids=["page-checksums", "chunk-checksums"])
@pytest.mark.parametrize("num_pages", [16, 2], ids=["sixteen-pages", "two-pages"])
@pytest.mark.parametrize("chunk_pages", [2, 1], ids=["two-page-chunks", "one-page-chunks"])
def test_corrupted_chunk_fails_on_decode_as_origin_and_echoes_to_prefill(
    make_manager, wait_for, num_pages, sealed, chunk_pages
):
    """A chunk altered on its way is caught by the receiver, which is the origin of the failure and names the
    sender: against the digests the pages were sealed with when written, or the sender's chunk checksum."""
    corrupt = FaultInjector((FaultSpec.parse("corrupt"),))
    config = TransferConfig(chunk_bytes=chunk_pages * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config, faults=corrupt)
    decode = make_manager(Role.DECODE, "decode-0", config=config)
    pages = np.arange(num_pages, dtype=np.uint32)
    prefill.pool.fill_pattern(pages, seed=44)
    if not sealed:
        prefill.pool.sealed[pages] = False
    sender = prefill.sender(44)
    receiver = decode.receiver(44, "prefill-0")
    receiver.init(pages)
    sender.send(pages)

    wait_for(lambda: receiver.poll() is KVPoll.Failed and sender.poll() is KVPoll.Failed, what="both sides fail")

    assert receiver.failure is not None and sender.failure is not None
    assert receiver.reason_class == "checksum"
    assert decode.info.label == receiver.failure.origin
    assert "failed its checksum" in receiver.failure.failure_reason
    middle = num_pages // chunk_pages // 2  # the corrupt fault flips the middle byte of the middle chunk
    corrupted_page = middle * chunk_pages + chunk_pages // 2
    assert (f"(page {corrupted_page}: expected " in receiver.failure.failure_reason) is sealed
    assert prefill.info.label == receiver.failure.suspect, "the incident names the sender"
    assert decode.counters()["checksum_failures"] == 1
    assert prefill.counters()["fault_corrupt"] == 1
    assert decode.info.label == sender.failure.origin, "the prefill room is an echo of the decode's failure"
    assert sender.reason_class == "propagated"
    assert prefill.info.label == sender.failure.suspect, "the ABORT carries what its origin named"
    assert sender.failure.origin_class == "checksum", "and the class it recorded"


@pytest.mark.parametrize(
    ("chunk_pages", "damaged", "chunk"),
    [(2, 11, 5), (LAND_BLOCK_BYTES // PAGE_BYTES * 2, 200, 1)],
    ids=["small-chunks", "chunks-landed-a-block-at-a-time"],
)
def test_page_changed_after_sealing_fails_where_it_lands(make_manager, wait_for, chunk_pages, damaged, chunk):
    """End-to-end page checksums: a page whose bytes changed after its writer sealed it (memory damaged between
    the forward pass and the transfer) fails the room as `checksum` on the decode rank, naming that page and the
    sender, with no fault injected and no hash on the sender's path; also where a chunk is larger than a block
    and lands a block at a time (the damaged page in a chunk's second block)."""
    config = TransferConfig(chunk_bytes=chunk_pages * PAGE_BYTES, window_bytes=4 * chunk_pages * PAGE_BYTES)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config, num_pages=256)
    decode = make_manager(Role.DECODE, "decode-0", config=config, num_pages=256)
    pages = np.arange(256 if chunk_pages > 2 else 16, dtype=np.uint32)
    prefill.pool.fill_pattern(pages, seed=50)
    prefill.pool.data[damaged, 100] ^= 0x01
    sender = prefill.sender(50)
    receiver = decode.receiver(50, "prefill-0")
    receiver.init(pages)
    sender.send(pages)

    wait_for(lambda: receiver.poll() is KVPoll.Failed and sender.poll() is KVPoll.Failed, what="both sides fail")

    failure = receiver.failure
    assert failure is not None
    assert receiver.reason_class == "checksum"
    assert re.fullmatch(
        rf"KV chunk {chunk} of room 50 from prefill rank 0 \(prefill-0/TP0\) failed its checksum "
        rf"\(page {damaged}: .+\)",
        failure.failure_reason,
    )
    assert decode.info.label == failure.origin
    assert prefill.info.label == failure.suspect
    assert decode.counters()["checksum_failures"] == 1
    assert decode.counters()["chunks_unverified"] == 0


def test_sealed_pages_go_with_their_digests_and_rewritten_pages_with_a_chunk_checksum(make_manager, wait_for):
    """Pages sealed as written land verified against their digests; the same pages allocated again and written by
    a writer that does not seal (a real engine's forward pass) are unsealed, so their chunks carry the sender's
    checksum instead of the stale digests. Both rooms land byte-identical."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    decode = make_manager(Role.DECODE, "decode-0", config=short())

    def transfer(room: int, pages: np.ndarray) -> None:
        sender = prefill.sender(room)
        receiver = decode.receiver(room, "prefill-0")
        dst = decode.pool.allocate(len(pages))
        receiver.init(dst)
        sender.send(pages)
        wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what=f"room {room}")
        assert prefill.pool.digest(pages) == decode.pool.digest(dst)

    first = prefill.pool.allocate(8)
    prefill.pool.fill_pattern(first, seed=51)
    assert prefill.pool.sealed_digests(first) is not None
    transfer(51, first)
    prefill.pool.release(first)
    second = prefill.pool.allocate(8)
    assert second.tolist() == first.tolist() and prefill.pool.sealed_digests(second) is None, "allocating unseals"
    prefill.pool.data[second] = np.random.default_rng(52).integers(0, 256, (8, PAGE_BYTES), dtype=np.uint8)
    transfer(52, second)

    assert decode.counters()["checksum_failures"] == decode.counters()["chunks_unverified"] == 0
    assert decode.counters()["chunks_landed"] == 8


def test_abort_is_acknowledged_and_echoed(make_manager, wait_for):
    """receiver.abort() fails the room locally with SGLang's wording, fails the prefill room, and is acked."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    decode = make_manager(Role.DECODE, "decode-0", config=short())
    sender = prefill.sender(45)
    receiver = decode.receiver(45, "prefill-0")
    receiver.init(np.arange(8, dtype=np.uint32))
    wait_for(lambda: sender.poll() is KVPoll.WaitingForInput, what="prefill has the request")
    assert not receiver.abort_acknowledged

    receiver.abort()

    wait_for(lambda: receiver.abort_acknowledged, what="prefill acknowledges the abort")
    assert receiver.failure is not None
    assert receiver.failure.failure_reason == "Aborted by AbortReq."
    assert receiver.reason_class == "aborted"
    assert decode.info.label == receiver.failure.origin
    wait_for(lambda: sender.poll() is KVPoll.Failed)
    assert sender.failure is not None and decode.info.label == sender.failure.origin
    assert 1 == decode.counters()["aborts_sent"] == prefill.counters()["aborts_received"]


def test_abort_mid_transfer_stops_the_sender(make_manager, wait_for):
    """An abort while chunks flow fails both sides; the prefill stops sending the room's remaining chunks."""
    delay = FaultInjector((FaultSpec.parse("delay"),), delay_s=0.05)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short(), faults=delay)
    decode = make_manager(Role.DECODE, "decode-0", config=short())
    pages = np.arange(64, dtype=np.uint32)
    sender = prefill.sender(46)
    receiver = decode.receiver(46, "prefill-0")
    receiver.init(pages)
    sender.send(pages)
    wait_for(lambda: receiver.poll() is KVPoll.Transferring, what="first chunk landed")

    receiver.abort()

    wait_for(lambda: receiver.abort_acknowledged and sender.poll() is KVPoll.Failed)
    sent = prefill.counters()["chunks_sent"]
    assert sent < 32, "the prefill kept sending after the abort"
    assert sender.failure is not None and decode.info.label == sender.failure.origin


def test_prefill_refusal_is_the_origin_and_decode_reports_the_sglang_echo(make_manager, wait_for):
    """A prefill-side failure reaches decode as SGLang's 'Failed to get kvcache' line, keeping the prefill origin."""
    refuse = FaultInjector((FaultSpec.parse("refuse"),))
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short(), faults=refuse)
    decode = make_manager(Role.DECODE, "decode-0", config=short())
    sender = prefill.sender(47)
    receiver = decode.receiver(47, "prefill-0")
    receiver.init(np.arange(4, dtype=np.uint32))

    wait_for(lambda: receiver.poll() is KVPoll.Failed and sender.poll() is KVPoll.Failed)

    assert sender.failure is not None and receiver.failure is not None
    assert sender.reason_class == "refused"
    assert prefill.info.label == sender.failure.origin
    assert receiver.failure.failure_reason == "Failed to get kvcache from prefill instance, it might be dead"
    assert receiver.reason_class == "propagated"
    assert prefill.info.label == receiver.failure.origin
    assert prefill.info.label == receiver.failure.suspect, "the status carries what its origin named"
    assert receiver.failure.origin_class == "refused", "and the class it recorded"


def test_decode_loses_a_prefill_that_goes_silent(make_manager, wait_for):
    """When the prefill rank stops answering, decode fails its room once with SGLang's lost-connection line."""
    config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5)
    prefill = make_manager(Role.PREFILL, "prefill-0", config=config)
    decode = make_manager(Role.DECODE, "decode-0", config=config)
    receiver = decode.receiver(48, "prefill-0")
    receiver.init(np.arange(4, dtype=np.uint32))
    wait_for(lambda: receiver.poll() is KVPoll.WaitingForInput)

    prefill.close()

    wait_for(lambda: receiver.poll() is KVPoll.Failed, timeout=3, what="decode notices the silence")
    assert receiver.failure is not None
    assert receiver.failure.failure_reason.startswith("Lost connection with prefill instance (bootstrap_addr: ")
    assert receiver.reason_class == "peer_lost"
    assert decode.info.label == receiver.failure.origin
    assert decode.counters()["peers_lost"] == 1


def test_late_failed_status_for_a_released_room_is_ignored_on_decode(make_manager, wait_for):
    """A prefill failure that reaches decode after decode released the room only counts a late failure."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    decode = make_manager(Role.DECODE, "decode-0", config=short())
    sender = prefill.sender(49)
    receiver = decode.receiver(49, "prefill-0")
    receiver.init(np.arange(4, dtype=np.uint32))
    wait_for(lambda: sender.poll() is KVPoll.WaitingForInput)
    receiver.release()
    wait_for(lambda: 49 not in decode._decode.rooms, what="decode forgot the room")

    sender.send(np.arange(3, dtype=np.uint32))  # one page short: prefill fails and tells decode

    wait_for(lambda: decode.counters()["late_failures"] == 1, what="decode counts the late failure")
    assert KVPoll.Failed == sender.poll()
    assert KVPoll.WaitingForInput == receiver.poll()
    assert decode.counters()["rooms_failed"] == 0


def test_a_failed_status_after_the_decode_instance_agreed_success_is_counted_late_and_changes_nothing(
    make_manager, wait_for, monkeypatch
):
    """prefill-0/TP1 sends its part and dies before its acks arrive (they are dropped, then it closes, listed still):
    decode-0 (TP 1, so it agrees at once) has every byte and both statuses, and agreed Success. prefill-0/TP0 had
    finished its part too; when TP1 goes silent its instance fails the room (rank_silent, TP0 the origin) and TP0
    tells decode-0 with a Failed status. decode-0 counts a late failure and keeps its Success: the KV it handed on
    is whole, and nothing fails there."""
    config = TransferConfig(heartbeat_s=0.1, peer_timeout_s=0.5, timeouts=Timeouts(30, 30, 30))
    prefills = [make_manager(Role.PREFILL, "prefill-0", rank=r, tp=2, config=config) for r in range(2)]
    decode = make_manager(Role.DECODE, "decode-0", page_bytes=2 * PAGE_BYTES, config=config)
    monkeypatch.setattr(prefills[1]._prefill, "_on_ack", lambda *_: None)  # the acks reach no live process
    pages = np.arange(4, dtype=np.uint32)
    senders = [prefill.sender(51) for prefill in prefills]
    receiver = decode.receiver(51, "prefill-0")
    receiver.init(pages)
    for sender in senders:
        sender.send(pages)
    wait_for(lambda: receiver.agreed() is KVPoll.Success, what="decode-0 agrees Success")
    assert KVPoll.Transferring is senders[1].poll(), "TP1 never heard its acks"

    prefills[1].close(deregister=False)

    wait_for(lambda: decode.counters()["late_failures"] == 1, timeout=10, what="decode-0 counts the late failure")
    failure = senders[0].agreed_failure
    assert failure is not None and (failure.origin, senders[0].agreed_reason_class) == ("prefill-0/TP0", "peer_lost")
    assert (KVPoll.Success, KVPoll.Success, None) == (receiver.poll(), receiver.agreed(), receiver.agreed_failure)
    assert decode.counters()["rooms_failed"] == 0


def test_a_failed_status_right_behind_the_success_of_a_decode_rank_alone_is_late(
    bootstrap, make_manager, zmq_context, wait_for
):
    """A decode instance of TP 1 agrees with itself the moment its room succeeds (no vote to wait for): a Failed
    status that follows its prefill's Success in the same read, before the engine's next tick, is a late failure.
    Before, it failed the room's agreement, which that tick set back to Success: the rank published a failure
    (a Failed state, an echo) that its scheduler, told Success, never saw."""
    decode = make_manager(Role.DECODE, "decode-0", config=TransferConfig(peer_timeout_s=30.0))
    fake = FakePrefill(zmq_context, bootstrap.endpoint)
    receiver = decode.receiver(52, "fake-prefill")
    receiver.init(np.arange(4, dtype=np.uint32))
    fake.greet()
    payload = np.full(4 * PAGE_BYTES, 3, dtype=np.uint8)
    checksum = xxhash.xxh3_64_intdigest(payload.data)

    fake.send(encode(Chunk(52, 0, True, 0, [4], payload.nbytes, checksum)), payload.tobytes())
    fake.send(encode(Status(52, int(KVPoll.Success), 0)))
    failed = "Failed to get kvcache from prefill instance, it might be dead"
    fake.send(encode(Status(52, int(KVPoll.Failed), 0, failed, "peer_lost", "fake-prefill/TP0", "fake-prefill/TP1")))

    wait_for(lambda: decode.counters()["late_failures"] == 1, what="decode-0 counts the late failure")
    wait_for(lambda: receiver.agreed() is KVPoll.Success, what="the engine records the agreement at its tick")
    assert (KVPoll.Success, None) == (receiver.poll(), receiver.agreed_failure)
    assert decode.counters()["rooms_failed"] == 0


def test_an_abort_after_the_prefill_instance_agreed_success_is_counted_late_and_changes_nothing(
    make_manager, zmq_context, wait_for
):
    """A decode rank (by hand) lands a room, acknowledges it, and sends an ABORT for it once prefill-0 (TP 1) agreed
    Success: the ABORT is acknowledged and counted as a late failure, and the room stays a success. Before, it
    was acknowledged and nothing else: counted nowhere, as a late Failed status on decode is."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    sender = prefill.sender(53)
    fake_decode, decoder = _greeted_fake_decode(prefill, zmq_context)
    fake_decode.send(encode(TransferRequest(53, 0, np.arange(2, dtype="<u4").tobytes(), 0, 0, PAGE_BYTES, 1)))
    sender.send(np.arange(2, dtype=np.uint32))
    landed = 0
    while not isinstance(message := decoder.decode(_recv_message(fake_decode)), Status):
        assert isinstance(message, Chunk)
        landed += message.nbytes
    assert (KVPoll.Success, 2 * PAGE_BYTES) == (message.state, landed)
    fake_decode.send(encode(Ack([(53, landed)])))
    wait_for(lambda: sender.agreed() is KVPoll.Success, what="prefill-0 agrees Success")

    fake_decode.send(encode(Abort(53, "Aborted by AbortReq.", "aborted", "decode-9/TP0")))

    assert fake_decode.poll(3000) and AbortAck(53, 0) == decoder.decode(fake_decode.recv())
    wait_for(lambda: prefill.counters()["late_failures"] == 1, what="prefill-0 counts the late failure")
    assert (KVPoll.Success, KVPoll.Success, None) == (sender.poll(), sender.agreed(), sender.agreed_failure)
    assert prefill.counters()["rooms_failed"] == 0


def _greeted_fake_decode(
    prefill: KVManager, zmq_context: zmq.Context[zmq.Socket[bytes]]
) -> tuple[zmq.Socket[bytes], FrameDecoder[LinkMessage]]:
    """A decode rank by hand (decode-9) connected to `prefill`'s data socket, its Hello welcomed."""
    fake_decode = zmq_context.socket(zmq.DEALER)
    fake_decode.linger = 0
    fake_decode.connect(prefill.info.data_endpoint)
    decoder: FrameDecoder[LinkMessage] = FrameDecoder(LinkMessage)
    info = prefill.info.__class__("decode", "decode-9", 0, 1, PAGE_BYTES, "", "", 1, "test", 1)
    fake_decode.send(encode(Hello(info, 1 << 20)))
    assert fake_decode.poll(3000) and isinstance(decoder.decode(fake_decode.recv()), Welcome)
    return fake_decode, decoder


def _recv_message(sock: zmq.Socket[bytes]) -> bytes:
    """The header of the next message (its payload frames, if any, dropped)."""
    assert sock.poll(3000), "nothing from the prefill rank within 3 s"
    header, *_ = sock.recv_multipart()
    return header


def test_late_abort_for_a_released_room_is_ignored_on_prefill(make_manager, zmq_context, wait_for):
    """An ABORT for a room the prefill already released is acknowledged and counted, and the room id stays reusable."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=short())
    sender = prefill.sender(50)
    sender.release()
    fake_decode, decoder = _greeted_fake_decode(prefill, zmq_context)

    fake_decode.send(encode(Abort(50, "Aborted by AbortReq.", "aborted", "decode-9/TP0")))

    assert fake_decode.poll(3000)
    assert AbortAck(50, 0) == decoder.decode(fake_decode.recv())
    wait_for(lambda: prefill.counters()["late_failures"] == 1)
    assert prefill.counters()["rooms_failed"] == 0
    reused = prefill.sender(50)
    assert KVPoll.Bootstrapping == reused.poll()
