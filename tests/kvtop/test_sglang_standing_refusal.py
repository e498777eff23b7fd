"""A prefill refusing decode sessions that answer: SGLang gives up on a session at a failed send and refuses it in
every later room (`Decode instance could be dead, remote mooncake session S is not alive`), for as long as the prefill
runs. An operator's notes of a multi-node R1 (Mooncake) pasted prefill ranks refusing sessions on both decode nodes
while the decode's own ranks, TP1 among them, logged the prefill's `Failed to get kvcache from prefill instance` in
that same second: they answered. kvtop said `decode-0 stopped answering`. What made the prefill give up was before
the excerpt; a public report of the same shape (the decode nodes had registered the wrong IPs) had sessions the
prefill could not reach. Either way the decode's process answers and the path to its sessions fails: the link
between the two, its evidence saying which ranks answered.

Each prefill rank's peer is the decode rank of its number (one TP on both sides): a refusing rank whose peer answered
is a refusal of a live decode rank. Where only other decode ranks answered (one node of the decode died, its ranks
silent), the refused sessions may well be dead: the suspect stays the decode.

The lines below are in SGLang's shapes, with times, rooms and addresses of my own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure

pytestmark = pytest.mark.usefixtures("utc")

ROOM = 7310001
TOLD = "Failed to get kvcache from prefill instance, it might be dead"
SESSIONS = {1: "10.7.1.49:15010", 2: "10.7.1.49:16959", 9: "10.7.1.35:16272", 11: "10.7.1.35:16371"}


def incidents(
    tmp_path: Path, answering: list[int], refusing: tuple[int, ...] = (1, 2, 9, 11)
) -> list[dict[str, object]]:
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    prefill.write_text(
        "".join(
            prefill_failure(
                "2026-02-27 15:01:51",
                ROOM,
                f"Decode instance could be dead, remote mooncake session {s} is not alive",
                tp,
            )
            for tp, s in SESSIONS.items()
            if tp in refusing
        )
    )
    decode.write_text("".join(decode_failure("2026-02-27 15:01:51", ROOM, TOLD, tp) for tp in answering))
    logs = ["--sglang-log", f"prefill={prefill}", "--sglang-log", f"decode={decode}"]
    return json.loads(kvtop_here("incidents", "--json", *logs).stdout)["incidents"]


def test_refused_sessions_whose_own_decode_ranks_answered_are_the_link_s_failure(tmp_path: Path):
    [incident] = incidents(tmp_path, answering=[3, 5, 2, 1, 9, 10, 8])

    assert (incident["suspect_text"], incident["kind"], incident["class"]) == (
        "the link between prefill-0 and decode-0",
        "failing",
        "peer_lost",
    )
    assert incident["evidence"][0].startswith(
        "prefill-0 refuses sessions it gave up on before while their decode ranks answered in that second "
        "(decode-0/TP1, decode-0/TP2, decode-0/TP9): the path to them, not the decode's process"
    )


def test_refused_sessions_whose_own_ranks_were_silent_are_still_the_decode_s(tmp_path: Path):
    """The node of decode ranks 8-15 died: prefill ranks 9 and 11 refuse its sessions, decode ranks 1-3 on the other
    node answered."""
    [incident] = incidents(tmp_path, answering=[1, 2, 3], refusing=(9, 11))

    assert (incident["suspect_text"], incident["kind"]) == ("decode-0", "unresponsive")


BATCH = (
    "[2026-02-27 15:01:40 TP{tp}] Decode batch, #running-req: 1, #token: 512, token usage: 0.01, pre-allocated usage: "
    "0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 10.00, "
    "#queue-req: 0, \n"
)
OTHER_RANK = "Failed due to an unknown reason from another rank"


def _unequal_tp(tmp_path: Path, decode_tp: int, refusing: dict[int, str]) -> list[dict[str, object]]:
    """A prefill of TP 4 (all four ranks log the room: those in `refusing` refuse the session given, the others
    echo) and a decode of `decode_tp` ranks (each logged a batch before); its ranks 0-3 log the prefill's Failed status
    in that second, the others nothing (their node died)."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    at = "2026-02-27 15:01:51"
    prefill.write_text(
        "".join(
            prefill_failure(at, ROOM, f"Decode instance could be dead, remote mooncake session {refusing[tp]} is not "
                            "alive" if tp in refusing else OTHER_RANK, tp)
            for tp in range(4)
        )
    )  # fmt: skip
    decode.write_text(
        "".join(BATCH.format(tp=tp) for tp in range(decode_tp))
        + "".join(decode_failure(at, ROOM, TOLD, tp) for tp in range(min(4, decode_tp)))
    )
    logs = ["--sglang-log", f"prefill={prefill}", "--sglang-log", f"decode={decode}"]
    return json.loads(kvtop_here("incidents", "--json", *logs).stdout)["incidents"]


def test_a_decode_twice_as_wide_pairs_each_prefill_rank_with_the_two_decode_ranks_it_sends_to(tmp_path: Path):
    """Prefill TP 4, decode TP 8: prefill ranks 2 and 3 send to decode ranks 4-7, on the node that died; the decode
    ranks that answered, 0-3, are prefill ranks 0 and 1's. Paired by number, decode ranks 2 and 3 answering read as
    the refused sessions' own ranks: `the link between prefill-0 and decode-0`."""
    refusing = {2: "10.7.1.35:16272", 3: "10.7.1.35:16371"}
    [incident] = _unequal_tp(tmp_path, decode_tp=8, refusing=refusing)

    assert (incident["suspect_text"], incident["kind"]) == ("decode-0", "unresponsive")


def test_a_prefill_wider_than_its_decode_pairs_two_prefill_ranks_with_one_decode_rank(tmp_path: Path):
    """Prefill TP 4, decode TP 2: prefill ranks 2 and 3 both send to decode rank 1, and refuse its session while
    decode rank 1 answered: the link's (by number, decode ranks 2 and 3 were theirs, and those never logged)."""
    refusing = {2: "10.7.1.35:16272", 3: "10.7.1.35:16272"}
    prefill_only = _unequal_tp(tmp_path, decode_tp=2, refusing=refusing)

    assert [incident["suspect_text"] for incident in prefill_only] == ["the link between prefill-0 and decode-0"]


def test_ranks_of_sizes_not_known_pair_by_number_only_while_each_refuses_a_session_of_its_own(tmp_path: Path):
    """An excerpt (ranks missing: the TP sizes are not known): prefill ranks 9 and 11 refuse one session, so they send
    to one decode rank and the prefill is the wider; decode ranks 9 and 11 that answered need not be theirs. No link
    is named where the ranks cannot be paired: the session's decode, as a refusal no rank answered reads."""
    shared = "10.7.1.35:16272"
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    at, refusal = "2026-02-27 15:01:51", f"Decode instance could be dead, remote mooncake session {shared} is not alive"
    prefill.write_text("".join(prefill_failure(at, ROOM, refusal, tp) for tp in (9, 11)))
    decode.write_text("".join(decode_failure(at, ROOM, TOLD, tp) for tp in (9, 11)))
    logs = ["--sglang-log", f"prefill={prefill}", "--sglang-log", f"decode={decode}"]
    [incident] = json.loads(kvtop_here("incidents", "--json", *logs).stdout)["incidents"]

    assert (incident["suspect"]["kind"], incident["kind"]) != ("link", "failing")
    assert incident["kind"] == "unresponsive"


def _server_args(role: str, tp_size: int) -> str:
    return (
        f"[2026-02-27 15:01:30] server_args=ServerArgs(model_path='/models/r1', tp_size={tp_size}, pp_size=1, "
        f"dp_size=1, enable_dp_attention=False, disaggregation_mode='{role}', disaggregation_bootstrap_port=8998)\n"
    )


@pytest.mark.parametrize("stated", [True, False], ids=["sizes-stated", "sizes-unknown"])
def test_partial_logs_pair_ranks_by_the_tp_sizes_their_server_args_state(tmp_path: Path, stated: bool):
    """Prefill TP 4, decode TP 8, and excerpts: only prefill ranks 2 and 3 (refusing two sessions) and decode ranks 2
    and 3 (the prefill's Failed status) logged. Their `server_args` lines say the sizes: prefill ranks 2 and 3 send to
    decode ranks 4-7, none of which answered: the decode's. Without those lines ranks pair by number, and decode
    ranks 2 and 3 answering read as the refused sessions' own (before, with the lines too)."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    at = "2026-02-27 15:01:51"
    refusing = {2: "10.7.1.35:16272", 3: "10.7.1.35:16371"}
    prefill.write_text(
        _server_args("prefill", 4) * stated
        + "".join(
            prefill_failure(at, ROOM, f"Decode instance could be dead, remote mooncake session {s} is not alive", tp)
            for tp, s in refusing.items()
        )
    )
    decode.write_text(_server_args("decode", 8) * stated + "".join(decode_failure(at, ROOM, TOLD, tp) for tp in (2, 3)))
    logs = ["--sglang-log", f"prefill={prefill}", "--sglang-log", f"decode={decode}"]
    [incident] = json.loads(kvtop_here("incidents", "--json", *logs).stdout)["incidents"]

    expected = ("decode-0", "unresponsive") if stated else ("the link between prefill-0 and decode-0", "failing")
    assert (incident["suspect_text"], incident["kind"]) == expected
