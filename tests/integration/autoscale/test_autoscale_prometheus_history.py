"""The arrival-rate history an operator reads back after a restart, from a real Prometheus.

A runtime's metrics (``RuntimeMetrics``) are scraped every second while requests are counted at a steady
rate; ``PrometheusSignals.history`` then runs the default arrival-rate PromQL (``irate`` of the
responses plus ``deriv`` of the requests in flight) as a range query, as ``loop.Autoscaler`` does on its
first tick, and must give that rate back, one sample per step.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from kubeinfer.operator.autoscale.prometheus import PrometheusConfig, PrometheusSignals
from kubeinfer.operator.autoscale.signals import default_queries
from kubeinfer.runtime.metrics import RuntimeMetrics
from prometheus_client import start_http_server

from tests.support.prom import PrometheusServer

pytestmark = pytest.mark.timeout(120)

RATE = 40.0  # requests/s counted


def test_autoscale_history_of_the_arrival_rate(prometheus: PrometheusServer) -> None:
    metrics = RuntimeMetrics("m")
    metrics.inflight.set(3)  # requests in flight, steady: deriv() adds 0
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    stop = threading.Event()

    def count() -> None:
        while not stop.wait(1 / RATE):
            metrics.count_request(200, 0.01)

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    client = PrometheusSignals(PrometheusConfig(url=prometheus.url))
    try:
        target = f"127.0.0.1:{server.server_port}"
        prometheus.set_targets([(target, {"namespace": "t", "inferenceservice": "svc"})])
        prometheus.wait_for_scrape(target, timeout=60)
        started = dt.datetime.now(dt.UTC)
        time.sleep(12)
        queries = default_queries("t", "svc", "10s", arrival_window="3s")
        end = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        samples = client.history(queries.arrival_rate, started, end, 2.0)
        print(f"{len(samples)} samples: {[round(v, 1) for _, v in samples]}")
        assert len(samples) >= 4
        assert all(started.timestamp() - 1 <= ts <= end.timestamp() + 1 for ts, _ in samples)
        assert [ts for ts, _ in samples] == sorted(ts for ts, _ in samples)
        # a sleep-paced counter runs a little under RATE; irate over 1 s scrapes is noisy
        rates = sorted(v for _, v in samples)
        assert 0.5 * RATE <= rates[len(rates) // 2] <= 1.2 * RATE
        # another service's history is empty, not zeros
        other = default_queries("t", "absent", "10s", arrival_window="3s")
        assert client.history(other.arrival_rate, started, end, 2.0) == []
    finally:
        stop.set()
        counter.join(5)
        client.close()
        server.shutdown()
        thread.join(5)
