"""Prometheus export of the model: metrics read at scrape time, counters that only grow, a Grafana dashboard."""
