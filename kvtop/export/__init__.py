"""Prometheus export of the model: metrics read at scrape time, counters that only grow, a Grafana dashboard."""

from pathlib import Path

GRAFANA_DASHBOARD = Path(__file__).parent / "grafana" / "kvtop.json"
"""A Grafana dashboard on the exported metrics (import it, pick the Prometheus data source)."""
