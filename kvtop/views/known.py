"""The server metrics every sidecar view lists (DOMAIN.md, "Metrics operators already graph")."""

KNOWN_METRICS = (
    "sglang:num_transfer_failed_reqs_total",
    "sglang:num_bootstrap_failed_reqs_total",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:kv_transfer_latency_ms_sum",
    "sglang:kv_transfer_latency_ms_count",
    "sglang:kv_transfer_speed_gb_s",
    "sglang:kv_transfer_total_mb",
    "sglang:kv_transfer_bootstrap_ms",
)
"""Listed for every sidecar that scrapes metrics, each with its value or `NO_DATA`."""
NO_DATA = "no data"
"""A metric the server never reported, or that never moved (many SGLang servers' read zero forever)."""
