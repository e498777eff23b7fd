"""`kvtop check` names a registration the bootstrap service refused only where it can explain the shortfall it
follows: a prefill rank's refusal is no reason for `no decode rank alive`. A real service, a real rank, a real
refused registration from another client's address, and the check run as an operator runs it."""

from __future__ import annotations

import re

import msgspec
import pytest
import zmq
from bootstrap_ask import ask
from kvtop_cli import kvtop

from transport import BootstrapServer
from transport.config import Role
from transport.wire import Refusal, Register

pytestmark = pytest.mark.processes


def refused(context: zmq.Context[zmq.Socket[bytes]], server: BootstrapServer, request: Register) -> None:
    """Send `request` from 127.0.0.2 (another client than the ranks' 127.0.0.1) and see it refused."""
    assert isinstance(ask(context, server.endpoint, "127.0.0.2", request), Refusal)


def test_no_decode_rank_alive_names_a_decode_ranks_refusal_not_a_prefill_ranks(
    bootstrap, make_manager, zmq_context
) -> None:
    prefill = make_manager(Role.PREFILL, "prefill-0")
    taken = msgspec.structs.replace(prefill.info, data_endpoint="tcp://127.0.0.2:6666", incarnation=1)
    refused(zmq_context, bootstrap, Register(1, taken))  # the live entry is 127.0.0.1's

    check = kvtop("check", "--bootstrap", bootstrap.endpoint, "--wait", "2")

    assert check.returncode == 2
    assert check.stdout.startswith("KVTOP CRITICAL - no decode rank alive; 1/1 ranks alive"), check.stdout
    status = kvtop("status", "--bootstrap", bootstrap.endpoint, "--wait", "2")
    assert "refused prefill-0/TP0: registered from 127.0.0.2" in status.stdout  # still said where it is listed
    assert re.search(r"^  refused prefill-0/TP0: registered from 127\.0\.0\.2.*, \d+s ago$", status.stdout, re.M)

    decode = msgspec.structs.replace(
        prefill.info, role="decode", instance="decode-0", data_endpoint="tcp://169.254.0.1:1"
    )
    refused(zmq_context, bootstrap, Register(2, decode))
    check = kvtop("check", "--bootstrap", bootstrap.endpoint, "--wait", "2")

    assert check.stdout.startswith(
        "KVTOP CRITICAL - no decode rank alive; the bootstrap service refused decode-0/TP0: data_endpoint: "
        "'tcp://169.254.0.1:1' is link-local"
    ), check.stdout
