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
