"""The HTTP side of the exporter: `/metrics` on HOST:PORT, prometheus_client's WSGI app on a threading WSGI server;
any other path is 404, HEAD is answered as GET without the body, a method but GET, HEAD and OPTIONS 405 (`Allow`
says those three), an HTTP/0.9 request (no version) 400 at once, `?name[]=NAME` (prometheus_client's filter)
serves the families so named, an unknown name 400.

A client cannot hold the exporter: a connection quiet for `CONNECTION_TIMEOUT_S` (a request never finished,
an answer never read) is closed, past `MAX_CONNECTIONS` at once a connection is answered 503 and closed, and
a burst of connections waits in the kernel's queue (`_Server.request_queue_size`). Each of those is counted
(`kvtop_export_connections_dropped_total`, by reason), never a traceback on stderr."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from kvtop.export.metrics import ModelMetrics
from kvtop.model.cluster import ClusterModel

DEFAULT_LISTEN = "127.0.0.1:9464"
"""Loopback only unless told otherwise (plain HTTP, no authentication); 9464 is also the default port of
OpenTelemetry's Prometheus exporter."""


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6; PORT 0 picks a free one) into (host, port); ValueError says why not."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^\s:\[\]]+):(\d{1,5})", text)
    if match is None:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN}, or [::1]:9464)")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ValueError(f"port {port} is outside 0..65535")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


METRICS_PATH = "/metrics"

_App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def only_metrics(app: _App) -> _App:
    """`app` on `METRICS_PATH` only: any other path is 404, its body naming the path that answers (a scrape
    misconfigured to `/` or `/metric` would otherwise read metrics and look right)."""

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        body = f"404 not found: kvtop's metrics are at {METRICS_PATH}\n".encode()
        start_response(
            "404 Not Found", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        )
        return [body]

    return answer


NAME_PARAMETER = "name[]"
"""prometheus_client's filter: `/metrics?name[]=A&name[]=B` serves the samples named A or B."""
NAMES_SHOWN = 3
"""Unknown names a 400 names (the rest counted): a query of thousands of names made a 44 KB answer."""
NAME_SHOWN = 80
"""Characters of each name shown."""
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "info": ("_info",),
}
"""The sample names of a family by type, past its own name (as prometheus_client's registry names them)."""


class _Picked:
    """Families already collected, as the registry `make_wsgi_app` reads."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _own_names(family: Metric) -> set[str]:
    """The family's name and those its samples can have."""
    return {family.name, *(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))}


def _named(family: Metric, names: set[str]) -> Metric | None:
    """`family` as `names` pick it: whole when its own name is among them, else the samples so named (its HELP
    and TYPE even with none: the family exists, it has no series now); None when no name is one of its."""
    if family.name in names:
        return family
    if not _own_names(family) & names:
        return None
    picked = Metric(family.name, family.documentation, family.type)
    picked.samples = [sample for sample in family.samples if sample.name in names]
    return picked


def by_name(registry: CollectorRegistry) -> _App:
    """prometheus_client's app on `registry`, `?name[]=NAME` (repeatable) serving the families and samples so
    named: a family's name (`kvtop_failure_origins`) or a sample's (`kvtop_failure_origins_total`). Its own filter
    looks up collectors by the names they describe, and kvtop's describe none (registering must not read the
    model): every such query was an empty 200. A name that is none of kvtop's is 400 naming it, not an empty
    answer a scrape would read as no series."""
    every: _App = make_wsgi_app(registry)

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        wanted = query.pop(NAME_PARAMETER, None)
        if wanted is None:
            return every(environ, start_response)
        names = set(wanted)
        picked = [named for family in registry.collect() if (named := _named(family, names)) is not None]
        unknown = sorted(names.difference(*map(_own_names, picked)))
        if unknown:
            shown = ", ".join(repr(name[:NAME_SHOWN]) for name in unknown[:NAMES_SHOWN])
            more = f" and {len(unknown) - NAMES_SHOWN} more" if len(unknown) > NAMES_SHOWN else ""
            body = f"400 bad request: kvtop serves no metric named {shown}{more}\n".encode()
            start_response(
                "400 Bad Request", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
            )
            return [body]
        rest = {**environ, "QUERY_STRING": urlencode(query, doseq=True)}
        served: _App = make_wsgi_app(_Picked(picked))
        return served(rest, start_response)

    return answer


ALLOW = "GET, HEAD, OPTIONS"
"""The methods `/metrics` answers (HEAD as GET, see `head_as_get`)."""


def allowed_methods(app: _App) -> _App:
    """`app` for GET; OPTIONS answered 200 and any other method 405, both with `Allow: GET, HEAD, OPTIONS`
    (prometheus_client's said `OPTIONS,GET`: HEAD, served, was missing, and a client going by it never tried)."""

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if method == "GET":
            return app(environ, start_response)
        body = b"" if method == "OPTIONS" else f"405 method not allowed: {method}; use {ALLOW}\n".encode()
        status = "200 OK" if method == "OPTIONS" else "405 Method Not Allowed"
        text = [("Content-Type", "text/plain; charset=utf-8")] if body else []
        start_response(status, [("Allow", ALLOW), *text, ("Content-Length", str(len(body)))])
        return [body]

    return answer


def head_as_get(app: _App) -> _App:
    """`app` answering HEAD as GET without the body (its Content-Length kept), as Prometheus-compatible servers
    do: prometheus_client answers HEAD 405, so an uptime probe or `curl -I` read the exporter as broken."""

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        started: list[tuple[str, list[tuple[str, str]]]] = []
        body = b"".join(
            app({**environ, "REQUEST_METHOD": "GET"}, lambda status, headers, *_: started.append((status, headers)))
        )
        status, headers = started[0]
        kept = [(name, value) for name, value in headers if name.lower() != "content-length"]
        start_response(status, [*kept, ("Content-Length", str(len(body)))])
        return []

    return answer


MAX_CONNECTIONS = 64
"""Connections served at once (a thread each); Prometheus holds one per target and scrape."""
CONNECTION_TIMEOUT_S = 10.0
"""How long a connection may stay quiet, sending its request or taking the answer (Prometheus' default
scrape timeout): an idle connection held a thread for as long as its client kept it open."""
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"kvtop export: too many connections at once\n"
)
DROPPED = ("busy", "timeout", "reset")
"""Why a connection was dropped: over `MAX_CONNECTIONS`, quiet past `CONNECTION_TIMEOUT_S`, reset by its
client before it had the answer."""


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection (a slow scraper holds no other up), `MAX_CONNECTIONS` at most; the threads do
    not outlive the process."""

    daemon_threads = True
    request_queue_size = 128
    """The listen backlog (socketserver's is 5: of 200 scrapes at once, 29 waited out their 30 s timeout)."""

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self.dropped = dict.fromkeys(DROPPED, 0)

    def drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.drop("busy")
            with contextlib.suppress(OSError):
                request.setblocking(False)  # a 503 if it fits the socket's buffer, never a wait
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread to give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went quiet or away is counted; anything else is a bug, its traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, TimeoutError):
            self.drop("timeout")
        elif isinstance(error, ConnectionError):
            self.drop("reset")
        else:
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Answer(ServerHandler):
    def handle_error(self) -> None:
        """A client that went quiet or away mid-answer: raised to the server, which counts it (wsgiref printed
        its traceback and tried to answer it an error page)."""
        if isinstance(sys.exc_info()[1], OSError):
            raise
        super().handle_error()


class _Quiet(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT_S

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing: scrapes are not news."""

    def handle(self) -> None:
        """`WSGIRequestHandler.handle`, answered by `_Answer`."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if len(self.raw_requestline.split()) == 2:  # parse_request would wait for headers HTTP/0.9 never sends
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(400, "HTTP/0.9 request (no version): send HTTP/1.0 or later")
            return
        if not self.parse_request():  # an error answered already
            return
        wfile: Any = self.wfile  # a socket's file, which typeshed does not take for wsgiref's IO[bytes]
        handler = _Answer(self.rfile, wfile, self.get_stderr(), self.get_environ(), multithread=False)
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref's back pointer, for its logging
        handler.run(self.server.get_app())  # type: ignore[attr-defined]


class _Connections(Collector):
    """`kvtop_export_connections_dropped_total` of one server."""

    def __init__(self, server: _Server) -> None:
        self._server = server

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kvtop_export_connections_dropped",
            "Connections the exporter dropped: busy (over its limit at once), timeout (quiet past its limit), "
            "reset (by the client).",
            labels=["reason"],
        )
        with self._server._lock:
            counts = dict(self._server.dropped)
        for reason in DROPPED:
            family.add_metric([reason], counts[reason])
        yield family


class MetricsServer:
    """`/metrics` of one `ModelMetrics` (any other path: 404), on its own threads; `close()` stops it."""

    def __init__(self, metrics: ModelMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server_class = _Server6 if family == socket.AF_INET6 else _Server
        app = head_as_get(only_metrics(allowed_methods(by_name(self.registry))))
        self._server = make_server(str(address[0]), port, app, server_class, handler_class=_Quiet)
        assert isinstance(self._server, _Server)
        self.registry.register(_Connections(self._server))
        self._thread = threading.Thread(target=self._server.serve_forever, name="kvtop-metrics", daemon=True)
        self._thread.start()
        self.host, self.port = host, int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


@contextlib.contextmanager
def serving(
    model: ClusterModel,
    lock: contextlib.AbstractContextManager[object],
    listen: str,
    *,
    now: Callable[[], float] = time.time,
    source: str = "live",
    error: Callable[[], str] = lambda: "",
) -> Iterator[MetricsServer]:
    """Serve `model`'s metrics on `listen` (HOST:PORT) until the block ends; OSError when it cannot bind."""
    host, port = parse_listen(listen)
    server = MetricsServer(ModelMetrics(model, lock, now, source, error), host, port)
    try:
        yield server
    finally:
        server.close()
