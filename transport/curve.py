"""CURVE for every socket that crosses hosts: key folders, the socket options, and ZAP (pyzmq's ironhouse).

A key folder (`generate`) holds one cluster's keys::

    DIR/                      mode 0700
      server.key              the server public key: every host
      server.key_secret       the server secret key (0600): agent hosts only
      client.key              a client public key
      client.key_secret       its secret key (0600): every host (agents connect to each other too)
      allowed/                the allow-list: one <name>.key per client public key (agent hosts only)
        client.key

Every socket that binds is a CURVE server with the server pair and asks ZAP (an authenticator thread
per `zmq.Context`, started by the first server socket of that context) whether the client's public key
is in `allowed/`; every socket that connects is a client with the client pair and the server's public
key. A peer without an allowed key never completes the handshake: it receives nothing. A view's host
needs `server.key`, `client.key` and `client.key_secret` only (`CurveKeys.load(serve=False)`).

`CurveKeys.load` is the border post: a folder that is missing, open to group or others, or holds a
malformed or mismatched key raises `CurveError` at start, as does a libzmq built without CURVE. A
context whose sockets served CURVE must `stop_authenticator` before `term()` (its authenticator holds sockets).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import zmq
from zmq.utils import z85

if TYPE_CHECKING:  # imported where used: zmq.auth.thread pulls in asyncio, which every rank and view would pay
    from zmq.auth.thread import ThreadAuthenticator

from transport.errors import CurveError

SERVER: Final = "server"
CLIENT: Final = "client"
ALLOWED: Final = "allowed"
_KEY_CHARS: Final = 40
"""A Z85-encoded 32-byte key."""
_DENIED_NAMED: Final = 64
"""Distinct refused client keys logged by name (a flood of keys logs no more)."""

_log = logging.getLogger(__name__)


def require_curve() -> None:
    """Raise `CurveError` when this libzmq cannot do CURVE."""
    if not zmq.has("curve"):
        raise CurveError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE: install pyzmq's wheel (it bundles "
            "a libzmq with CURVE) or a libzmq built with libsodium"
        )


def is_loopback(host: str) -> bool:
    """Whether binding `host` (an address, `localhost`, or a tcp:// or ipc:// endpoint) stays on this machine."""
    if host.startswith(("ipc://", "inproc://")):
        return True
    if host.startswith("tcp://"):
        host = host.removeprefix("tcp://").rpartition(":")[0]
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name, a host name: reachable from elsewhere


def exposure_problem(hosts: list[str], curve: bool, insecure: bool) -> str:
    """Why binding `hosts` is refused ("" when it is not): beyond loopback without CURVE, unless `insecure`."""
    exposed = [host for host in hosts if host and not is_loopback(host)]
    if not exposed or curve or insecure:
        return ""
    return (
        f"binding {exposed[0]} (not loopback) without CURVE lets anyone on the network read and drive the "
        "cluster: pass --curve-keys DIR (made by `kvtop keys generate DIR`), or --insecure to do it anyway"
    )


@dataclass(frozen=True, slots=True)
class CurveSide:
    """The CURVE options of one socket: a server (it binds) or a client of `server_key` (it connects)."""

    public: bytes
    secret: bytes = field(repr=False)
    server_key: bytes = b""
    """The server's public key (a client's); empty for a server."""
    allowed: frozenset[bytes] = frozenset()
    """The client public keys a server lets in."""
    domain: str = ""
    """A server's ZAP domain (one per server key), so contexts can serve several key folders."""

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Set `sock`'s CURVE options; a server's context gets its authenticator first (no unchecked handshake)."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        if self.server_key:
            sock.curve_serverkey = self.server_key
            return
        _guard(sock.context, self)
        sock.zap_domain = self.domain.encode()
        sock.curve_server = True


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """One cluster's keys, loaded and checked (`load`); `client` for sockets that connect, `server` that bind."""

    folder: str
    client: CurveSide
    server_pair: tuple[bytes, bytes] | None = field(default=None, repr=False)
    """(public, secret) where this host serves (agents, bootstrap); None on a view's host."""
    allowed: frozenset[bytes] = field(default_factory=frozenset)

    @property
    def server(self) -> CurveSide:
        """The options of a socket that binds; `CurveError` where this folder holds no server secret."""
        if self.server_pair is None or not self.allowed:
            raise CurveError(f"{self.folder} holds no server secret key and allow-list: it cannot serve")
        public, secret = self.server_pair
        domain = "kvtop-" + z85.decode(public)[:8].hex()
        return CurveSide(public, secret, allowed=self.allowed, domain=domain)

    @classmethod
    def load(cls, folder: str | os.PathLike[str], serve: bool) -> CurveKeys:
        """The keys in `folder`; `serve`: this process binds sockets (needs the server secret and `allowed/`).

        Raises `CurveError` (one line naming the file and what to do) for anything that cannot be used.
        """
        require_curve()
        root = Path(folder)
        if not root.is_dir():
            raise CurveError(f"curve keys folder {root} does not exist (make one with `kvtop keys generate {root}`)")
        _private(root, "folder", 0o700)
        server_public, _ = _load_pair(root / f"{SERVER}.key", secret=False)
        client_public, client_secret = _load_pair(root / f"{CLIENT}.key_secret", secret=True)
        client = CurveSide(client_public, client_secret, server_key=server_public)
        if not serve:
            return cls(str(root), client)
        server_pair = _load_pair(root / f"{SERVER}.key_secret", secret=True)
        if server_pair[0] != server_public:
            raise CurveError(f"{root / SERVER}.key and {SERVER}.key_secret are not one key pair")
        return cls(str(root), client, server_pair, _load_allowed(root / ALLOWED))


def _private(path: Path, what: str, mode: int) -> None:
    """Refuse `path` when group or others may read it (a secret must be as private as an ssh key)."""
    actual = stat.S_IMODE(path.stat().st_mode)
    if actual & 0o077:
        raise CurveError(f"curve keys {what} {path} is open to group or others (mode {actual:04o}): chmod {mode:o} it")


def _check_key(key: bytes, path: Path, which: str) -> bytes:
    try:
        valid = len(key) == _KEY_CHARS and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError, TypeError):
        valid = False
    if not valid:
        raise CurveError(f"{path}: the {which} key is not a {_KEY_CHARS}-character Z85 CURVE key")
    return key


def _load_pair(path: Path, secret: bool) -> tuple[bytes, bytes]:
    """(public, secret) from a `.key_secret` file (checked private and consistent), or (public, b"") from a `.key`."""
    if not path.is_file():
        raise CurveError(f"missing {path} (copy it from the folder `kvtop keys generate` made)")
    if secret:
        _private(path, "file", 0o600)
    import zmq.auth

    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as error:
        raise CurveError(f"{path}: {error}") from None
    public = _check_key(public, path, "public")
    if not secret:
        return public, b""
    if secret_key is None:
        raise CurveError(f"{path}: no secret key in it")
    secret_key = _check_key(secret_key, path, "secret")
    if zmq.curve_public(secret_key) != public:
        raise CurveError(f"{path}: its public key does not belong to its secret key")
    return public, secret_key


def _load_allowed(folder: Path) -> frozenset[bytes]:
    if not folder.is_dir():
        raise CurveError(f"missing the allow-list folder {folder} (one <name>.key per client public key)")
    if stat.S_IMODE(folder.stat().st_mode) & 0o022:
        raise CurveError(f"allow-list folder {folder} is writable by group or others: chmod 700 it")
    keys = frozenset(_load_pair(path, secret=False)[0] for path in sorted(folder.glob("*.key")))
    if not keys:
        raise CurveError(f"allow-list folder {folder} holds no <name>.key: no client could connect")
    return keys


@dataclass(frozen=True, slots=True)
class Generated:
    """What `generate` wrote, and where each file goes."""

    folder: Path
    files: tuple[Path, ...]


def generate(folder: str | os.PathLike[str]) -> Generated:
    """Write a server pair, a client pair and an allow-list holding the client's public key into `folder`.

    The folder is created 0700 (an existing one must be empty), secret files are 0600. Raises `CurveError`.
    """
    require_curve()
    root = Path(folder)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CurveError(f"{root} exists and is not an empty folder: keys are never overwritten")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    import zmq.auth

    for name in (SERVER, CLIENT):
        public, secret = zmq.auth.create_certificates(root, name)
        Path(secret).chmod(0o600)
        Path(public).chmod(0o644)
    allowed = root / ALLOWED
    allowed.mkdir(mode=0o700)
    shutil.copyfile(root / f"{CLIENT}.key", allowed / f"{CLIENT}.key")
    CurveKeys.load(root, serve=True)  # what was written loads
    return Generated(root, tuple(sorted(p for p in root.rglob("*") if p.is_file())))


class _AllowList:
    """ZAP's question for each CURVE handshake: is this client key allowed on this server key's domain."""

    def __init__(self) -> None:
        self.by_domain: dict[str, frozenset[bytes]] = {}
        self.denied = 0
        self._named: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.by_domain.get(domain, frozenset()):
            return True
        self.denied += 1
        if key not in self._named and len(self._named) < _DENIED_NAMED:
            self._named.add(key)
            _log.warning("refused a CURVE client whose key %s is not in the allow-list", key.decode(errors="replace"))
        return False


@dataclass(eq=False)
class _Guard:
    authenticator: ThreadAuthenticator
    allow: _AllowList


_guards: dict[int, _Guard] = {}
_guards_lock = threading.Lock()


def _guard(context: zmq.Context[Any], side: CurveSide) -> None:
    """Make sure `context` has a running authenticator that knows `side`'s allow-list."""
    from zmq.auth.thread import ThreadAuthenticator

    with _guards_lock:
        guard = _guards.get(id(context))
        if guard is None or guard.authenticator.context is not context:  # none yet, or an id reused
            authenticator = ThreadAuthenticator(context, log=_log)
            authenticator.start()
            guard = _guards[id(context)] = _Guard(authenticator, _AllowList())
        if side.domain not in guard.allow.by_domain:
            guard.allow.by_domain[side.domain] = side.allowed
            guard.authenticator.configure_curve_callback(side.domain, guard.allow)


def denied() -> int:
    """CURVE handshakes this process refused so far (a client key not on the allow-list), every context."""
    with _guards_lock:
        return sum(guard.allow.denied for guard in _guards.values())


def stop_authenticator(context: zmq.Context[Any]) -> None:
    """Stop `context`'s authenticator, if it has one (before `term()`, which would wait for its sockets)."""
    with _guards_lock:
        guard = _guards.pop(id(context), None)
    if guard is not None:
        _stop_within(guard.authenticator, AUTHENTICATOR_STOP_S)


AUTHENTICATOR_STOP_S = 5.0


def _stop_within(authenticator: ThreadAuthenticator, timeout_s: float) -> None:
    """`ThreadAuthenticator.stop()` with a bounded wait: pyzmq's joins its thread with no timeout, and a run of
    the suite once hung there; a thread that does not stop in time is logged and left (a daemon)."""
    from zmq.auth.base import Authenticator

    pipe, thread = authenticator.pipe, authenticator.thread
    if pipe is None:
        return
    with contextlib.suppress(zmq.ZMQError):
        pipe.send(b"TERMINATE", zmq.NOBLOCK)
    if thread is not None:
        thread.join(timeout_s)
        if thread.is_alive():
            _log.error("the CURVE authenticator's thread did not stop within %g s; left running", timeout_s)
            return
    authenticator.thread = None  # type: ignore[assignment]
    pipe.close(linger=0)
    authenticator.pipe = None  # type: ignore[assignment]
    Authenticator.stop(authenticator)


def serving(keys: CurveKeys | None) -> CurveSide | None:
    """The options of a socket that binds (None: plain TCP)."""
    return keys.server if keys is not None else None


def dialing(keys: CurveKeys | None) -> CurveSide | None:
    """The options of a socket that connects (None: plain TCP)."""
    return keys.client if keys is not None else None
