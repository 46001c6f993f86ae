"""A real Prometheus scrapes the runtime's request-duration histogram: ``histogram_quantile(0.99, ...)``
is within 10 % of the exact P99 of the same synthetic samples, for latencies across 1 ms - 10 s."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from kubeinfer.runtime.metrics import RuntimeMetrics
from prometheus_client import CollectorRegistry, start_http_server

from hack.devtools.prom import PrometheusServer

pytestmark = pytest.mark.timeout(120)


def test_prometheus_p99_within_10_percent(prometheus: PrometheusServer) -> None:
    rng = np.random.default_rng(7)
    cases = {
        "ln-2ms": rng.lognormal(math.log(0.002), 0.4, 5000),
        "ln-40ms": rng.lognormal(math.log(0.04), 0.8, 5000),
        "ln-700ms": rng.lognormal(math.log(0.7), 0.3, 5000),
        "ln-4s": rng.lognormal(math.log(4.0), 0.2, 5000),
        "bimodal": np.concatenate([rng.normal(0.012, 0.001, 4900), rng.normal(0.25, 0.02, 100)]),
        "point-1.37s": np.full(500, 1.37),
    }
    exact: dict[str, float] = {}
    combined = CollectorRegistry()
    for name, samples in cases.items():
        metrics = RuntimeMetrics(name)
        for s in samples:
            metrics.request_duration.observe(float(s))
        combined.register(metrics.registry)  # a registry is a collector
        exact[name] = float(np.quantile(samples, 0.99))
        assert 0.001 <= exact[name] <= 10.0
    server, thread = start_http_server(0, addr="127.0.0.1", registry=combined)
    try:
        target = f"127.0.0.1:{server.server_port}"
        prometheus.set_targets([(target, {"namespace": "t", "inferenceservice": "q"})])
        prometheus.wait_for_scrape(target, timeout=60)
        time.sleep(0.1)
        result = prometheus.query(
            "histogram_quantile(0.99, sum by (model, le) (kubeinfer_request_duration_seconds_bucket))"
        )
        got = {r["metric"]["model"]: float(r["value"][1]) for r in result}
        assert set(got) == set(cases)
        for name, p99 in exact.items():
            err = abs(got[name] - p99) / p99
            print(f"{name}: exact P99 {p99:.4f} s, Prometheus {got[name]:.4f} s, error {err:.1%}")
            assert err < 0.10, (name, p99, got[name], err)
    finally:
        server.shutdown()
        thread.join(5)
