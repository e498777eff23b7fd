"""What a registration must be before anyone connects to it: endpoint syntax and sane identity values.

The bootstrap service refuses an `AgentInfo` that fails `registration_problem`,
and every reader of a listing (kvtop's collector, a subscriber) checks each
entry with `agent_problem` before connecting, so one bad entry is counted and named instead of
raising a `ZMQError` in whoever reads it.
"""

from __future__ import annotations

import re

from transport.config import Role
from transport.wire import AGENT_KINDS, AgentInfo, rank_label

MAX_TP = 1024
MAX_PAGE_BYTES = 1 << 30
MAX_NAME = 64
MAX_HOST = 255
MAX_IPC_PATH = 107
"""Linux's `sun_path` holds 108 bytes with the terminating NUL."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
RELAY_ROLE = "relay"
"""The role of a relay's entry (see relay.py): listed apart by the bootstrap, never resolved."""
_ENDPOINTS = ("data_endpoint", "control_endpoint", "consensus_endpoint", "event_endpoint", "snapshot_endpoint")


def endpoint_problem(endpoint: str) -> str:
    """Why `endpoint` cannot be connected to ("" when it is `tcp://HOST:PORT` or `ipc://PATH`)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return f"{endpoint[:80]!r} is not an endpoint (expected tcp://HOST:PORT or ipc://PATH)"
    if scheme == "ipc":
        if not 0 < len(rest.encode()) <= MAX_IPC_PATH or "\0" in rest:
            return f"ipc path of {len(rest.encode())} bytes (1 to {MAX_IPC_PATH})"
        if not rest.isprintable():
            return f"ipc path {rest[:80]!r} holds control characters"
        return ""
    if scheme != "tcp":
        return f"transport {scheme[:16]!r} (expected tcp or ipc)"
    host, colon, port = rest.rpartition(":")
    if not colon or len(host) > MAX_HOST or not _HOST.fullmatch(host):
        return f"{endpoint[:80]!r} has no valid host (expected tcp://HOST:PORT)"
    if not (port.isdecimal() and port.isascii() and 0 < int(port) < 65536):
        return f"{endpoint[:80]!r} has no valid port (1 to 65535)"
    return ""


def instance_problem(instance: str) -> str:
    """Why `instance` cannot name an instance ("" when it is letters, digits, '.', '_', '-', at most `MAX_NAME`)."""
    if len(instance) > MAX_NAME or not _NAME.fullmatch(instance):
        return f"instance name {instance[:80]!r} (letters, digits, '.', '_', '-'; at most {MAX_NAME})"
    return ""


def agent_problem(agent: AgentInfo) -> str:
    """Why `agent` cannot be a cluster's entry ("" when every field is sane)."""
    if agent.role not in (*Role, RELAY_ROLE):
        return f"role {agent.role[:16]!r} (expected prefill, decode or relay)"
    if problem := instance_problem(agent.instance):
        return problem
    if not 1 <= agent.tp <= MAX_TP or not 0 <= agent.rank < agent.tp:
        return f"rank {agent.rank} of TP {agent.tp} (TP 1 to {MAX_TP}, 0 <= rank < TP)"
    if agent.pp is not None and not 0 <= agent.pp < MAX_TP:
        return f"pipeline stage {agent.pp} (0 to {MAX_TP - 1})"
    if agent.kind not in AGENT_KINDS:
        return f"kind {agent.kind[:16]!r} (expected one of {', '.join(repr(kind) for kind in AGENT_KINDS)})"
    if not 0 < agent.page_bytes <= MAX_PAGE_BYTES and not agent.events_only:
        return f"page size {agent.page_bytes} B (1 to {MAX_PAGE_BYTES})"
    if not 0 <= agent.pid < 1 << 32 or not 0 <= agent.incarnation < 1 << 64:
        return f"pid {agent.pid} or incarnation {agent.incarnation} out of range"
    if len(agent.host) > MAX_HOST:
        return f"host name of {len(agent.host)} characters (at most {MAX_HOST})"
    if not agent.host.isprintable():  # shown beside the rank: an escape sequence would reach a terminal
        return f"host name {agent.host[:80]!r} holds control characters"
    for name in _ENDPOINTS:
        endpoint = getattr(agent, name)
        if endpoint and (problem := endpoint_problem(endpoint)):
            return f"{name}: {problem}"
    return ""


def registration_problem(agent: AgentInfo) -> str:
    """Why the bootstrap service must refuse `agent`: an insane field, or a prefill rank nobody can send to."""
    problem = agent_problem(agent)
    if not problem and agent.role == Role.PREFILL and not agent.data_endpoint and not agent.events_only:
        return "a prefill rank without a data endpoint"
    if not problem and agent.role == RELAY_ROLE and not (agent.event_endpoint and agent.snapshot_endpoint):
        return "a relay without an event and a snapshot endpoint"
    return problem


def entry_name(agent: AgentInfo) -> str:
    """A printable name for an entry, even one whose fields are garbage."""
    return rank_label(f"{agent.instance[:MAX_NAME]!r}"[1:-1], agent.rank, agent.pp)
