"""One file, several servers: `docker compose logs` and `kubectl logs --prefix` name the server of each line.

The fixture's shape is a public report's (SGLang issue #23272: a 2P2D compose deployment, `docker compose logs`
of every service in one file; its transfer engine's ASIO error, the session that failed); the failure line that
follows it and a decode service's crash interleaved with another service's line are written by me in the shapes
SGLang prints. Before, every line of such a file was one server's, its prefix left on: batch lines were dropped,
a failure line took the time kvtop ran, and the ASIO error was never read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.sources.sglang.prefix import split_stream
from kvtop.sources.sglang.source import STREAM_NAME_MAX, STREAMS_MAX

pytestmark = pytest.mark.usefixtures("utc")

COMPOSE = Path(__file__).parent / "fixtures" / "sglang" / "compose" / "all.log"
PREFILL, DECODE, CRASHED = (f"qwen3-32b-sglang-2p2d-{name}-1" for name in ("prefill-0", "decode-0", "decode-1"))
CRASH = (
    "Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access was encountered, in "
    "sglang/srt/disaggregation/decode.py:1773 process_decode_queue"
)


def as_kubectl(tmp_path: Path) -> Path:
    """The fixture as `kubectl logs --prefix` prints it: `[pod/NAME/sglang] ` before each line."""
    log = tmp_path / "pods.log"
    log.write_text(re.sub(r"^([\w.-]+) +\| ", r"[pod/\1/sglang] ", COMPOSE.read_text(), flags=re.MULTILINE))
    return log


@pytest.fixture(params=["compose", "kubectl"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return COMPOSE if request.param == "compose" else as_kubectl(tmp_path)


def test_each_server_a_wrapper_names_is_an_instance_of_its_own_with_the_role_its_name_says(log: Path):
    ranks = json.loads(kvtop_here("ranks", "--sglang-log", str(log), "--json").stdout)

    assert {rank["label"]: rank["role"] for rank in ranks} == {
        f"{PREFILL}/TP0": "prefill", f"{DECODE}/TP0": "decode", f"{CRASHED}/TP0": "decode",
    }  # fmt: skip
    assert {rank["label"]: rank["inflight"] for rank in ranks}[f"{DECODE}/TP0"] == 26  # its batch line's


def test_a_failure_keeps_its_line_s_time_and_the_transfer_engine_s_error_is_its_likely_cause(log: Path):
    [group] = json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"]

    assert group["origin"]["rank"] == f"{PREFILL}/TP0"
    assert group["origin"]["ts"] == 1777564946.0  # 2026-04-30 16:02:26 UTC, not when kvtop ran
    [cause] = [context for context in group["context"] if context["likely_cause"]]
    assert "tcp_transport.cpp:542] TcpTransport::startTransfer encountered an ASIO exception" in cause["text"]


def test_a_server_s_traceback_is_gathered_across_another_server_s_lines(log: Path):
    """decode-1's traceback is cut by a prefill batch line in the middle: its own lines still end in its
    exception, and the prefill line is read too (its batch line counted)."""
    result = kvtop_here("ranks", "--sglang-log", str(log), "--json")

    crashed = {rank["label"]: rank["crashed"] for rank in json.loads(result.stdout)}
    assert crashed[f"{CRASHED}/TP0"]["text"] == CRASH
    assert "3 batch lines" in result.stderr


@pytest.mark.parametrize(
    ("line", "stream"),
    [
        ("prefill-1  | [2026-04-30 16:02:25] Prefill batch", "prefill-1"),
        ("[pod/sglang-decode-0/sglang] [2026-04-30 16:02:25] Decode batch", "sglang-decode-0"),
        ("[2026-04-30 16:02:25] Prefill batch, a | b", ""),
        ("E0430 16:02:26.014493   391 tcp_transport.cpp:542] x | y", ""),
    ],
)  # fmt: skip
def test_only_a_wrapper_at_the_start_names_a_server(line: str, stream: str):
    assert split_stream(line)[0] == stream


def test_a_line_that_looks_like_a_wrapper_before_other_text_is_left_as_it_is(tmp_path: Path):
    """`word | text` with no SGLang line after it names no server (a compose wrapper counts before SGLang's
    prefix, or for a server already seen): the file stays one server's."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-04-30 16:02:25] Prefill batch, #new-seq: 1, #new-token: 276, #cached-token: 0, token usage: 0.25, "
        "#running-req: 0, #queue-req: 8, #prealloc-req: 24, #inflight-req: 8, cuda graph: False\n"
        "note  | the Session line below failed.\n"
    )

    ranks = json.loads(kvtop_here("ranks", "--sglang-log", str(log), "--json").stdout)

    assert [rank["label"] for rank in ranks] == ["prefill-0/TP0"]


def test_a_file_that_names_servers_without_end_holds_a_bounded_number_of_them(tmp_path: Path):
    """A hostile or broken file naming a new server on every line: the first `STREAMS_MAX` are servers, the lines
    of the rest and of a name too long for a label are counted as garbled, never made ranks."""
    batch = "[2026-04-30 16:02:25] Decode batch, #running-req: 1, #token: 2, token usage: 0.1, #queue-req: 0\n"
    log = tmp_path / "all.log"
    names = [f"decode-{index}" for index in range(STREAMS_MAX + 10)] + ["d" * (STREAM_NAME_MAX + 1)]
    log.write_text("".join(f"{name}  | {batch}" for name in names))

    result = kvtop_here("ranks", "--sglang-log", str(log), "--json")

    assert len(json.loads(result.stdout)) == STREAMS_MAX
    assert ", 11 garbled (skipped)," in result.stderr


def test_a_server_s_glog_lines_before_its_first_sglang_line_are_its_own(tmp_path: Path):
    """sglang #15665's prefill lines under `docker compose logs`: its transfer engine's errors come before its first
    SGLang line, and were put under the file's own name (`likely cause prefill-0`, a server that is not there)."""
    log = tmp_path / "all.log"
    log.write_text(
        "sglang-prefill-1  | E1219 10:38:57.898806 14747 tcp_transport.cpp:480] TcpTransport::startTransfer "
        "encountered an ASIO exception. Exception: connect: Cannot assign requested address\n"
        "sglang-prefill-1  | [2025-12-19 10:38:57 TP0] Prefill transfer failed for request rank=0 req.rid='80bd' "
        "req.bootstrap_room=8528272782182837149 with exception KVTransferError(bootstrap_room=8528272782182837149): "
        "Failed to send kv chunk of 8528272782182837149 to 10.0.0.7:15004\n"
    )

    [group] = json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"]

    assert {context["source"] for context in group["context"]} == {"sglang-prefill-1"}
