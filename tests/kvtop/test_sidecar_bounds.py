"""A sidecar's heavy log reaches a late one-shot view whole: its snapshot fits a frame, and says what it cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from sidecar_support import registry, sidecars, view_json
from test_sidecar import failure_line

from tests.conftest import wait_for

ROOMS = 500
"""Failures a snapshot keeps all of (its bound is 512), each followed by a ~15 KB traceback: 7.5 MB in all."""
FRAME = '  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/decode.py", line 312, in pop_transferred'
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + f"{FRAME} ({'x' * 130})\n" * 60  # a traceback is read up to 64 lines
    + "RuntimeError: the server's last words\n"
)

pytestmark = pytest.mark.processes


def test_a_late_view_of_a_sidecar_with_500_big_tracebacks_sees_every_failure(tmp_path: Path):
    """The snapshot was 8.5 MB against the 4 MiB frame bound: `failures` showed none, `check` said OK."""
    log = tmp_path / "server.log"
    log.write_text("".join(failure_line(room) + TRACEBACK for room in range(1, ROOMS + 1)))
    with registry() as address, sidecars(address, tmp_path) as started:
        started.start(log, "--role", "decode", "--instance", "decode-7")

        def every_failure() -> list[dict[str, object]] | None:
            listed = view_json("failures", "--bootstrap", address)
            return listed["groups"] if listed and len(listed["groups"]) == ROOMS else None

        groups = wait_for(every_failure, 60, f"{ROOMS} failures in a late one-shot view")
        assert {group["room"] for group in groups} == set(range(1, ROOMS + 1))
        status = view_json("status", "--bootstrap", address)
        assert status["snapshot_entries_cut"] > 0
        assert status["ranks"]["alive"] + status["ranks"]["idle"] == 1
