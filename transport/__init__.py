"""The rank side of kvtop: real KV transfers between prefill and decode ranks over ZeroMQ.

This package never imports `kvtop`, `textual` or `typer`; a serving engine can
embed it without the dashboard.

Its names load on first use (PEP 562): `import transport.config` (kvtop's CLI, a `kvtop check`) does not pay
for the transfer engine, numpy and the bootstrap service (about 0.35 s of a command's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transport.bootstrap import BootstrapClient, BootstrapServer
    from transport.config import Role, Timeouts, TransferConfig
    from transport.errors import (
        BootstrapError,
        ConfigError,
        FrameRejected,
        KVTransferError,
        ReasonClass,
        TransportError,
    )
    from transport.kv.engine import KVManager, KVReceiver, KVSender
    from transport.kv.faults import FaultInjector, FaultKind, FaultSpec
    from transport.kv.pool import KVPool
    from transport.kvpoll import KVPoll

_HOMES = {
    "transport.bootstrap": ("BootstrapClient", "BootstrapServer"),
    "transport.config": ("Role", "Timeouts", "TransferConfig"),
    "transport.errors": (
        "BootstrapError",
        "ConfigError",
        "FrameRejected",
        "KVTransferError",
        "ReasonClass",
        "TransportError",
    ),
    "transport.kv.engine": ("KVManager", "KVReceiver", "KVSender"),
    "transport.kv.faults": ("FaultInjector", "FaultKind", "FaultSpec"),
    "transport.kv.pool": ("KVPool",),
    "transport.kvpoll": ("KVPoll",),
}
"""Each module and the public names it defines (the imports above, for type checkers)."""
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "BootstrapClient",
    "BootstrapError",
    "BootstrapServer",
    "ConfigError",
    "FaultInjector",
    "FaultKind",
    "FaultSpec",
    "FrameRejected",
    "KVManager",
    "KVPoll",
    "KVPool",
    "KVReceiver",
    "KVSender",
    "KVTransferError",
    "ReasonClass",
    "Role",
    "Timeouts",
    "TransferConfig",
    "TransportError",
]


def __getattr__(name: str) -> object:
    """`transport.KVManager` and `from transport import KVManager`: the name's module, imported now."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'transport' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next look-up is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
