"""A sidecar started next to a server whose log holds old failures: it says what it read, a live view names them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kvtop_cli import kvtop
from sidecar_support import registry, sidecars

from tests.conftest import wait_for

DAY_S = 86400
STARTED_S = 60.0
"""How long a sidecar may take to start and read its log on a loaded two-core machine (as `test_sidecar`'s)."""


def failure_line(stamp: str, room: int) -> str:
    return (
        f"[{stamp} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r{room}' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
        f"Request {room} timed out after 300.0s in KVPoll.WaitingForInput\n"
    )


@pytest.mark.processes
def test_a_sidecar_on_a_months_old_log_says_what_it_read_and_a_live_view_names_its_failures_older(tmp_path: Path):
    """A log whose failures are 100 days old: the sidecar published them with their own times, and `status` on the
    cluster said `incidents none in 60s` (silence read as health). The sidecar now says once how much and how many
    failures the file held at start and how old the latest is; `status` names the incident older than its window
    and never as ongoing."""
    old = time.time() - 100 * DAY_S - DAY_S / 4  # 100 days whatever the seconds the test takes
    first, last = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(old + s)) for s in (0, 1))
    log = tmp_path / "decode.log"
    log.write_text(failure_line(first, 7) + failure_line(last, 8))
    with registry() as address, sidecars(address, tmp_path) as started:
        started.start(log, "--role", "decode", "--instance", "decode-3")
        said = tmp_path / "sidecar-0.stderr"
        wait_for(lambda: "held at start" in said.read_text(), STARTED_S, "the sidecar saying what it read at start")
        status: list[str] = []

        def named_older() -> bool:
            status[:] = kvtop("status", "--bootstrap", address, "--wait", "3").stdout.splitlines()
            return bool(status) and "older" in status[0]

        try:
            wait_for(named_older, STARTED_S, "status naming the old incident")
        except AssertionError:
            assert status[:1] == ["incidents none in 60s; 1 older"]

    assert (
        f"read the {log.stat().st_size} B {log} held at start (2 failures), the latest dated {last}, 100 days ago"
        in said.read_text()
    )
    assert (
        status[0]
        == f"incidents none in 60s; 1 older, the latest ended {last} (100 days ago): kvtop incidents lists them"
    )
