"""The HTTP side of the exporter: `/metrics` on HOST:PORT, served by prometheus_client's own server."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server

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


class MetricsServer:
    """`/metrics` (any path answers the same) of one `ModelMetrics`, on its own threads; `close()` stops it."""

    def __init__(self, metrics: ModelMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        self._server, self._thread = start_http_server(port, host, self.registry)
        self.host, self.port = host, int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

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
