"""A prefill that failed a room and never told its decode: the decode waits out its 300 s, then records a timeout in
WaitingForInput. kvtop read that timeout as a failure of its own (a second incident, "the prefill side of decode-0
stopped answering": the KV never came), and, once two rooms showed it, took the 300 s for a clock: "decode-0 is 299 s
ahead of prefill-0 (times corrected)", the prefill's failures moved onto the decode's timeouts and the whole thing
blamed on the prefill. The prefill had not hung: its send had failed, and the decode is what broke.

Where it happens: a DeepSeek-R1 disaggregated deployment's notes (Azure ND H100 v5, Dynamo's SGLang runtime,
nvidia_peermem missing) show the decode leader's `RdmaTransport: Failed to register memory`, the prefill leader's
`Session H:P failed.` and `Failed to send kv chunk of R to H:P`, and the decode's `timed out after 300.0s in
KVPoll.WaitingForInput` for the same requests; NIXL's sender tells the decode nothing of its failures before sglang
PR #36108 (sglang issue #36033: "its decode side only discovers a prefill-side failure when its own waiting timeout
expires").

The fixture's lines are in those shapes, with times, hosts and rooms of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

UNNOTIFIED = Path(__file__).parent / "fixtures" / "sglang" / "unnotified-failure"
"""1P1D, TP2 each side, Mooncake: the prefill fails two rooms at 14:21:11-12 (a send to the decode at 10.8.0.23, then
its session blacklisted), the decode times both out at 14:26:10-11, each rank's timeout echoed by the other rank."""
ROOMS = (3141592653589793238, 2718281828459045235)


def args(decode: Path = UNNOTIFIED / "decode.log") -> list[str]:
    return ["--sglang-log", str(UNNOTIFIED / "prefill.log"), "--sglang-log", str(decode)]


def test_a_decode_timeout_after_its_prefill_failed_the_room_is_that_failure_seen_late():
    incidents = json.loads(kvtop_here("incidents", *args(), "--json").stdout)["incidents"]

    assert [(i["suspect_text"], i["class"], i["room_count"], i["origins"]) for i in incidents] == [
        ("decode-0", "send_failed", 2, 2)  # it could not register its memory: test_sglang_unregistered_memory
    ]
    assert sorted(incidents[0]["rooms"]) == sorted(ROOMS)


def test_the_300_s_a_decode_waited_out_is_no_clock_difference():
    check = kvtop_here("check", *args())

    assert "clocks of the logs differ" not in check.stdout + check.stderr
    assert "prefill-0 stopped answering" not in check.stdout
    assert "since 14:21:11" in check.stdout


def test_a_timeout_s_echo_logged_before_it_tells_no_clock_either(tmp_path: Path):
    """Ranks of one instance log the same tick in any order: the other rank's `unknown reason from another rank`
    may come first; it is the timeout's echo, no sample of the clocks."""
    lines = (UNNOTIFIED / "decode.log").read_text().splitlines(keepends=True)
    failures = [i for i, line in enumerate(lines) if "Decode transfer failed" in line]
    for origin, echo in zip(failures[::2], failures[1::2], strict=True):
        lines[origin], lines[echo] = lines[echo], lines[origin]
    swapped = tmp_path / "decode.log"
    swapped.write_text("".join(lines))

    check = kvtop_here("check", *args(swapped))

    assert "clocks of the logs differ" not in check.stdout + check.stderr
    assert "decode-0 fails transfers" in check.stdout


def test_a_prefill_failure_outside_the_decode_s_wait_stays_apart(tmp_path: Path):
    """The decode waited 30 s: a prefill failure of the room 100 s before it timed out happened before that wait
    began (another use of the id), not during it; each is a failure of its own."""
    room = 4242
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    prefill.write_text(
        prefill_failure("2026-05-11 14:00:00", room, f"Failed to send kv chunk of {room} to 10.8.0.23:40211")
    )
    decode.write_text(
        decode_failure("2026-05-11 14:01:40", room, f"Request {room} timed out after 30.0s in KVPoll.WaitingForInput")
    )

    incidents = json.loads(
        kvtop_here("incidents", "--sglang-log", str(prefill), "--sglang-log", str(decode), "--json").stdout
    )["incidents"]

    assert sorted(i["class"] for i in incidents) == ["send_failed", "timeout_waiting"]


def test_status_on_logs_covers_their_whole_span_unless_a_window_is_given():
    """The incident came five minutes before the logs' last line (the decode's timeouts): status's live window of
    60 s said `incidents none in 60s` and `0 failures` over logs holding one, where check judged the whole span."""
    whole = kvtop_here("status", *args()).stdout.splitlines()
    last_minute = kvtop_here("status", *args(), "--window", "60").stdout.splitlines()

    assert whole[0].startswith("incidents 1 in 371s, 0 ongoing: decode-0 fails transfers")
    assert any(line.startswith("health  2 rooms failed (2 failures) in 371s") for line in whole)
    assert last_minute[0].startswith("incidents none in 60s; 1 older, the latest ended ")
