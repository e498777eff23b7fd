"""The server's Prometheus metrics, scraped into the sidecar's heartbeat (SGLang's `--enable-metrics`).

Parsed with `prometheus_client`'s exposition-format parser, never a regex. Kept:
the KV transfer metrics operators graph (DOMAIN.md, "Metrics operators already
graph"): `sglang:num_transfer_failed_reqs_total`, `sglang:num_bootstrap_failed_reqs_total`,
the queue gauges, and the `kv_transfer_*` histograms (their `_sum` and `_count`)
or gauges of older versions; each summed over its label sets (TP, DP ranks).

Many users see these read zero forever (SGLang #16832, #21167): a metric that
is absent, or that never moved (zero, and unchanged since the first scrape), is
left out of `LogFollowed.metrics`, and views show it as "no data", not 0.
"""

from __future__ import annotations

import logging
import math
import threading
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from transport.service import ServiceThread

_KEPT = ("num_transfer_failed_reqs", "num_bootstrap_failed_reqs", "queue_reqs", "kv_transfer_")
_SKIPPED = ("_bucket", "_created")
MAX_BYTES = 16 << 20
"""A metrics page larger than this is refused (a server's is a few hundred KiB)."""
_log = logging.getLogger(__name__)


def kv_metrics(text: str) -> dict[str, float]:
    """The KV transfer metrics of an exposition text, each summed over its label sets (non-finite ones left
    out). Raises ValueError for text that is not the exposition format."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith("sglang:") or name.endswith(_SKIPPED) or not any(k in name for k in _KEPT):
                continue
            if math.isfinite(sample.value):
                found[name] = found.get(name, 0.0) + float(sample.value)
    return found


class MetricsScraper(ServiceThread):
    """Scrapes `url` every `interval_s` in its own thread; `moved()` and `error` as the heartbeat wants them."""

    def __init__(self, url: str, interval_s: float = 5.0, timeout_s: float = 2.0) -> None:
        super().__init__("kvtop-metrics")
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.error = ""
        """What went wrong at the last scrape ("" before the first: not yet asked is no sign the server is down; a
        sidecar started beside a busy server said `down` until its first scrape came back)."""
        self._first: dict[str, float] = {}
        self._latest: dict[str, float] = {}
        self._moved: set[str] = set()
        self._lock = threading.Lock()

    def moved(self) -> dict[str, float]:
        """The metrics that were non-zero once or changed since the first scrape, at their latest value."""
        with self._lock:
            return {name: value for name, value in self._latest.items() if name in self._moved}

    def scrape(self) -> None:
        """One scrape; what went wrong is kept in `error` ("" when the server answered)."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as reply:
                body = reply.read(MAX_BYTES + 1)
            if len(body) > MAX_BYTES:
                raise ValueError(f"a metrics page over {MAX_BYTES >> 20} MiB")
            found = kv_metrics(body.decode("utf-8", errors="replace"))
        except (OSError, ValueError, urllib.error.URLError) as error:
            self.error = f"{self.url} unanswered: {getattr(error, 'reason', error)}"[:300]
            return
        with self._lock:
            for name, value in found.items():
                first = self._first.setdefault(name, value)
                if value != 0.0 or value != first:
                    self._moved.add(name)
            self._latest = found
        self.error = ""

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.scrape()
            self._stop.wait(self.interval_s)

    def _died(self, error: Exception) -> None:
        """Never silent: the traceback to stderr, and the heartbeat says the scraper stopped."""
        _log.exception("the metrics scraper died")
        self.error = "the metrics scraper died (see the sidecar's stderr)"
