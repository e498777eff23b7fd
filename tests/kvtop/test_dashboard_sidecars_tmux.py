"""The installed `kvtop top` in a real terminal (tmux) on log sidecars: ranks from logs, a failure folded."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from sidecar_support import KVTOP, registry, sidecars, view_json
from test_dashboard_tmux import Pane, pane  # noqa: F401 (the fixture)

from tests.conftest import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]
_EXIT_MARK = "KVTOP-EXITED"


def _lines(room: int) -> tuple[str, str]:
    """A prefill rank's send failure and the decode ranks' echoes of it, as SGLang writes them, stamped now."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    runtime = stamp.replace(" ", "T")  # a container runtime's own stamp
    prefill = (
        f"[{stamp} TP1] Prefill transfer failed for request rank=1 req.rid='p{room}' req.bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): Failed to send kv chunk of {room} to 10.0.0.7:15004\n"
    )
    decode = "".join(
        f"{runtime}.{tp}00000000+00:00 stderr F [{stamp} DP0 TP{tp} EP{tp}] Decode transfer failed for request "
        f"rank={tp} decode_req.req.rid='d{room}' decode_req.req.bootstrap_room={room} with exception "
        f"KVTransferError(bootstrap_room={room}): Failed to get kvcache from prefill instance, it might be dead\n"
        for tp in (0, 1)
    )
    return prefill, decode


def test_dashboard_on_sidecars_shows_ranks_from_logs_and_a_failure_folded_under_its_origin(pane: Pane, tmp_path):  # noqa: F811
    """Two sidecars (one a container runtime's log) feed `kvtop top`: four ranks alive; the prefill's send
    failure is one incident (the decode rank it sent to its suspect) of one origin whose two echoes, the decode
    ranks' lines, show when it is expanded."""
    prefill_log, decode_log = tmp_path / "sglang-p.log", tmp_path / "sglang-d.log"
    prefill_log.write_text("")
    decode_log.write_text("")
    with registry() as bootstrap, sidecars(bootstrap, tmp_path) as started:
        started.start(prefill_log, "--role", "prefill", "--tp", "2")
        started.start(decode_log, "--role", "decode", "--tp", "2")
        wait_for(lambda: len(view_json("ranks", "--bootstrap", bootstrap) or []) == 4, 20, "four sidecar ranks")
        pane.start(f"{KVTOP} top --bootstrap {bootstrap}; echo {_EXIT_MARK}=$?; sleep 60")
        wait_for(lambda: pane.shows(r"4/4 ranks alive"), 30, "every sidecar rank alive on the health line")
        for label in ("prefill-0/TP0", "prefill-0/TP1", "decode-0/TP0", "decode-0/TP1"):  # the grid paints apart
            row = rf"{re.escape(label)} +(prefill|decode) +(log +)?alive"  # SOURCE `log`, where it fits
            wait_for(lambda row=row: pane.shows(row), 10, f"{label} in the grid")

        prefill, decode = _lines(4242)
        Path(prefill_log).write_text(prefill)
        Path(decode_log).write_text(decode)

        pane.keys("f")
        incident = r"▶ ONGOING  decode at 10\.0\.0\.7:15004 stopped answering \(send_failed\)  1 room"
        wait_for(lambda: pane.shows(incident), 30, "the incident of the decode rank the prefill could not send to")
        pane.keys("Home", "Enter")
        wait_for(lambda: pane.shows(r"▶ room 4242 +prefill-0/TP1 +send_failed +2 echoes"), 10, "the folded origin")
        pane.keys("Down", "Enter")
        wait_for(lambda: pane.shows(r"▼ room 4242"), 10, "the origin expanded")
        echoes = wait_for(lambda: re.findall(r"└ echo (\S+)", pane.screen()), 10, "its echoes listed under it")
        assert sorted(echoes) == ["decode-0/TP0", "decode-0/TP1"]

        pane.keys("q")
        wait_for(lambda: pane.shows(f"{_EXIT_MARK}=0"), 30, "kvtop exiting with status 0")
