"""Why an endpoint may have answered nothing: ZeroMQ retries a connect in silence, so a call unanswered reads the
same whether the host name has no address, nothing listens on the port, a firewall drops the packets, the port is
another server's (an HTTP one: SGLang's own bootstrap port), or the service takes the connection and says nothing
(with CURVE: keys it does not serve).

`why_silent` finds out the first four the way ZeroMQ dials (IPv4, as kvtop's sockets do), in a bounded time: a
name lookup or a connection that hangs is said so, never waited out after the caller's own deadline. A ZeroMQ
peer sends its greeting as soon as it takes a connection (ZMTP's signature, first byte 0xFF), so a port that
sends nothing, or something else, is no ZeroMQ service.
"""

from __future__ import annotations

import os
import socket
import threading
import time

PROBE_S = 0.5
"""How long the look at an endpoint may take, name lookup and connection together."""


_looking: dict[str, tuple[threading.Thread, list[str]]] = {}
"""The look at each endpoint still running, with where it puts what it found: one at a time per endpoint."""
_looking_lock = threading.Lock()


def why_silent(endpoint: str, timeout_s: float = PROBE_S) -> str:
    """Why nobody may answer at `endpoint` ("" when it takes connections, or when it is no tcp:// or ipc://
    endpoint): `HOST does not resolve: WHY`, `nothing listens on HOST:PORT: the connection was refused`, ...
    A look still running (a name lookup that hangs past its caller's deadline) is waited on again, not started
    anew: a client retrying every second left a thread per try blocked in the resolver."""
    with _looking_lock:
        thread, found = _looking.get(endpoint) or (None, [])
        if thread is None or not thread.is_alive():
            found = []
            thread = threading.Thread(
                target=lambda: found.append(_look(endpoint, timeout_s)), name="kvtop-reach", daemon=True
            )
            _looking[endpoint] = thread, found
            thread.start()
    thread.join(timeout_s)
    if not found:
        return f"{_host(endpoint)} did not resolve or take a connection within {timeout_s:g}s"
    return found[0]


def _host(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]") or endpoint


def _look(endpoint: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s * _LOOK_SHARE
    if endpoint.startswith("ipc://"):
        path = endpoint.removeprefix("ipc://")
        return "" if os.path.exists(path) else f"no socket at {path}"
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    if not endpoint.startswith("tcp://") or not host or host == "*" or not port.isdecimal():
        return ""
    try:
        address = str(socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror as error:
        return _no_ipv4(host) or f"{host} does not resolve: {error.strerror}"
    except (OSError, UnicodeError, ValueError):
        return ""
    try:
        connection = socket.create_connection((address, int(port)), timeout_s)
    except ConnectionRefusedError:
        return f"nothing listens on {host}:{port}: the connection was refused"
    except TimeoutError:
        return f"{host}:{port} took no connection within {timeout_s:g}s: a firewall drops it, or the host is down"
    except OSError as error:
        return f"{host}:{port} takes no connection: {error.strerror or error}"
    with connection:
        return _not_zeromq(connection, f"{host}:{port}", deadline - time.monotonic())


_LOOK_SHARE = 0.8
"""The share of the look's time it may spend before waiting for a greeting ends (its caller waits the whole)."""
_ZMTP_FIRST_BYTE = 0xFF


def _not_zeromq(connection: socket.socket, where: str, wait_s: float) -> str:
    """Nothing ("") when the peer greets as ZeroMQ does (or no time is left to wait for it), else what it did."""
    if wait_s <= 0:
        return ""
    connection.settimeout(wait_s)
    try:
        greeting = connection.recv(32)
    except TimeoutError:
        return (
            f"{where} took the connection but sent no ZeroMQ greeting within {wait_s:.1f}s: another server's port, "
            "not a kvtop service's; SGLang's own bootstrap port is an HTTP one"
        )
    except OSError:
        return ""
    if not greeting:
        return f"{where} took the connection and closed it without a ZeroMQ greeting: another server's port"
    if greeting[0] != _ZMTP_FIRST_BYTE:
        return f"{where} answers, but not in ZeroMQ (it opened with {greeting[:24]!r}): another server's port"
    return ""


def _no_ipv4(host: str) -> str:
    """`HOST has only IPv6 addresses ...` when it has those (kvtop dials IPv4), else ""."""
    try:
        socket.getaddrinfo(host, None, socket.AF_INET6)
    except (OSError, UnicodeError):
        return ""
    return f"{host} has only IPv6 addresses, and kvtop dials IPv4"
