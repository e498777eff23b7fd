"""The HTTP side of the exporter: `/metrics` on HOST:PORT, prometheus_client's WSGI app on a threading WSGI server;
any other path is 404."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

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


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request (a slow scraper holds no other up); the threads do not outlive the process."""

    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Log nothing: scrapes are not news."""


class MetricsServer:
    """`/metrics` of one `ModelMetrics` (any other path: 404), on its own threads; `close()` stops it."""

    def __init__(self, metrics: ModelMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server_class = _Server6 if family == socket.AF_INET6 else _Server
        app = only_metrics(make_wsgi_app(self.registry))
        self._server = make_server(str(address[0]), port, app, server_class, handler_class=_Quiet)
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
