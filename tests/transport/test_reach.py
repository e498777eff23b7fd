"""`why_silent` under a name lookup that hangs: its caller's deadline holds, and retries share one lookup."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from transport import reach


def test_a_lookup_that_hangs_is_said_so_and_retries_wait_on_it_not_on_a_thread_each(monkeypatch: pytest.MonkeyPatch):
    """A bootstrap client asking every second of a host whose resolver hangs left a thread per try blocked in
    `getaddrinfo` (daemon threads: nothing ended them); now every try waits on the one look still running."""
    released = threading.Event()
    lookups: list[str] = []

    def hangs(host: str, *args: Any, **kwargs: Any) -> Any:
        lookups.append(host)
        released.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(reach.socket, "getaddrinfo", hangs)
    try:
        answers = [reach.why_silent("tcp://slow.invalid:5555", timeout_s=0.05) for _ in range(5)]
        looking = [thread for thread in threading.enumerate() if thread.name == "kvtop-reach"]
    finally:
        released.set()

    assert answers == ["slow.invalid did not resolve or take a connection within 0.05s"] * 5
    assert lookups == ["slow.invalid"]
    assert len(looking) == 1
