"""The exporter's HTTP side against clients that misbehave: one that connects and sends nothing held a thread
for as long as it kept the connection open, and thousands of them held thousands; now a quiet connection is
closed, connections past the limit are answered 503, and both are counted on /metrics."""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request

import pytest

from kvtop.export import server
from kvtop.export.server import MetricsServer, serving
from kvtop.model.cluster import ClusterModel


def _connect(metrics: MetricsServer) -> socket.socket:
    return socket.create_connection((metrics.host, metrics.port), timeout=30)


def _dropped(metrics: MetricsServer, reason: str, wait_for) -> str:
    """The dropped counter's sample line, from a scrape as soon as one is served (a slot may still be held by a
    connection closed a moment ago)."""
    prefix = f'kvtop_export_connections_dropped_total{{reason="{reason}"}} '

    def scraped() -> str:
        try:
            with urllib.request.urlopen(metrics.url, timeout=30) as answer:
                text: str = answer.read().decode()
        except urllib.error.HTTPError as error:
            assert error.code == 503, error
            return ""
        return next(line for line in text.splitlines() if line.startswith(prefix))

    return wait_for(scraped, timeout=30, what="a scrape served")


def test_a_connection_that_sends_nothing_is_closed_and_counted(monkeypatch, capfd, wait_for) -> None:
    monkeypatch.setattr(server._Quiet, "timeout", 0.2)
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        with _connect(metrics) as idle:
            assert idle.recv(1) == b""  # the exporter closed it (before: it waited for the client)
        assert _dropped(metrics, "timeout", wait_for).endswith(" 1.0")
    assert "Traceback" not in capfd.readouterr().err


def test_connections_past_the_limit_are_answered_503_and_counted(monkeypatch, wait_for) -> None:
    monkeypatch.setattr(server, "MAX_CONNECTIONS", 2)
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        idle = [_connect(metrics) for _ in range(2)]
        with _connect(metrics) as third:
            answer = b"".join(iter(lambda: third.recv(4096), b""))
        assert answer.startswith(b"HTTP/1.0 503 ")
        assert b"too many connections at once" in answer
        for client in idle:
            client.close()
        assert float(_dropped(metrics, "busy", wait_for).split()[-1]) >= 1  # a scrape refused meanwhile counts too


def _answer(metrics: MetricsServer, request: bytes) -> tuple[bytes, bytes]:
    """The exporter's answer to `request` on a connection of its own: (status line and headers, body)."""
    with _connect(metrics) as client:
        client.sendall(request)
        answer = b"".join(iter(lambda: client.recv(4096), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def test_head_of_metrics_is_answered_as_get_without_a_body() -> None:
    """HEAD /metrics was 405 (prometheus_client takes GET alone): an uptime probe or `curl -I` read it as broken."""
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        head, body = _answer(metrics, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        missing, missing_body = _answer(metrics, b"HEAD /metric HTTP/1.0\r\n\r\n")

    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.0 200 "), head
    assert "Content-Type: text/plain; version=0.0.4; charset=utf-8" in lines
    assert int(next(line for line in lines if line.startswith("Content-Length:")).split()[1]) > 0
    assert body == b""
    assert missing.startswith(b"HTTP/1.0 404 ") and missing_body == b""


def test_an_http_0_9_request_line_is_answered_400_at_once() -> None:
    """`GET /metrics` with no version: no headers follow, and the exporter waited for them until its 10 s
    idle timeout; it is answered 400 at once (the client here would wait 30 s)."""
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics, _connect(metrics) as client:
        client.sendall(b"GET /metrics\r\n")
        status = client.recv(4096)  # before: nothing until the exporter's timeout closed the connection

    assert status.startswith(b"HTTP/1.0 400 "), status
    assert b"HTTP/0.9" in status


def _get(metrics: MetricsServer, query: str) -> tuple[int, str]:
    """The status and body of GET /metrics?`query` (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(f"{metrics.url}?{query}", timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def _families(body: str) -> list[str]:
    return [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")]


def test_name_parameters_serve_the_families_so_named_and_an_unknown_name_is_400() -> None:
    """`?name[]=` (prometheus_client's filter) answered an empty 200 (kvtop's collectors describe no names, so
    its filter found none); now a sample's or a family's name picks that family, and a name kvtop serves none of
    is 400 naming it."""
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        up = _get(metrics, "name[]=kvtop_source_up")
        two = _get(metrics, "name%5B%5D=kvtop_failure_origins_total&name[]=kvtop_transfer_duration_seconds")
        unknown = _get(metrics, "name[]=kvtop_source_up&name[]=kvtop_no_such")

    assert up == (200, up[1]) and _families(up[1]) == ["kvtop_source_up"] and "\nkvtop_source_up 1.0\n" in up[1]
    assert two[0] == 200 and _families(two[1]) == ["kvtop_failure_origins_total", "kvtop_transfer_duration_seconds"]
    assert unknown == (400, "400 bad request: kvtop serves no metric named 'kvtop_no_such'\n")


def test_a_400_for_unknown_names_names_the_first_few_and_counts_the_rest() -> None:
    """A query of 250 long unknown names was echoed whole (50 KB of a client's bytes): now the first three,
    each cut to 80 characters, and how many more."""
    query = "&".join(f"name[]={index:04d}{'x' * 200}" for index in range(250))
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        status, body = _get(metrics, query)

    first = ", ".join(repr(f"{index:04d}{'x' * 76}") for index in range(3))
    assert (status, body) == (400, f"400 bad request: kvtop serves no metric named {first} and 247 more\n")


@pytest.mark.parametrize(("method", "status"), [("POST", 405), ("DELETE", 405), ("TRACE", 405), ("OPTIONS", 200)])
def test_a_method_metrics_does_not_take_is_405_and_allow_names_every_method_it_does(method: str, status: int) -> None:
    """`Allow: OPTIONS,GET` (prometheus_client's) left out HEAD, which /metrics answers."""
    with serving(ClusterModel(), contextlib.nullcontext(), "127.0.0.1:0") as metrics:
        head, body = _answer(metrics, f"{method} /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n".encode())

    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.0 {status} "), head
    assert "Allow: GET, HEAD, OPTIONS" in lines, head
    said = f"405 method not allowed: {method}; use GET, HEAD, OPTIONS\n"
    assert body == (b"" if method == "OPTIONS" else said.encode())
