"""Unit tests of the small pieces: KVPoll rules, fault specs, errors, the pool, the wire decoder, rank mapping."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transport import (
    ConfigError,
    FaultInjector,
    FaultKind,
    FaultSpec,
    FrameRejected,
    KVPoll,
    KVPool,
    KVTransferError,
    Timeouts,
    TransferConfig,
    TransportError,
)
from transport.config import Role
from transport.counters import Counters
from transport.harness.agent import AgentOptions, child_args, parse_args
from transport.kv import reasons
from transport.kv.mapping import Pairing, pairings_for_decode_rank
from transport.kv.pool import LAND_BLOCK_BYTES, PoolExhausted, is_one_run, land_digested, run_breaks, split_runs
from transport.kv.rooms import RoomRecord
from transport.kvpoll import advance
from transport.plane.events import AgentHello, Event, Failure, Heartbeat, LogContext, Progress, RoomState, TransferDone
from transport.plane.publisher import StateMirror
from transport.wire import (
    MAX_CONTROL_FRAME,
    WIRE_VERSION,
    AgentInfo,
    ControlRequest,
    FrameDecoder,
    Hello,
    LinkMessage,
    Submit,
    TransferRequest,
    encode,
)

LIVE = [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring]


def _mirror_event(kind: int, room: int, state: int, ts: float) -> Event:
    info = AgentInfo("decode", "decode-0", 0, 1, 4096, "", "", 1, "h", 1)
    return [
        lambda: RoomState(ts, room, state, 0),
        lambda: Progress(ts, room, 1, 2),
        lambda: TransferDone(ts, room, 2, 0.1),
        lambda: Failure(ts, room, "decode-0/TP0", "why", "checksum", "error", False, "decode-0/TP0"),
        lambda: Heartbeat(ts, {}, 0, 0, 0.0, 0, 0.0),
        lambda: AgentHello(ts, info, "1", "", ""),
        lambda: LogContext(ts, "session", room, "text"),
    ][kind]()


def _mirror_state(mirror: StateMirror) -> tuple[object, ...]:
    return (mirror.hello, mirror.heartbeat, mirror.live, mirror.progress, list(mirror.finished),
            list(mirror.failures), list(mirror.transfers), list(mirror.context))  # fmt: skip


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(0, 4)), max_size=60))
def test_the_mirror_applies_a_batch_exactly_as_its_events_one_at_a_time(specs):
    """The publisher's batch path (exact types on locals) leaves the snapshot state `apply` leaves."""
    events = [_mirror_event(kind, room, state, float(i)) for i, (kind, room, state) in enumerate(specs)]
    batched, one_by_one = StateMirror(), StateMirror()
    batched.apply_batch(events)
    for event in events:
        one_by_one.apply(event)
    assert _mirror_state(batched) == _mirror_state(one_by_one)
    last_states = {e.room: e.state for e in events if isinstance(e, RoomState)}
    assert set(batched.live) == {room for room, state in last_states.items() if state not in (0, 4)}


# --- KVPoll ------------------------------------------------------------------------------


def test_kvpoll_values_match_sglang():
    """The states carry SGLang's integer values, so an all-reduce MIN makes Failed win."""
    assert [
        KVPoll.Failed,
        KVPoll.Bootstrapping,
        KVPoll.WaitingForInput,
        KVPoll.Transferring,
        KVPoll.Success,
    ] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("current", LIVE)
@pytest.mark.parametrize("proposed", [*LIVE, KVPoll.Success])
def test_live_states_only_move_forward(current, proposed):
    """A live room takes a later state and ignores an earlier one."""
    assert max(current, proposed) == advance(current, proposed)


def test_exactly_failed_and_success_are_terminal():
    assert [state for state in KVPoll if state.is_terminal] == [KVPoll.Failed, KVPoll.Success]


@pytest.mark.parametrize("current", LIVE)
def test_failed_wins_over_every_live_state(current):
    """Failed replaces any state that is not terminal."""
    assert advance(current, KVPoll.Failed) is KVPoll.Failed


@pytest.mark.parametrize("current", [KVPoll.Failed, KVPoll.Success])
@pytest.mark.parametrize("proposed", list(KVPoll))
def test_terminal_states_stick(current, proposed):
    """Nothing, not even Failed, leaves Success or Failed."""
    assert advance(current, proposed) is current
    assert current.is_terminal


def test_room_record_ignores_a_late_failure_after_success():
    """A room that succeeded keeps its state and records no failure when a late Failed arrives."""
    record = RoomRecord(room=7, created_at=1.0)
    assert record.move(KVPoll.Transferring, 2.0)
    assert record.move(KVPoll.Success, 3.0)

    assert not record.fail(reasons.prefill_failed(), 4.0, origin="prefill-0/TP0")

    assert record.state is KVPoll.Success
    assert record.failure is None
    assert record.finished_at == 3.0


def test_room_record_keeps_the_first_failure():
    """The first failure of a room is its failure; later ones change nothing."""
    record = RoomRecord(room=8, created_at=0.0)
    assert record.fail(reasons.aborted(), 1.0, origin="decode-0/TP0")
    assert not record.fail(reasons.prefill_failed(), 2.0, origin="prefill-0/TP0")

    assert record.failure is not None
    assert (record.failure.failure_reason, record.failure.origin) == ("Aborted by AbortReq.", "decode-0/TP0")
    assert record.reason_class == "aborted"


# --- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stall", FaultSpec(FaultKind.STALL, 1.0, "")),
        ("corrupt:0.05", FaultSpec(FaultKind.CORRUPT, 0.05, "")),
        ("die:0.01", FaultSpec(FaultKind.DIE, 0.01, "")),
        ("drop:1@decode-1", FaultSpec(FaultKind.DROP, 1.0, "decode-1")),
        ("DELAY:0@prefill-0/TP1", FaultSpec(FaultKind.DELAY, 0.0, "prefill-0/TP1")),
        (" refuse ", FaultSpec(FaultKind.REFUSE, 1.0, "")),
    ],
)
def test_fault_spec_parses_every_documented_form(text, expected):
    """KIND[:RATE][@PEER] reads into kind, rate (default 1) and peer prefix."""
    assert FaultSpec.parse(text) == expected


@pytest.mark.parametrize("text", ["stall", "corrupt:0.05", "drop:1@decode-1"])
def test_fault_spec_round_trips_through_str(text):
    """str(spec) parses back to the same spec (agents get their faults on the command line)."""
    spec = FaultSpec.parse(text)
    assert FaultSpec.parse(str(spec)) == spec


def test_fault_spec_rejects_an_unknown_kind_and_lists_the_kinds():
    """An unknown kind is a ConfigError that names it and every accepted kind."""
    with pytest.raises(ConfigError) as error:
        FaultSpec.parse("explode:0.5")
    message = str(error.value)
    assert "unknown fault kind 'explode'" in message
    assert "drop, delay, corrupt, refuse, stall, die" in message


@pytest.mark.parametrize(
    ("text", "wording"),
    [
        ("corrupt:lots", "fault rate 'lots' in 'corrupt:lots' is not a number"),
        ("corrupt:1.5", "fault rate 1.5 in 'corrupt:1.5' is outside [0, 1]"),
        ("drop:-0.1", "fault rate -0.1 in 'drop:-0.1' is outside [0, 1]"),
    ],
)
def test_fault_spec_rejects_a_bad_rate_with_a_clear_message(text, wording):
    """A rate that is not a probability is a ConfigError quoting the spec."""
    with pytest.raises(ConfigError, match=f"^{re.escape(wording)}$"):
        FaultSpec.parse(text)


def test_fault_injector_decides_once_per_room_and_peer():
    """A room's fault is the same every time it is asked, and a peer filter limits it to matching peers."""
    injector = FaultInjector((FaultSpec.parse("drop:0.5@decode-1"),), seed=3)
    picks = {room: injector.pick(room, "decode-1/TP0") for room in range(200)}

    assert picks == {room: injector.pick(room, "decode-1/TP0") for room in range(200)}
    assert {None, FaultKind.DROP} == set(picks.values())
    assert all(injector.pick(room, "decode-0/TP0") is None for room in range(200))
    assert FaultInjector().pick(1, "decode-1/TP0") is None
    assert not FaultInjector()


# --- errors and settings -----------------------------------------------------------------


def test_kv_transfer_error_renders_exactly_as_sglang():
    """str(KVTransferError) is `KVTransferError(bootstrap_room=N): reason`, and it keeps origin and flag."""
    error = KVTransferError(123, "Aborted by AbortReq.", is_from_another_rank=True, origin="decode-0/TP1")

    assert str(error) == "KVTransferError(bootstrap_room=123): Aborted by AbortReq."
    assert (error.bootstrap_room, error.failure_reason) == (123, "Aborted by AbortReq.")
    assert error.is_from_another_rank and error.origin == "decode-0/TP1"
    assert isinstance(error, TransportError)


def test_counters_add_an_item_with_its_bytes():
    """add_with_bytes counts one item and its bytes; add and reject count under their names."""
    counters = Counters(("chunks", "bytes", "rejected_malformed"))
    counters.add_with_bytes("chunks", "bytes", 4096)
    counters.add_with_bytes("chunks", "bytes", 100)
    counters.add("chunks", 2)
    counters.reject("malformed")
    assert counters.snapshot() == {"chunks": 4, "bytes": 4196, "rejected_malformed": 1}


def test_frame_rejected_carries_its_counter_reason():
    """FrameRejected keeps the counter key apart from the human detail."""
    error = FrameRejected("oversize", "too big")
    assert (error.reason, error.detail, str(error)) == ("oversize", "too big", "oversize: too big")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Timeouts(bootstrap_s=0),
        lambda: Timeouts(transfer_s=-1),
        lambda: TransferConfig(chunk_bytes=0),
        lambda: TransferConfig(chunk_bytes=2 << 20, window_bytes=1 << 20),
        lambda: TransferConfig(heartbeat_s=5.0, peer_timeout_s=5.0),
        lambda: Timeouts(waiting_s=float("inf")),
        lambda: Timeouts(bootstrap_s=float("nan")),
        lambda: TransferConfig(peer_timeout_s=float("inf")),
        lambda: TransferConfig(retain_finished_s=0),
        lambda: TransferConfig(retain_finished_s=float("nan")),
    ],
    ids=["zero-timeout", "negative-timeout", "zero-chunk", "window-below-chunk", "heartbeat-not-below-peer-timeout",
         "infinite-timeout", "nan-timeout", "infinite-peer-timeout", "zero-retention", "nan-retention"],
)  # fmt: skip
def test_settings_that_cannot_work_are_config_errors(make):
    """Impossible timeouts, chunk sizes, windows and heartbeats are refused up front."""
    with pytest.raises(ConfigError):
        make()


# --- pool --------------------------------------------------------------------------------


def test_pool_allocates_consecutive_pages_and_reuses_released_ones():
    """A fresh pool hands out consecutive pages; released pages come back to the free list."""
    pool = KVPool(num_pages=8, page_bytes=64)
    first = pool.allocate(3)
    second = pool.allocate(2)

    assert first.tolist() == [0, 1, 2] and second.tolist() == [3, 4]
    assert first.dtype == np.uint32
    assert pool.free_pages == 3
    pool.release(first)
    assert pool.free_pages == 6
    assert pool.allocate(3).tolist() == [0, 1, 2]


def test_pool_raises_pool_exhausted_when_too_few_pages_are_free():
    """Asking for more pages than are free raises PoolExhausted (a ConfigError) and takes nothing."""
    pool = KVPool(num_pages=4, page_bytes=64)
    pool.allocate(3)

    with pytest.raises(PoolExhausted, match="2 pages requested, 1 free of 4"):
        pool.allocate(2)
    assert pool.free_pages == 1
    assert issubclass(PoolExhausted, ConfigError)


@pytest.mark.parametrize(("num_pages", "page_bytes", "layers"), [(0, 64, 1), (4, 0, 1), (4, 100, 3)])
def test_pool_refuses_a_layout_that_cannot_work(num_pages, page_bytes, layers):
    """No pages, empty pages, or pages that do not split into equal layers are ConfigErrors."""
    with pytest.raises(ConfigError):
        KVPool(num_pages, page_bytes, layers)


def test_pool_pattern_is_deterministic_and_room_specific():
    """fill_pattern writes the same bytes for the same seed and different bytes for another room."""
    a, b = KVPool(4, 256), KVPool(4, 256)
    pages = np.array([2, 0], dtype=np.uint32)
    a.fill_pattern(pages, seed=99)
    b.fill_pattern(pages, seed=99)
    assert np.array_equal(a.data, b.data)
    assert a.digest(pages) == b.digest(pages)
    b.fill_pattern(pages, seed=100)
    assert a.digest(pages) != b.digest(pages)
    assert not a.data[[1, 3]].any()
    assert KVPool(4, 256, layers=2).layer_view().shape == (4, 2, 128)


@pytest.mark.parametrize(
    ("lists", "breaks"),
    [
        (([0, 1, 2, 5, 6, 9],), [3, 5]),
        (([0, 1, 2, 3], [7, 8, 0, 1]), [2]),
        (([4, 5, 6], [1, 2, 3]), []),
        (([3, 2, 1],), [1, 2]),
        (([7],), []),
        (([],), []),
    ],
)
def test_run_breaks_finds_where_any_list_stops_advancing_by_one(lists, breaks):
    """A break is a position where at least one page list does not continue with the next page."""
    assert breaks == run_breaks(*(np.asarray(pages, dtype=np.uint32) for pages in lists))


@pytest.mark.parametrize(
    ("start", "count", "runs"),
    [(0, 6, [3, 2, 1]), (2, 3, [1, 2]), (3, 2, [2]), (5, 1, [1]), (0, 3, [3]), (4, 0, [0])],
)
def test_split_runs_cuts_a_window_at_the_breaks(start, count, runs):
    """The runs of [start, start+count) end at every break strictly inside the window."""
    assert runs == split_runs([3, 5], start, count)


@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.data())
def test_split_runs_covers_every_window_with_consecutive_runs(pages, data):
    """For any page list and window, the runs add up to the window and each run is consecutive pages."""
    array = np.asarray(pages, dtype=np.uint32)
    start = data.draw(st.integers(0, len(pages) - 1))
    count = data.draw(st.integers(1, len(pages) - start))

    runs = split_runs(run_breaks(array), start, count)

    assert sum(runs) == count and all(run > 0 for run in runs)
    position = start
    for run in runs:
        assert np.array_equal(array[position : position + run], array[position] + np.arange(run))
        position += run


@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.data())
def test_is_one_run_agrees_with_split_runs(pages, data):
    """A window is one run exactly when split_runs cuts it into a single run."""
    breaks = run_breaks(np.asarray(pages, dtype=np.uint32))
    start = data.draw(st.integers(0, len(pages) - 1))
    count = data.draw(st.integers(1, len(pages) - start))
    assert is_one_run(breaks, start, count) == (len(split_runs(breaks, start, count)) == 1)


def test_pool_rows_is_a_writable_view_of_consecutive_pages():
    """rows(first, count) is the flat bytes of those pages, shared with the pool (no copy)."""
    pool = KVPool(4, 256)
    pool.fill_pattern(np.arange(4, dtype=np.uint32), seed=3)
    rows = pool.rows(1, 2)
    assert len(rows) == 512 and bytes(rows) == pool.data[1:3].tobytes()
    rows[0] ^= 0xFF
    assert pool.data[1, 0] == rows[0]


@pytest.mark.parametrize("page_bytes", [4096, LAND_BLOCK_BYTES, 3 * LAND_BLOCK_BYTES // 2])
def test_a_frame_landed_a_block_at_a_time_is_copied_whole_with_each_pages_digest(page_bytes):
    """`land_digested` over a frame of several blocks and a partial one (pages smaller than a block, as large,
    larger): every byte lands, and the digests are the landed pages' xxh3-64, in order, as a writer seals them."""
    pages = 2 * max(1, LAND_BLOCK_BYTES // page_bytes) + 1
    sender, receiver = KVPool(pages, page_bytes), KVPool(pages, page_bytes)
    everything = np.arange(pages, dtype=np.uint32)
    sender.fill_pattern(everything, seed=9)

    digests = land_digested(sender.rows(0, pages), receiver.rows(0, pages), page_bytes)

    assert np.array_equal(receiver.data, sender.data)
    assert digests == sender.sealed_digests(everything)


# --- wire --------------------------------------------------------------------------------


def agent_info() -> AgentInfo:
    return AgentInfo("decode", "decode-0", 1, 2, 4096, "", "tcp://127.0.0.1:1", 42, "host", 9)


def test_encoded_frames_start_with_the_wire_version_and_round_trip():
    """Every control frame is the version byte then msgpack, and decodes back to an equal message."""
    message = TransferRequest(5, 1, np.arange(3, dtype="<u4").tobytes(), 0, 2048, 2048, 1)
    frame = encode(message)

    assert frame[0] == WIRE_VERSION
    assert message == FrameDecoder(LinkMessage).decode(frame)
    assert agent_info().label == "decode-0/TP1"


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "malformed"),
        (b"\x01", "malformed"),
        (b"\x01\xc1", "malformed"),
        (encode(Hello(agent_info(), 1 << 20))[:-4], "malformed"),
        (encode(Submit(1, 2, 3)), "malformed"),
        (bytes([WIRE_VERSION + 1]) + encode(Hello(agent_info(), 1))[1:], "unknown_version"),
        (b"\x00", "unknown_version"),
        (bytes(MAX_CONTROL_FRAME + 1), "oversize"),
    ],
    ids=["empty", "version-only", "not-msgpack", "truncated", "other-socket", "next-version", "zero", "oversize"],
)
def test_frame_decoder_rejects_bad_frames_with_the_counter_reason(frame, reason):
    """Frames that break the format raise FrameRejected whose reason is the counter key."""
    with pytest.raises(FrameRejected) as rejected:
        FrameDecoder(LinkMessage).decode(frame)
    assert reason == rejected.value.reason


def test_frame_decoder_size_limit_is_inclusive():
    """A frame of exactly MAX_CONTROL_FRAME bytes is decoded; one byte more is rejected as oversize."""
    overhead = len(encode(Submit(1, 2, 3, "x" * 100_000))) - 100_000
    message = Submit(1, 2, 3, "x" * (MAX_CONTROL_FRAME - overhead))
    frame = encode(message)
    assert len(frame) == MAX_CONTROL_FRAME

    assert message == FrameDecoder(ControlRequest).decode(frame)
    with pytest.raises(FrameRejected, match=r"^oversize"):
        FrameDecoder(ControlRequest).decode(frame + b"\0")


# --- mapping -----------------------------------------------------------------------------


def test_equal_tp_pairs_each_decode_rank_with_the_same_prefill_rank():
    """With equal TP, decode rank r takes prefill rank r's whole rows."""
    assert [Pairing(1, 1, 0, 0, 4096, 1, 1)] == pairings_for_decode_rank(1, 2, 4096, 2, 4096)


def test_larger_decode_tp_takes_a_slice_of_one_prefill_rank():
    """With k = dTP/pTP, decode rank r gets bytes [(r%k)*dpb, (r%k+1)*dpb) of prefill rank r//k, which waits for k."""
    assert [Pairing(1, 3, 1024, 0, 1024, 2, 1)] == pairings_for_decode_rank(3, 4, 1024, 2, 2048)
    assert [Pairing(0, 2, 2048, 0, 1024, 4, 1)] == pairings_for_decode_rank(2, 4, 1024, 1, 4096)


def test_larger_prefill_tp_fills_each_decode_row_from_several_prefill_ranks():
    """With k = pTP/dTP, decode rank r concatenates prefill ranks r*k..r*k+k-1 and waits for k responses."""
    assert [
        Pairing(2, 1, 0, 0, 2048, 1, 2),
        Pairing(3, 1, 0, 2048, 2048, 1, 2),
    ] == pairings_for_decode_rank(1, 2, 4096, 4, 2048)


@pytest.mark.parametrize(
    ("args", "wording"),
    [
        ((0, 3, 2048, 2, 3072), "TP sizes 3 and 2 do not divide each other"),
        ((0, 2, 3072, 3, 2048), "TP sizes 3 and 2 do not divide each other"),
        ((0, 2, 4096, 1, 4096), "logical page sizes differ"),
        ((2, 2, 4096, 2, 4096), "decode rank 2 is outside TP size 2"),
    ],
    ids=["decode-3-prefill-2", "prefill-3-decode-2", "page-size", "rank-range"],
)
def test_mapping_refuses_layouts_that_cannot_pair(args, wording):
    """TP sizes that do not divide, different logical pages or a rank out of range are ConfigErrors."""
    with pytest.raises(ConfigError, match=wording):
        pairings_for_decode_rank(*args)


def test_a_harness_passes_a_rank_every_option_as_one_json_argument():
    """`child_args` gives one JSON argument that `parse_args` turns back into the very same options."""
    options = AgentOptions(
        role=Role.PREFILL,
        instance="prefill-1",
        rank=1,
        tp=2,
        bootstrap="tcp://127.0.0.1:9",
        transfer=TransferConfig(chunk_bytes=4096, window_bytes=8192, timeouts=Timeouts(1.0, 2.0, 3.0)),
        faults=(FaultSpec(FaultKind.DROP, 0.5, "decode-0"), FaultSpec(FaultKind.DIE)),
        fault_seed=7,
        log_file="/tmp/p.log",
    )

    assert parse_args(child_args(options)) == options


def test_a_bad_value_in_the_json_options_is_a_usage_error(capsys: pytest.CaptureFixture[str]):
    """A value the options refuse exits 2 naming where it is, as a bad flag would."""
    args = child_args(AgentOptions(role=Role.DECODE, instance="decode-0", rank=0, tp=1, bootstrap="tcp://x:9"))

    with pytest.raises(SystemExit) as exited:
        parse_args([args[0], args[1].replace('"chunk_bytes":1048576', '"chunk_bytes":-1')])

    assert exited.value.code == 2
    assert "chunk_bytes must be positive, got -1 - at `$.transfer`" in capsys.readouterr().err
