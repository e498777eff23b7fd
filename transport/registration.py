"""What a registration must be before anyone connects to it: endpoint syntax and sane identity values.

The bootstrap service refuses an `AgentInfo` that fails `registration_problem`,
and every reader of a listing (kvtop's collector, a subscriber) checks each
entry with `agent_problem` before connecting, so one bad entry is counted and named instead of
raising a `ZMQError` in whoever reads it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from transport.config import Role
from transport.wire import AGENT_KINDS, AgentInfo, rank_label

TAKEN_LIVE = "it is taken only once that expires"
"""How the bootstrap service's refusal of a rank whose entry another client holds ends: the service lists such a
rank apart (`AgentList.taken`) while it refreshes, so a reader of the refusal (its log, a view of its heartbeat)
knows that new views hear it."""


TAKEN_SUFFIX = "~taken"
"""Marks the label a rank listed as taken is heard under (`taken_label`)."""


def taken_label(label: str) -> str:
    """`prefill-0/TP0~taken`: what a view and a relay call a rank the service lists as taken (`AgentList.taken`). The
    taker publishes under the rank's label too, from another process at another address: keyed apart, each is seen
    (one label made a view alternate between their incarnations), and a snapshot asked by it reaches the rank's."""
    return label + TAKEN_SUFFIX


def refused_as_taken(refusal: str) -> bool:
    """Whether `refusal` (a refused registration, as a rank's heartbeat says it) is one that the service lists as
    taken: another client holds the rank's entry (peers resolve that client's, views hear this rank)."""
    return TAKEN_LIVE in refusal


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
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NEVER_DIALED: tuple[tuple[Network, str], ...] = (
    (ipaddress.ip_network("169.254.0.0/16"), "link-local (where cloud metadata services answer)"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "a cloud metadata service"),
    (ipaddress.ip_network("100.100.100.200/32"), "a cloud metadata service"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
    (ipaddress.ip_network("255.255.255.255/32"), "broadcast"),
)
"""Addresses no rank listens at that a listing could turn every reader into a client of: refused in any entry."""
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


def endpoint_address(endpoint: str) -> _Address | None:
    """The IP address a `tcp://` endpoint names (`localhost` as 127.0.0.1); None for a host name or `ipc://`."""
    scheme, _, rest = endpoint.partition("://")
    host = rest.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if scheme != "tcp":
        return None
    if host.lower() == "localhost":
        return ipaddress.IPv4Address("127.0.0.1")
    return _address(host)


def _address(text: str) -> _Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def never_dialed(endpoint: str) -> str:
    """Why no reader may dial `endpoint` whoever listed it ("" when it names no address in `NEVER_DIALED`)."""
    address = endpoint_address(endpoint)
    for network, what in NEVER_DIALED:
        if address is not None and address in network:
            return f"{endpoint[:80]!r} is {what}: no rank listens there"
    return ""


def foreign_endpoint(endpoint: str, client: str, networks: Sequence[Network] = ()) -> str:
    """Why a registration from `client` (the peer's IP as the service saw it) may not name `endpoint` ("" when it
    may): an IP address must be the client's own, unless the client is on this machine (loopback, ipc, inproc),
    or in `networks`; a loopback or wildcard (0.0.0.0, ::) address only from this machine (else every reader dials
    its own, or nothing). Each refusal names its fix, for the refused rank's own log. A host name is not resolved
    at the border (a resolver that hangs would stall every registration): it is taken as named."""
    address, peer = endpoint_address(endpoint), _address(client)
    if address is None or peer is None or peer.is_loopback or address == peer:
        return ""
    fix = f"give the rank the address its peers reach it at (`kvtop agent --host`; the service sees {client})"
    if address.is_loopback:
        return (
            f"{endpoint[:80]!r} is a loopback address registered from {client}: every reader would dial itself; {fix}"
        )
    if address.is_unspecified:
        return f"{endpoint[:80]!r} is a wildcard address registered from {client}: nobody can dial it; {fix}"
    if any(address in network for network in networks):
        return ""
    return (f"{endpoint[:80]!r} is not the registering client's address {client}: where ranks reach the service on "
            f"one network and move data on another, start the bootstrap with --endpoint-network "
            f"{ipaddress.ip_network(address)} (or the network that holds it); else advertise {client}")  # fmt: skip


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
    if agent.dp is not None and not 0 <= agent.dp < MAX_TP:
        return f"DP replica {agent.dp} (0 to {MAX_TP - 1})"
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
        if endpoint and (problem := endpoint_problem(endpoint) or never_dialed(endpoint)):
            return f"{name}: {problem}"
    return ""


def registration_problem(agent: AgentInfo, client: str = "", networks: Sequence[Network] = ()) -> str:
    """Why the bootstrap service must refuse `agent` registered from `client`: an insane field, an endpoint that
    is not the client's (`foreign_endpoint`), or a prefill rank nobody can send to."""
    problem = agent_problem(agent)
    for name in _ENDPOINTS:
        endpoint = getattr(agent, name)
        if not problem and endpoint and (problem := foreign_endpoint(endpoint, client, networks)):
            problem = f"{name}: {problem}"
    if not problem and agent.role == Role.PREFILL and not agent.data_endpoint and not agent.events_only:
        return "a prefill rank without a data endpoint"
    if not problem and agent.role == RELAY_ROLE and not (agent.event_endpoint and agent.snapshot_endpoint):
        return "a relay without an event and a snapshot endpoint"
    return problem


def entry_name(agent: AgentInfo) -> str:
    """A printable name for an entry, even one whose fields are garbage."""
    return rank_label(f"{agent.instance[:MAX_NAME]!r}"[1:-1], agent.rank, agent.pp, agent.dp)
