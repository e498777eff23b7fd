"""The rank side of kvtop: real KV transfers between prefill and decode ranks over ZeroMQ.

This package never imports `kvtop`, `textual` or `typer`; a serving engine can
embed it without the dashboard.
"""

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
