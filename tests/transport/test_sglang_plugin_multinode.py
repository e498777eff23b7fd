"""An SGLang plugin rank on another host than its bootstrap: its event sockets bind `KVTOP_HOST` (default
loopback, which the bootstrap refuses from a remote client), and a refused registration is logged with its fix
in SGLang's own log, never kept silent while the server looks fine (the rank was unlisted and said nothing).
Runs without SGLang; the bootstrap on this machine's own non-loopback address (skipped without one)."""

from __future__ import annotations

import logging

import pytest

from transport import BootstrapServer
from transport.plane import registrar
from transport.plane.events import PluginHooks
from transport.sglang.rank import PluginRank

HOOKS = PluginHooks("0.5.5", [])


@pytest.fixture
def remote_bootstrap(own_address: str):
    """A bootstrap service that a rank of this machine reaches as a remote client (from its own address)."""
    server = BootstrapServer(host=own_address).start()
    yield server
    server.close()


def test_a_plugin_rank_on_loopback_refused_by_a_remote_bootstrap_says_so_with_the_fix(
    remote_bootstrap, caplog, wait_for
):
    """The default host (127.0.0.1) registered over the network: refused, and the rank's log says why and what to
    give it (the address its peers reach it at), once."""
    with caplog.at_level(logging.WARNING, logger=registrar.__name__):
        rank = PluginRank("prefill", "prefill-0", 0, 1, remote_bootstrap.endpoint, HOOKS).start()
        try:
            said = wait_for(
                lambda: [r.getMessage() for r in caplog.records if "cannot register" in r.getMessage()],
                timeout=30,
                what="the refusal logged",
            )
        finally:
            rank.close()

    assert len(said) == 1
    assert "no kvtop view lists this rank" in said[0] and "is a loopback address registered from" in said[0]
    assert "the address its peers reach it at" in said[0]
    assert remote_bootstrap.agents() == []


def test_a_plugin_rank_bound_on_its_hosts_address_is_listed_by_a_remote_bootstrap(remote_bootstrap, wait_for):
    """KVTOP_HOST's address (here the one the bootstrap sees): registered, its event endpoint on that address."""
    own = remote_bootstrap.endpoint.rpartition(":")[0].removeprefix("tcp://")
    rank = PluginRank("decode", "decode-0", 0, 1, remote_bootstrap.endpoint, HOOKS, host=own).start()
    try:
        (entry,) = wait_for(remote_bootstrap.agents, timeout=30, what="the rank listed")
    finally:
        rank.close()

    assert entry.event_endpoint.startswith(f"tcp://{own}:")
