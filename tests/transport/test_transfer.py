"""In-process transfers: pages land byte-identical, in the right place, for every TP mapping."""

from __future__ import annotations

import numpy as np
import pytest

from transport import KVManager, KVPoll, Role, TransferConfig

PAGE_BYTES = 4096
SMALL_CHUNKS = TransferConfig(chunk_bytes=4 * PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
"""Four pages per chunk and two chunks of credit: every room of a few dozen pages needs many chunks."""


def start_room(prefill: KVManager, decode: KVManager, room: int, src: np.ndarray, dst: np.ndarray):
    """Fill `src` with the room's pattern and start the room on both sides."""
    prefill.pool.fill_pattern(src, seed=room)
    sender = prefill.sender(room)
    receiver = decode.receiver(room, prefill.info.instance)
    receiver.init(dst)
    sender.send(src)
    return sender, receiver


def test_contiguous_pages_arrive_byte_identical(make_manager, wait_for):
    """A room of consecutive pages, sent in many chunks, lands byte for byte in the decode pool."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=SMALL_CHUNKS)
    decode = make_manager(Role.DECODE, "decode-0", config=SMALL_CHUNKS)
    src = prefill.pool.allocate(40)
    dst = decode.pool.allocate(40)

    sender, receiver = start_room(prefill, decode, 101, src, dst)

    wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what="room 101 succeeds")
    assert np.array_equal(prefill.pool.data[src], decode.pool.data[dst])
    assert 40 * PAGE_BYTES == receiver.bytes_done == sender.bytes_done
    assert decode.counters()["chunks_landed"] == 10


def test_shuffled_pages_arrive_byte_identical(make_manager, wait_for, shuffled_pages):
    """Permuted, non-contiguous source and destination page lists (multi-frame chunks) land byte-identical."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=SMALL_CHUNKS)
    decode = make_manager(Role.DECODE, "decode-0", config=SMALL_CHUNKS)
    src = shuffled_pages(prefill.pool, 50, seed=1)
    dst = shuffled_pages(decode.pool, 50, seed=2)
    assert len(np.flatnonzero(np.diff(src.astype(np.int64)) != 1)) > 5, "the source list must jump around"

    sender, receiver = start_room(prefill, decode, 202, src, dst)

    wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what="room 202 succeeds")
    assert np.array_equal(prefill.pool.data[src], decode.pool.data[dst])
    untouched = np.setdiff1d(np.arange(decode.pool.num_pages), dst)
    assert not decode.pool.data[untouched].any(), "bytes landed outside the room's destination pages"


def test_allocated_then_permuted_pages_arrive_byte_identical(make_manager, wait_for):
    """Pages taken from the allocator and then permuted (the decode keeps allocator order) land byte-identical."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=SMALL_CHUNKS)
    decode = make_manager(Role.DECODE, "decode-0", config=SMALL_CHUNKS)
    rng = np.random.default_rng(7)
    src = rng.permutation(prefill.pool.allocate(33)).astype(np.uint32)
    dst = decode.pool.allocate(33)

    sender, receiver = start_room(prefill, decode, 303, src, dst)

    wait_for(lambda: receiver.poll() is KVPoll.Success and sender.poll() is KVPoll.Success, what="room 303 succeeds")
    assert np.array_equal(prefill.pool.data[src], decode.pool.data[dst])


def test_concurrent_rooms_share_a_link_under_flow_control(make_manager, wait_for):
    """Eight rooms started together on one link all succeed with their own bytes, within a two-chunk window."""
    prefill = make_manager(Role.PREFILL, "prefill-0", num_pages=256, config=SMALL_CHUNKS)
    decode = make_manager(Role.DECODE, "decode-0", num_pages=256, config=SMALL_CHUNKS)
    rng = np.random.default_rng(11)
    src_all = rng.permutation(256).astype(np.uint32)
    dst_all = rng.permutation(256).astype(np.uint32)
    rooms = {}
    for i in range(8):
        src, dst = src_all[i * 30 : i * 30 + 27], dst_all[i * 30 : i * 30 + 27]
        rooms[1000 + i] = (src, dst, *start_room(prefill, decode, 1000 + i, src, dst))

    wait_for(
        lambda: all(s.poll() is KVPoll.Success and r.poll() is KVPoll.Success for _, _, s, r in rooms.values()),
        timeout=10,
        what="all eight rooms succeed",
    )
    for src, dst, _, _ in rooms.values():
        assert np.array_equal(prefill.pool.data[src], decode.pool.data[dst])
    assert 8 * 27 * PAGE_BYTES == decode.counters()["bytes_landed"] == prefill.counters()["bytes_sent"]


def test_send_before_request_and_request_before_send_both_work(make_manager, wait_for):
    """The room succeeds whether prefill's send() or decode's request reaches the prefill rank first."""
    prefill = make_manager(Role.PREFILL, "prefill-0", config=SMALL_CHUNKS)
    decode = make_manager(Role.DECODE, "decode-0", config=SMALL_CHUNKS)
    early_src, late_src = np.arange(0, 12, dtype=np.uint32), np.arange(20, 32, dtype=np.uint32)
    prefill.pool.fill_pattern(early_src, seed=1)
    prefill.pool.fill_pattern(late_src, seed=2)

    early = prefill.sender(1)
    early.send(early_src)
    early_receiver = decode.receiver(1, "prefill-0")
    early_receiver.init(np.arange(12, dtype=np.uint32))

    late = prefill.sender(2)
    late_receiver = decode.receiver(2, "prefill-0")
    late_receiver.init(np.arange(40, 52, dtype=np.uint32))
    wait_for(lambda: late.poll() is KVPoll.WaitingForInput, what="prefill room 2 has its request")
    late.send(late_src)

    wait_for(lambda: early_receiver.poll() is KVPoll.Success and late_receiver.poll() is KVPoll.Success)
    assert np.array_equal(prefill.pool.data[early_src], decode.pool.data[np.arange(12)])
    assert np.array_equal(prefill.pool.data[late_src], decode.pool.data[np.arange(40, 52)])


LOGICAL_PAGE_BYTES = 8192


@pytest.mark.parametrize(
    ("prefill_tp", "decode_tp"),
    [(2, 2), (1, 2), (2, 1), (1, 4), (4, 2)],
    ids=["equal-2:2", "decode-larger-1:2", "prefill-larger-2:1", "decode-larger-1:4", "prefill-larger-4:2"],
)
def test_rank_mapping_places_every_byte(make_manager, wait_for, shuffled_pages, prefill_tp, decode_tp):
    """Each decode rank's rows hold exactly the byte ranges of the prefill ranks that mapping.py pairs it with."""
    config = TransferConfig(chunk_bytes=2 * LOGICAL_PAGE_BYTES, window_bytes=8 * LOGICAL_PAGE_BYTES)
    ppb, dpb = LOGICAL_PAGE_BYTES // prefill_tp, LOGICAL_PAGE_BYTES // decode_tp
    prefills = [
        make_manager(Role.PREFILL, "prefill-0", rank=r, tp=prefill_tp, num_pages=64, page_bytes=ppb, config=config)
        for r in range(prefill_tp)
    ]
    decodes = [
        make_manager(Role.DECODE, "decode-0", rank=r, tp=decode_tp, num_pages=64, page_bytes=dpb, config=config)
        for r in range(decode_tp)
    ]
    room, count = 0x5EED_0000_0001, 23
    src = [shuffled_pages(m.pool, count, seed=10 + r) for r, m in enumerate(prefills)]
    dst = [shuffled_pages(m.pool, count, seed=20 + r) for r, m in enumerate(decodes)]
    receivers = []
    for r, decode in enumerate(decodes):
        receivers.append(decode.receiver(room, "prefill-0"))
        receivers[-1].init(dst[r])
    senders = []
    for r, prefill in enumerate(prefills):
        prefill.pool.fill_pattern(src[r], seed=room + r)
        senders.append(prefill.sender(room))
        senders[-1].send(src[r])

    handles = senders + receivers
    wait_for(lambda: all(h.poll().is_terminal for h in handles), timeout=10, what="every rank finishes")
    assert [KVPoll.Success] * len(handles) == [h.poll() for h in handles]

    for r, decode in enumerate(decodes):
        if decode_tp >= prefill_tp:
            k = decode_tp // prefill_tp
            source = prefills[r // k].pool.data[src[r // k]]
            expected = source[:, (r % k) * dpb : (r % k + 1) * dpb]
        else:
            k = prefill_tp // decode_tp
            expected = np.concatenate([prefills[r * k + j].pool.data[src[r * k + j]] for j in range(k)], axis=1)
        assert np.array_equal(expected, decode.pool.data[dst[r]]), f"decode rank {r} holds the wrong bytes"
        untouched = np.setdiff1d(np.arange(decode.pool.num_pages), dst[r])
        assert not decode.pool.data[untouched].any()
        assert count * dpb == receivers[r].bytes_done
