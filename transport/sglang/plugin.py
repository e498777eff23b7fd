"""The kvtop plugin's entry point (`sglang.srt.plugins`, name `kvtop`): SGLang's `load_plugins()` calls `load`.

Configured by environment: `KVTOP_BOOTSTRAP` (kvtop's bootstrap service, `tcp://HOST:PORT`; without it the
plugin logs one line and does nothing), `KVTOP_CURVE_KEYS` (a key folder: the rank serves its events with
CURVE), `KVTOP_INSTANCE` (the instance name; else `ROLE-HOST-PORT`), `KVTOP_HOST` (the address the ranks' event
sockets bind and register, reachable from the bootstrap's readers; default 127.0.0.1, one host only; beyond
loopback with `KVTOP_CURVE_KEYS` or `KVTOP_INSECURE=1`). `load` only registers hooks; a process
becomes a rank when it creates a KV manager (see hooks.py).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from transport.plane.events import PluginHooks
from transport.registration import endpoint_problem, instance_problem
from transport.sglang import hooks

_log = logging.getLogger(__name__)
_COMMON = "sglang.srt.disaggregation.common.conn"
BACKENDS = {
    "mooncake": ("MooncakeKVSender", "MooncakeKVReceiver"),
    "nixl": ("NixlKVSender", "NixlKVReceiver"),
    "mori": ("MoriKVSender", "MoriKVReceiver"),
}
"""The backends whose senders and receivers may override `poll`, `failure_exception` or (a receiver)
`send_metadata` (SGLang 0.5.x)."""


def targets() -> list[tuple[str, Callable[..., Any], str]]:
    """(dotted target, hook, hook type name) for the common base classes."""
    return [
        (f"{_COMMON}.CommonKVManager.__init__", hooks.after_manager_init, "AFTER"),
        *((f"{_COMMON}.{cls}.poll", hooks.after_poll, "AFTER") for cls in ("CommonKVSender", "CommonKVReceiver")),
        *(
            (f"{_COMMON}.{cls}.failure_exception", hooks.around_failure_exception, "AROUND")
            for cls in ("CommonKVSender", "CommonKVReceiver")
        ),
        (f"{_COMMON}.CommonKVReceiver.send_metadata", hooks.before_send_metadata, "BEFORE"),
    ]


def _overrides() -> tuple[list[tuple[str, Callable[..., Any], str]], list[str]]:
    """The backends' own `poll` and `failure_exception` where a class defines them (hooking an inherited one
    would run the hook twice), and the backends that did not import (named, with why)."""
    found, skipped = [], []
    for backend, classes in BACKENDS.items():
        module = f"sglang.srt.disaggregation.{backend}.conn"
        for cls in classes:
            try:
                resolved = pkgutil.resolve_name(f"{module}.{cls}")
            except Exception as error:  # a backend's own library missing (nixl, mori), or a renamed class
                skipped.append(f"{module}.{cls}: {type(error).__name__}: {str(error)[:120]}")
                continue
            for method, hook, kind in (("poll", hooks.after_poll, "AFTER"),
                                       ("failure_exception", hooks.around_failure_exception, "AROUND"),
                                       ("send_metadata", hooks.before_send_metadata, "BEFORE")):  # fmt: skip
                if method in vars(resolved):
                    found.append((f"{module}.{cls}.{method}", hook, kind))
    return found, skipped


def config_problem(environ: Mapping[str, str]) -> str:
    """Why the environment cannot configure the plugin ("" when `KVTOP_BOOTSTRAP` is an endpoint and
    `KVTOP_INSTANCE`, when given, an instance name): checked here, before a scheduler builds a rank on it."""
    if problem := endpoint_problem(environ["KVTOP_BOOTSTRAP"]):
        return f"KVTOP_BOOTSTRAP: {problem}"
    if (instance := environ.get("KVTOP_INSTANCE", "")) and (problem := instance_problem(instance)):
        return f"KVTOP_INSTANCE: {problem}"
    return host_problem(environ)


def host_problem(environ: Mapping[str, str]) -> str:
    """Why `KVTOP_HOST` cannot be where the ranks' event sockets bind ("" when unset, or an IPv4 address: not the
    wildcard, which no reader dials; beyond loopback with `KVTOP_CURVE_KEYS`, or `KVTOP_INSECURE=1`)."""
    if not (host := environ.get("KVTOP_HOST", "")):
        return ""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        return f"KVTOP_HOST: {host[:80]!r} is not an IPv4 address (give the address this host's peers reach it at)"
    if address.is_unspecified:
        return f"KVTOP_HOST: {host} is the wildcard address, which no reader can dial (give this host's own address)"
    if not address.is_loopback and not environ.get("KVTOP_CURVE_KEYS") and environ.get("KVTOP_INSECURE") != "1":
        return (
            f"KVTOP_HOST: binding {host} (not loopback) without CURVE lets anyone on the network read the ranks' "
            "events: set KVTOP_CURVE_KEYS=DIR (`kvtop keys generate DIR`), or KVTOP_INSECURE=1 to do it anyway"
        )
    return ""


def load() -> None:
    """Register the hooks (SGLang applies them after every plugin ran); nothing more without a bootstrap."""
    if not os.environ.get("KVTOP_BOOTSTRAP"):
        _log.info("kvtop plugin: KVTOP_BOOTSTRAP is not set, so this SGLang process publishes nothing")
        return
    if problem := config_problem(os.environ):
        _log.error("kvtop plugin: %s, so this SGLang process publishes nothing", problem)
        return
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooked, skipped = [], []
    overrides, failed = _overrides()
    skipped += failed
    for target, hook, kind in [*targets(), *overrides]:
        try:
            pkgutil.resolve_name(target)
        except Exception as error:  # not in this SGLang version
            skipped.append(f"{target}: {type(error).__name__}")
            continue
        HookRegistry.register(target, hook, HookType[kind])
        hooked.append(target)
    hooks.configure(os.environ, PluginHooks(str(sglang.__version__), hooked, skipped))
    _log.info("kvtop plugin: %d hooks, %d skipped, publishing to %s", len(hooked), len(skipped),
              os.environ["KVTOP_BOOTSTRAP"])  # fmt: skip
