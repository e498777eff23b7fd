"""The SGLang plugin checks its environment where it enters: a bad bootstrap or instance name is one error line and
no hook, before any scheduler builds a rank on it (runs without SGLang: nothing is imported past the check)."""

from __future__ import annotations

import logging

import pytest

from transport.plane.events import PluginHooks
from transport.sglang import hooks, plugin

HOOKS = PluginHooks("0.5.5", [])


@pytest.mark.parametrize(
    ("environ", "complaint"),
    [
        ({"KVTOP_BOOTSTRAP": "127.0.0.1:5555"}, "KVTOP_BOOTSTRAP: '127.0.0.1:5555' is not an endpoint"),
        ({"KVTOP_BOOTSTRAP": "tcp://127.0.0.1:99999"}, "has no valid port"),
        ({"KVTOP_BOOTSTRAP": "tcp://127.0.0.1:5555", "KVTOP_INSTANCE": "prefill 0/x"}, "KVTOP_INSTANCE: instance name"),
        ({"KVTOP_BOOTSTRAP": "tcp://127.0.0.1:5555", "KVTOP_INSTANCE": "p" * 200}, "KVTOP_INSTANCE: instance name"),
        ({"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_HOST": "node-1"}, "KVTOP_HOST: 'node-1' is not an IPv4"),
        ({"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_HOST": "0.0.0.0"}, "KVTOP_HOST: 0.0.0.0 is the wildcard"),
        ({"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_HOST": "10.0.0.6"}, "set KVTOP_CURVE_KEYS=DIR"),
    ],
)
def test_a_bad_environment_is_one_error_line_and_no_plugin(monkeypatch, caplog, environ, complaint):
    monkeypatch.setattr(hooks, "PLUGIN", None)
    for name in ("KVTOP_BOOTSTRAP", "KVTOP_INSTANCE", "KVTOP_CURVE_KEYS", "KVTOP_HOST", "KVTOP_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)

    with caplog.at_level(logging.INFO, logger=plugin.__name__):
        plugin.load()

    assert hooks.PLUGIN is None
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1 and complaint in errors[0], errors


def test_a_sane_environment_has_no_problem():
    assert plugin.config_problem({"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_INSTANCE": "prefill-0"}) == ""
    assert plugin.config_problem({"KVTOP_BOOTSTRAP": "ipc:///run/kvtop/bootstrap.sock"}) == ""
    multinode = {"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_HOST": "10.0.0.6"}
    assert plugin.config_problem({**multinode, "KVTOP_INSECURE": "1"}) == ""
    assert plugin.config_problem({**multinode, "KVTOP_CURVE_KEYS": "/etc/kvtop/keys"}) == ""


def test_kvtop_host_is_where_the_plugins_ranks_bind(monkeypatch):
    """KVTOP_HOST reaches the ranks the plugin makes; unset, they bind loopback (one host only)."""
    monkeypatch.setattr(hooks, "PLUGIN", None)
    made = hooks.configure({"KVTOP_BOOTSTRAP": "tcp://10.0.0.5:7000", "KVTOP_HOST": "10.0.0.6"}, HOOKS)
    default = hooks.configure({"KVTOP_BOOTSTRAP": "tcp://127.0.0.1:7000"}, HOOKS)

    assert (made.host, default.host) == ("10.0.0.6", "127.0.0.1")
