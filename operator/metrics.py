"""The operator's own Prometheus metrics (prometheus-client), served by :func:`serve`."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "kubeinfer_operator_reconciles_total",
    "InferenceService reconciles, by result (ok|retry|error|gone).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "kubeinfer_operator_reconcile_duration_seconds",
    "Duration of one InferenceService reconcile, seconds.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
RECONCILE_ERRORS = Counter(
    "kubeinfer_operator_reconcile_errors_total", "Failed reconciles, by kind (transient|permanent).", ["kind"]
)

API_WRITES = Counter(
    "kubeinfer_operator_api_writes_total",
    "Write requests sent by the operator's own client (not kopf's), by verb and resource.",
    ["verb", "resource"],
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread (no-op when ``port`` is 0)."""
    if port:
        start_http_server(port, addr=addr)
