"""SGLang log lines: prefixes in every shape, the failure lines, every reason string, batch and context lines."""

from __future__ import annotations

import calendar
import json

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.infer import to_failure
from kvtop.sources.sglang.lines import BatchLine, ContextLine, FailureLine, Garbled, as_printed, classify
from kvtop.sources.sglang.prefix import parse_prefix
from transport.sglang import reasons
from transport.sglang.reasons import reason_class

pytestmark = pytest.mark.usefixtures("utc")

T = calendar.timegm((2026, 1, 2, 3, 4, 5, 0, 0, 0))
DECODE = (
    "Decode transfer failed for request rank=1 decode_req.req.rid='4753a5' decode_req.req.bootstrap_room=51 "
    "with exception KVTransferError(bootstrap_room=51): Request 51 timed out after 300.0s in KVPoll.WaitingForInput"
)


@pytest.mark.parametrize(
    ("line", "ts", "tags"),
    [
        ("[2026-01-02 03:04:05 TP3] x", T, {"TP": 3}),
        ("[2026-01-02 03:04:05 TP3 EP3] x", T, {"TP": 3, "EP": 3}),
        ("[2026-01-02 03:04:05 DP3 TP3] x", T, {"DP": 3, "TP": 3}),
        ("[2026-01-02 03:04:05 DP3 TP3 EP3] x", T, {"DP": 3, "TP": 3, "EP": 3}),
        ("[2026-01-02 03:04:05 PP0 ATTN_CP1 TP1 EP1] x", T, {"PP": 0, "ATTN_CP": 1, "TP": 1, "EP": 1}),
        ("[2026-01-02 03:04:05 DP0 TP2 EP2 PP1] x", T, {"DP": 0, "TP": 2, "EP": 2, "PP": 1}),
        ("[2026-01-02 03:04:05] x", T, {}),
        ("[2026-01-02 03:04:05.250 TP1] x", T + 0.25, {"TP": 1}),
        ("2026-01-02T03:04:05.123456789+08:00 stderr F [2026-01-02 03:04:05 TP1] x", T, {"TP": 1}),
        ("Jan 2, 2026 @ 03:04:05.123    [2026-01-02 03:04:05 TP1] x   ", T, {"TP": 1}),
        ("x", None, {}),
    ],
    ids=["tp", "tp-ep", "dp-tp", "dp-tp-ep", "pp-attn-cp", "old-order", "empty", "ms", "container", "dashboard",
         "pasted"],
)  # fmt: skip
def test_every_prefix_shape_gives_time_ranks_and_message(line, ts, tags):
    """Rank tags in any order and subset, milliseconds, shipper wrappers, no prefix: time, tags, message."""
    prefix = parse_prefix(line)

    assert (ts, tags, "x") == (prefix.ts, prefix.tags, prefix.message)


def test_a_failure_line_gives_its_rank_room_rid_and_reason():
    """The decode transfer line: TP rank from the prefix, room and reason from the KVTransferError."""
    record = classify(parse_prefix(f"[2026-01-02 03:04:05 TP1] {DECODE}"), 2026)

    assert FailureLine(T, 1, "Decode transfer", "4753a5", 51,
                       "Request 51 timed out after 300.0s in KVPoll.WaitingForInput", True) == record  # fmt: skip


def test_a_failure_quoted_in_a_clients_json_response_ends_where_its_string_ends():
    """SGLang issue #7338 pasted the response a client got (`finish_reason.message`): the reason kept the rest of
    the JSON and the shell prompt after it. The string is read as JSON (its escapes undone) up to its quote."""
    response = (
        '{"text":"","meta_info":{"id":"4753a5","finish_reason":{"type":"abort","message":"'
        + DECODE.replace("300.0s", 'a \\"300.0s\\"')
        + '","status_code":500,"err_type":null},"prompt_tokens":8}}root@host:/# tail -f prefill.log'
    )

    record = classify(parse_prefix(response), 2026)

    assert isinstance(record, FailureLine)
    assert (record.what, record.tp, record.room) == ("Decode transfer", 1, 51)
    assert record.reason == 'Request 51 timed out after a "300.0s" in KVPoll.WaitingForInput'


@pytest.mark.parametrize(
    ("message", "what", "role"),
    [
        ("Decode handshake failed for request rank=2 decode_req.req.rid='r' decode_req.req.bootstrap_room=7",
         "Decode handshake", "decode"),
        ("Decode transfer failed for request rank=2 decode_req.req.rid='r' decode_req.req.bootstrap_room=7",
         "Decode transfer", "decode"),
        ("Prefill transfer failed for request rank=2 req.rid='r' req.bootstrap_room=7",
         "Prefill transfer", "prefill"),
        ("Prefill bootstrap failed for request rank=2 req.rid='r' req.bootstrap_room=7",
         "Prefill bootstrap", "prefill"),
    ],
)  # fmt: skip
def test_the_four_failure_lines_name_their_side_and_take_the_rank_field_without_a_prefix(message, what, role):
    """Each of the four lines is recognised; pasted without a prefix, its rank is the `rank=` field."""
    record = classify(parse_prefix(f"{message} with exception KVTransferError(bootstrap_room=7): Aborted by AbortReq."),
                      2026)  # fmt: skip

    assert isinstance(record, FailureLine)
    assert (what, role, 2, 7, None) == (record.what, record.role, record.tp, record.room, record.ts)


def test_exceptions_that_are_not_kv_transfer_errors_and_missing_room_fields():
    """A bare backend code keeps the room field; a room only in the exception is found; neither: no room."""
    bare = "Prefill transfer failed for request rank=0 req.rid='r' req.bootstrap_room=8 with exception NIXL_ERR_REMOTE"
    only_in_error = (
        "Prefill transfer failed for request rank=0 req.rid='r' with exception KVTransferError(bootstrap_room=9): x"
    )
    none = "Prefill transfer failed for request rank=0 req.rid='r' with exception RuntimeError('worker crashed')"

    records = [classify(parse_prefix(line), 2026) for line in (bare, only_in_error, none)]

    assert [(r.room, r.reason, r.is_kv_error) for r in records if isinstance(r, FailureLine)] == [
        (8, "NIXL_ERR_REMOTE", False),
        (9, "x", True),
        (None, "RuntimeError('worker crashed')", False),
    ]
    assert to_failure(records[2], "prefill-0/TP0", T) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("Request 5 timed out after 300.0s in KVPoll.Bootstrapping", "timeout_bootstrap"),
        ("Request 5 timed out after 300.0s in KVPoll.WaitingForInput", "timeout_waiting"),
        ("Request 5 timed out after 12.5s in KVPoll.Transferring", "timeout_transfer"),
        ("Failed to send kv chunk of 5 to 10.0.0.7:15004", "send_failed"),
        ("Decode instance could be dead, remote mooncake session 10.0.0.7:15004 is not alive", "peer_lost"),
        ("Decode instance could be dead, remote session decode-0/TP1 is not alive", "peer_lost"),
        ("Decode instance could be dead, remote Mooncake session 10.0.0.7:15004 is not alive", "peer_lost"),
        ("Decode instance could be dead, remote p2p session 10.0.0.7:15004_4738 is not alive;code=0", "peer_lost"),
        ("Failed to get kvcache from prefill instance, it might be dead", "propagated"),
        ("Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998)", "peer_lost"),
        ("Lost connection with rank decode-0/TP1 of this instance", "peer_lost"),
        ("Aborted by AbortReq.", "aborted"),
        ("Aborted by decode peer decode-0/TP1", "propagated"),
        ("Aborted by decode-side abort notification.", "propagated"),  # SGLang 0.5.23's NIXL backend
        ("Failed due to an unknown reason from another rank", "propagated"),
        ("KV chunk 1 of room 5 from prefill rank 1 failed its checksum (expected 1, got 2)", "checksum"),
        ("Prefill rank 0 refused the transfer request of room 5", "refused"),
        ("NIXL_ERR_REMOTE_DISCONNECT", "peer_lost"),  # NIXL: "remote agent disconnected"
        ("NIXL_ERR_NOT_FOUND", "other"),
    ],
)
def test_every_reason_string_has_its_class(reason, expected):
    """SGLang's reasons (and our agents' own) map to the closed set of reason classes."""
    assert expected == reason_class(reason)


def test_the_classes_of_reasons_kept_are_bounded_and_read_alike_after_they_go():
    """`reason_class` keeps the classes it read (a log repeats its reasons) up to a bound, then drops them: a reason
    asked again, kept or not, has the class it had."""
    reason = "Request 5 timed out after 300.0s in KVPoll.WaitingForInput"
    assert reason_class(reason) == reason_class(reason) == "timeout_waiting"
    for room in range(reasons._CLASSES_KEPT + 1):  # a reason a room: every one new
        assert reason_class(f"Request {room} timed out after 300.0s in KVPoll.Bootstrapping") == "timeout_bootstrap"
        assert len(reasons._classes) <= reasons._CLASSES_KEPT
    assert reason_class(reason) == "timeout_waiting"


@pytest.mark.parametrize(
    ("line", "origin", "from_another_rank", "level"),
    [
        ("Decode transfer failed for request rank=1 decode_req.req.rid='r' decode_req.req.bootstrap_room=5 "
         "with exception KVTransferError(bootstrap_room=5): Request 5 timed out after 300.0s in KVPoll.Transferring",
         "decode-0/TP1", False, "error"),
        ("Prefill transfer failed for request rank=1 req.rid='r' req.bootstrap_room=5 "
         "with exception KVTransferError(bootstrap_room=5): Failed to send kv chunk of 5 to 10.0.0.7:1", "decode-0/TP1",
         False, "warning"),
        ("Decode transfer failed for request rank=1 decode_req.req.rid='r' decode_req.req.bootstrap_room=5 "
         "with exception KVTransferError(bootstrap_room=5): Failed due to an unknown reason from another rank", "",
         True, "debug"),
        ("Decode transfer failed for request rank=1 decode_req.req.rid='r' decode_req.req.bootstrap_room=5 "
         "with exception KVTransferError(bootstrap_room=5): Failed to get kvcache from prefill instance, it might be "
         "dead", "", False, "debug"),
        ("Prefill transfer failed for request rank=1 req.rid='r' req.bootstrap_room=5 "
         "with exception KVTransferError(bootstrap_room=5): Aborted by AbortReq.", "decode-0/TP1", False, "warning"),
    ],
    ids=["decode-origin", "prefill-origin", "instance-echo", "cross-echo", "prefill-abort"],
)  # fmt: skip
def test_origins_are_their_own_and_echoes_have_no_origin(line, origin, from_another_rank, level):
    """Inference from the text: own origin at error/warning, or an echo (origin unknown) at debug."""
    record = classify(parse_prefix(line), 2026)
    assert isinstance(record, FailureLine)

    failure = to_failure(record, "decode-0/TP1", T)

    assert failure is not None
    assert (origin, from_another_rank, level) == (failure.origin, failure.is_from_another_rank, failure.level)


@pytest.mark.parametrize(
    ("message", "role", "queues"),
    [
        ("Prefill batch. #new-seq: 1, #running-req: 0, #unbootstrapped-req: 2, #queue-req: 0, #transferring-req: 1",
         "prefill", {"queue_running": 0, "queue_unbootstrapped": 2, "queue_queue": 0, "queue_transferring": 1}),
        ("Prefill batch, #new-seq: 2, #running-req: 0, #queue-req: 1, #prealloc-req: 3, #inflight-req: 4, ",
         "prefill", {"queue_running": 0, "queue_queue": 1, "queue_prealloc": 3, "queue_inflight": 4}),
        ("Prefill batch, #new-seq: 2, #running-req: 0, #queue-req: 1, #bootstrap-req: 5, #inflight-req: 6, ",
         "prefill", {"queue_running": 0, "queue_queue": 1, "queue_bootstrap": 5, "queue_inflight": 6}),
        ("Decode batch, #running-req: 3, #token: 1200, token usage: 0.05, pre-allocated usage: 0.02, "
         "#prealloc-req: 2, #transfer-req: 1, #retracted-req: 0, cuda graph: True, #queue-req: 0, ",
         "decode", {"queue_running": 3, "queue_prealloc": 2, "queue_transfer": 1, "queue_retracted": 0,
                    "queue_queue": 0, "prealloc_usage_permille": 20}),
    ],
    ids=["prefill-mid-2025", "prefill-prealloc", "prefill-2026", "decode"],
)  # fmt: skip
def test_batch_lines_of_every_era_give_queue_depths(message, role, queues):
    """`Prefill batch.`/`Prefill batch,` with each era's queue fields, and the decode batch line."""
    assert BatchLine(T, 0, role, queues) == classify(parse_prefix(f"[2026-01-02 03:04:05 TP0] {message}"), 2026)


@pytest.mark.parametrize(
    ("line", "kind", "room", "ts"),
    [
        ("[2026-01-02 03:04:05 TP1] Session 10.0.0.7:15004 failed.", "session", None, T),
        ("[2026-01-02 03:04:05 TP0] Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998), "
         "3 requests affected", "lost_connection", None, T),
        ("[2026-01-02 03:04:05 TP1] NIXL transport error for room 88: NIXL_ERR_REMOTE_DISCONNECT", "room", 88, T),
        ("[2026-01-02 03:04:05 TP1] Unexpected transfer worker error for room 99", "room", 99, T),
        ('[2026-01-02 03:04:05] {"finish_reason": {"type": "abort", "message": "KVTransferError(bootstrap_room=18): '
         'Aborted by AbortReq."}}', "room", 18, T),
        ("[2026-01-02 03:04:05 TP0] Some requests fail to receive KV Cache transfer done signal after bootstrapping.",
         "hint", None, T),
        ("[2026-01-02 03:04:05 TP0] Error fetching prefill parallel info from bootstrap: timed out", "bootstrap_error",
         None, T),
        ("[2026-01-02 03:04:05 TP0] Error querying dp_ranks from bootstrap: refused", "bootstrap_error", None, T),
        ("E0102 03:04:05.500000  4242 worker_pool.cpp:294] Worker: Process failed for slice (peer_nic: "
         "10.0.0.7:15004@mlx5_7): local protection error", "glog", None, T + 0.5),
        ("E0102 03:04:05.000000  4242 tcp_transport.cpp:120] Session::writeBody failed. Error: Broken pipe", "glog",
         None, T),
        (f"[{T}.250000] [node-7:4243:0]     ucp_worker.c:1853 UCX  ERROR   Connection reset by remote peer", "ucx",
         None, T + 0.25),
        ("Traceback (most recent call last):", "traceback", None, None),
    ],
    ids=["session", "lost", "nixl", "worker", "client-abort", "hint", "parallel-info", "dp-ranks",
         "glog", "glog-tcp", "ucx", "traceback"],
)  # fmt: skip
def test_related_and_transport_library_lines_are_context(line, kind, room, ts):
    """Lines around failures are kept as context: their kind, their room if any, and their time."""
    record = classify(parse_prefix(line), 2026)

    assert isinstance(record, ContextLine)
    assert (kind, room, ts) == (record.kind, record.room, record.ts)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-01-02 03:04:05 TP1] Prefill transfer failed for request rank=1 req.rid='tr",
        "[2026-01-02 03:04:05 TP1] Decode transfer failed for request rank=1 decode_req.req.rid='r' decode_re",
        "Prefill transfer failed ... Failed to send kv chunk of ... to 10.244.x.x:37233",  # edited for a note
    ],
)
def test_a_truncated_failure_line_is_garbled(line):
    """A failure line cut before its exception, or whose request was cut out, cannot be read: it is reported as
    garbled, not guessed (the last was read as nothing, not even garbled)."""
    with pytest.raises(Garbled):
        classify(parse_prefix(line), 2026)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-01-02 03:04:05 TP2000] Decode batch, #running-req: 3, #prealloc-req: 2, #transfer-req: 1, ",
        "[2026-01-02 03:04:05 DP0 TP99999999999999999999] Decode batch, #running-req: 3, #transfer-req: 1, ",
        "[2026-01-02 03:04:05] Decode transfer failed for request rank=5000 decode_req.req.rid='r' "
        "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): boom",
    ],
    ids=["TP2000", "a tag past 64 bits", "rank=5000"],
)
def test_a_rank_tag_no_server_has_is_a_garbled_line(line):
    """A rank tag past 1023 (in the prefix or a failure line's rank=) is garbled, counted and skipped: it made a
    sidecar announce 2,001 ranks (every view refused them), and one past 64 bits killed its publisher."""
    with pytest.raises((Garbled, ValueError)):
        classify(parse_prefix(line), 2026)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-01-02 03:04:05 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r' "
        f"decode_req.req.bootstrap_room={2**70} with exception KVTransferError(bootstrap_room={2**70}): boom",
        f"[2026-01-02 03:04:05 TP1] Unexpected transfer worker error for room {2**64}",
    ],
    ids=["failure", "context"],
)
def test_a_room_past_63_bits_is_a_garbled_line(line):
    """SGLang draws rooms from 63 bits; a room of 2**70 in one line ended a sidecar's event publisher."""
    with pytest.raises(Garbled):
        classify(parse_prefix(line), 2026)


def test_lines_kvtop_does_not_use_are_nothing():
    """Access logs and other chatter give no record."""
    line = '[2026-01-02 03:04:05] INFO:     10.0.0.2:51234 - "POST /generate HTTP/1.1" 200 OK'

    assert classify(parse_prefix(line), 2026) is None


@pytest.mark.parametrize("transport", ["mooncake", "Mooncake", "p2p"])
def test_a_dead_session_names_the_decode_rank_at_it_whatever_the_transport_s_word(transport: str, tmp_path):
    """SGLang writes `remote mooncake session`, since early 2026 `remote Mooncake session`, and for its p2p
    backend `remote p2p session`: each names the decode rank at the session (the suspect was unknown)."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-02-26 12:53:08 TP4] Prefill transfer failed for request rank=4 req.rid='af2f' req.bootstrap_room=7 "
        f"with exception KVTransferError(bootstrap_room=7): Decode instance could be dead, remote {transport} "
        "session 10.82.101.249:16324 is not alive\n"
    )

    [incident] = json.loads(kvtop_here("incidents", "--sglang-log", str(log), "--json").stdout)["incidents"]

    assert (incident["class"], incident["suspect_text"]) == ("peer_lost", "decode at 10.82.101.249:16324")


_PRINTED = "[2026-01-02 00:00:01 TP2] Decode transfer failed for request rank=2 decode_req.req.rid='ab12' "
_TAKEN = [  # in `as_printed`'s shape: read by its one match
    _PRINTED + "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): Request 7 timed out",
    _PRINTED + "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=None): x ][ y ]: z  \r",
    _PRINTED + "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=8): a with exception b",
    "[2026-01-02 00:00:01 TP02] Prefill bootstrap failed for request rank=2 req.rid='' req.bootstrap_room=9 "
    "with exception KVTransferError(bootstrap_room=9):   Failed due to an unknown reason from another rank",
    "[2026-01-02 00:00:01 TP0] Decode handshake failed for request rank=0 rid='a-b_c' bootstrap_room=1 "
    "with exception KVTransferError(bootstrap_room=1): " + "x" * 3000,
]
_ROOM_7 = "bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): x"
_LEFT = [  # another shape, or one the general reading refuses: read by it
    _PRINTED + "decode_req.req." + _ROOM_7 + " \x1b[31mred\x1b[0m",
    _PRINTED + "decode_req.req." + _ROOM_7 + " (HiCache local restore failed on this rank)",
    _PRINTED + f"decode_req.req.bootstrap_room={1 << 63} with exception KVTransferError(bootstrap_room=7): x",
    _PRINTED.replace("TP2]", "TP2000]") + _ROOM_7,
    _PRINTED.replace("'ab12'", "'a bootstrap_room=5'") + _ROOM_7,
    _PRINTED.replace("rid=", "xrid=") + _ROOM_7,
    _PRINTED.replace("00:00:01", "00:00:01.25") + _ROOM_7,
    _PRINTED.replace("TP2]", "DP1 TP2]") + _ROOM_7,
    "\ufeff" + _PRINTED + _ROOM_7,
    _PRINTED + _ROOM_7 + "\nTraceback (most recent call last):",
]


def _read(line: str) -> object:
    """What the general reading makes of a line (`parse_prefix`, `classify`), or the error it raises."""
    try:
        prefix = parse_prefix(line)
        return prefix, classify(prefix, 2026)
    except (Garbled, ValueError) as error:
        return type(error)


@pytest.mark.parametrize("line", _TAKEN)
def test_a_failure_line_as_sglang_prints_it_is_read_in_one_match_as_the_general_reading_reads_it(line: str):
    assert as_printed(line) == _read(line)


@pytest.mark.parametrize("line", _LEFT)
def test_a_failure_line_of_another_shape_or_one_refused_is_left_to_the_general_reading(line: str):
    assert as_printed(line) is None
    assert _read(line) is not None


_LOST = "[2026-01-02 00:00:01 TP2] Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998)"
_LOST_TAKEN = [  # in `_LOST_AS_PRINTED`'s shape: read by one match
    _LOST,
    _LOST + ", 3 requests affected",
    "[2026-01-02 00:00:01 TP02] Losing connection with prefill instance (bootstrap_addr: sglang-p-0:30089), "
    "affected 5 requests  \r",
    _LOST.replace("10.0.0.5:8998", "batch-room.cc:8998"),  # an address that holds what other lines' tests look for
]
_LOST_LEFT = [  # another shape, or one the general reading refuses: read by it
    _LOST.replace("10.0.0.5:8998", "[fe80::1%eth0]:8998"),
    _LOST.replace("10.0.0.5:8998", "10.0.0.5:8998 \x1b[31m"),
    _LOST.replace("TP2]", "DP1 TP2]"),
    _LOST.replace("TP2]", "TP2000]"),
    _LOST.replace("00:00:01", "00:00:01.25"),
    _LOST + ", 3 requests affected; Session 10.0.0.5:17001 failed.",
    "\ufeff" + _LOST,
]


@pytest.mark.parametrize("line", _LOST_TAKEN)
def test_a_lost_connection_as_sglang_prints_it_is_read_in_one_match_as_the_general_reading_reads_it(line: str):
    printed = as_printed(line)
    assert printed is not None
    assert printed[1] == ContextLine(printed[0].ts, 2, "lost_connection", None, line.rstrip().partition("] ")[2])
    assert printed == _read(line)


@pytest.mark.parametrize("line", _LOST_LEFT)
def test_a_lost_connection_of_another_shape_or_one_refused_is_left_to_the_general_reading(line: str):
    assert as_printed(line) is None
    assert _read(line) is not None


def test_a_failure_line_as_printed_with_a_time_that_cannot_be_is_refused_as_the_general_reading_refuses_it():
    line = _TAKEN[0].replace("2026-01-02", "2026-13-02")
    with pytest.raises(ValueError):
        as_printed(line)
    assert _read(line) is ValueError
