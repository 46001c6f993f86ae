"""Signals: Prometheus answers → Observation, against a tiny local HTTP server with canned API JSON."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubeinfer.operator.autoscale import signals
from kubeinfer.operator.autoscale.prometheus import PrometheusConfig, PrometheusSignals
from kubeinfer.operator.autoscale.signals import default_queries
from kubeinfer.operator.settings import Settings

Answer = Callable[[str], tuple[int, Any]]


def vec(value: str | None) -> tuple[int, Any]:
    result = [] if value is None else [{"metric": {}, "value": [1700000000.0, value]}]
    return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


class FakeProm:
    """Answers /api/v1/query by matching substrings of the PromQL; records queries and headers."""

    def __init__(self) -> None:
        self.values: dict[str, str | None] = {
            "kubeinfer_requests_total": "12.5",
            "timestamp(": "3",
            "DCGM_FI_DEV_GPU_UTIL": None,
            "kubeinfer_device_utilization_ratio": "0.4",
            "histogram_quantile": "0.25",
            "sum(kubeinfer_queue_size": "7",
            "sum(kubeinfer_inflight_requests": "9",
        }
        self.status: int | None = None
        self.queries: list[str] = []
        self.headers: list[str | None] = []

    def answer(self, promql: str) -> tuple[int, Any]:
        if self.status is not None:
            return self.status, {"status": "error", "errorType": "bad_data", "error": "boom"}
        for key, value in self.values.items():
            if key in promql:
                return vec(value)
        return vec(None)


@pytest.fixture
def prom() -> Iterator[tuple[FakeProm, str]]:
    fake = FakeProm()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            q = parse_qs(urlparse(self.path).query)["query"][0]
            fake.queries.append(q)
            fake.headers.append(self.headers.get("Authorization"))
            status, body = fake.answer(q)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


QUERIES = default_queries("ns1", "svc", "60s")


def read(url: str, **kw: Any) -> signals.Reading:
    client = PrometheusSignals(PrometheusConfig(url=url, **kw))
    try:
        return client.read(QUERIES, 60.0)
    finally:
        client.close()


def test_autoscale_signals_default_queries_select_the_service() -> None:
    assert QUERIES.p99 == (
        "histogram_quantile(0.99, sum by (le) (rate(kubeinfer_request_duration_seconds_bucket"
        '{namespace="ns1",inferenceservice="svc"}[60s])))'
    )
    assert (
        QUERIES.gpu_utilization[0]
        == 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ns1",inferenceservice="svc"}) / 100'
    )
    assert (
        QUERIES.request_rate
        == 'sum(rate(kubeinfer_requests_total{namespace="ns1",inferenceservice="svc"}[60s]))'
    )
    over = default_queries(
        "ns1", "svc", "30s", {"p99": 'my_p99{ns="{namespace}",n="{name}"}[{window}]', "queue_size": ""}
    )
    assert over.p99 == 'my_p99{ns="ns1",n="svc"}[30s]'
    assert over.queue_size == QUERIES.queue_size
    assert QUERIES.inflight == 'sum(kubeinfer_inflight_requests{namespace="ns1",inferenceservice="svc"})'


def test_autoscale_signals_known_reading(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    r = read(url)
    assert r.condition_reason is None
    o = r.observation
    assert (
        o.p99_seconds,
        o.gpu_utilization,
        o.request_rate,
        o.queue_size,
        o.sample_age_seconds,
        o.inflight_requests,
    ) == (0.25, 0.4, 12.5, 7.0, 3.0, 9.0)
    # DCGM tried first, the runtime gauge as fallback
    assert any("DCGM_FI_DEV_GPU_UTIL" in q for q in fake.queries)


def test_autoscale_signals_dcgm_preferred_and_scaled(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.values["DCGM_FI_DEV_GPU_UTIL"] = "0.91"  # the fake ignores the "/ 100": it returns the query's value
    assert read(url).observation.gpu_utilization == 0.91
    assert not any("kubeinfer_device_utilization_ratio" in q for q in fake.queries)


@pytest.mark.parametrize(
    ("key", "value", "reason", "words"),
    [
        ("kubeinfer_requests_total", None, "MetricsMissing", "no request-rate data"),
        ("histogram_quantile", None, "MetricsMissing", "no request-duration data"),
        ("kubeinfer_device_utilization_ratio", None, "MetricsMissing", "no GPU utilization"),
        ("histogram_quantile", "NaN", "InvalidMetrics", "P99 latency is nan"),
        ("histogram_quantile", "+Inf", "InvalidMetrics", "P99 latency is inf"),
        ("kubeinfer_device_utilization_ratio", "NaN", "InvalidMetrics", "GPU utilization is nan"),
        ("timestamp(", "300", "StaleMetrics", "newest sample 300 s old"),
        ("timestamp(", None, "MetricsMissing", "no runtime samples"),
    ],
)
def test_autoscale_signals_unknown_never_zero(
    prom: tuple[FakeProm, str], key: str, value: str | None, reason: str, words: str
) -> None:
    fake, url = prom
    fake.values[key] = value
    r = read(url)
    assert r.condition_reason == reason
    assert r.observation.unknown_reason is not None and words in r.observation.unknown_reason
    assert r.observation.p99_seconds is None and r.observation.gpu_utilization is None


def test_autoscale_signals_idle_service_is_known(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.values["kubeinfer_requests_total"] = "0"
    fake.values["histogram_quantile"] = "NaN"
    fake.values["sum(kubeinfer_queue_size"] = "0"  # idle: nothing queued (a queue with rate 0 is stuck)
    r = read(url)
    assert r.condition_reason is None and r.observation.idle
    assert r.observation.request_rate == 0.0 and r.observation.p99_seconds is None


def test_autoscale_signals_missing_queue_is_optional(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.values["sum(kubeinfer_queue_size"] = None
    r = read(url)
    assert r.condition_reason is None and r.observation.queue_size is None


@pytest.mark.parametrize("value", [None, "NaN", "-1"])
def test_autoscale_signals_bad_inflight_is_unknown_not_zero(
    prom: tuple[FakeProm, str], value: str | None
) -> None:
    fake, url = prom
    fake.values["sum(kubeinfer_inflight_requests"] = value
    r = read(url)
    assert r.condition_reason is None and r.observation.inflight_requests is None


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "QueryError"),
        (422, "QueryError"),
        (429, "PrometheusUnavailable"),
        (500, "PrometheusUnavailable"),
    ],
)
def test_autoscale_signals_http_errors(prom: tuple[FakeProm, str], status: int, reason: str) -> None:
    fake, url = prom
    fake.status = status
    r = read(url)
    assert r.condition_reason == reason and r.observation.unknown_reason


def test_autoscale_signals_capacity_inputs(prom: tuple[FakeProm, str]) -> None:
    # Without the runtime's s(b) gauges the capacity inputs are None (the rule is off), never 0.
    fake, url = prom
    o = read(url).observation
    assert (o.service_time_a_seconds, o.service_time_c_seconds, o.max_batch_size) == (None, None, None)
    assert o.instance_concurrency is None
    assert QUERIES.instance_concurrency == (
        'avg(kubeinfer_instance_concurrency{namespace="ns1",inferenceservice="svc"})'
    )
    assert QUERIES.arrival_rate.startswith("sum(irate(kubeinfer_requests_total{")
    assert "deriv(kubeinfer_inflight_requests{" in QUERIES.arrival_rate
    # a pod with no fit yet exports NaN: the comparison drops it rather than averaging NaN in
    assert QUERIES.service_time_c.endswith("} > 0)") and QUERIES.service_time_a.endswith("} >= 0)")
    fake.values = {
        "deriv(": "14.0",  # the fake answers the whole arrival-rate query with this value
        "kubeinfer_service_time_intercept_seconds": "0.004",
        "kubeinfer_service_time_slope_seconds": "0.00075",
        "kubeinfer_max_batch_size": "32",
        "kubeinfer_instance_concurrency": "1.8",
        **fake.values,
    }
    o = read(url).observation
    assert (o.arrival_rate, o.service_time_a_seconds, o.service_time_c_seconds, o.max_batch_size) == (
        14.0,
        0.004,
        0.00075,
        32.0,
    )
    assert o.instance_concurrency == 1.8
    fake.values["kubeinfer_service_time_slope_seconds"] = "0"  # a slope of 0 is not a model
    assert read(url).observation.service_time_c_seconds is None


def test_autoscale_signals_http_status_comes_from_the_response(prom: tuple[FakeProm, str]) -> None:
    # The status is the one the HTTP answer carried, not a search of the exception's text.
    fake, url = prom
    fake.status = 400
    r = read(url)
    assert r.condition_reason == "QueryError" and "HTTP 400" in (r.observation.unknown_reason or "")


def test_autoscale_signals_stale_limit_is_the_callers(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.values["timestamp("] = "90"
    client = PrometheusSignals(PrometheusConfig(url=url))
    try:
        assert client.read(QUERIES, 120.0).condition_reason is None
        assert client.read(QUERIES, 60.0).condition_reason == "StaleMetrics"
    finally:
        client.close()


def test_autoscale_signals_prometheus_down() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = read(f"http://127.0.0.1:{port}", timeout_seconds=2.0)
    assert r.condition_reason == "PrometheusUnavailable"
    assert "Prometheus unavailable" in (r.observation.unknown_reason or "")


def test_autoscale_signals_bearer_token(prom: tuple[FakeProm, str], tmp_path: Path) -> None:
    fake, url = prom
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    read(url, bearer_token_file=str(token))
    assert fake.headers and all(h == "Bearer s3cret" for h in fake.headers)


def test_autoscale_signals_config_from_settings() -> None:
    s = Settings.from_env(
        {
            "KUBEINFER_PROMETHEUS_URL": "https://prom:9090/",
            "KUBEINFER_PROMETHEUS_BEARER_TOKEN_FILE": "/var/run/token",
            "KUBEINFER_PROMETHEUS_TIMEOUT_SECONDS": "2.5",
        }
    )
    cfg = PrometheusConfig.from_settings(s)
    assert cfg.url == "https://prom:9090" and cfg.bearer_token_file == "/var/run/token"
    assert cfg.ca_file is None and cfg.insecure_skip_verify is False
    assert cfg.timeout_seconds == 2.5  # the setting reaches the client (it was read by a name no field had)
    assert PrometheusConfig.from_settings(Settings.from_env({})).timeout_seconds == 5.0
    with pytest.raises(ValueError, match="prometheus_url"):
        PrometheusConfig.from_settings(Settings.from_env({"KUBEINFER_PROMETHEUS_URL": ""}))
    assert not math.isnan(cfg.timeout_seconds)


def test_autoscale_signals_parse_history() -> None:
    matrix = [
        {"metric": {}, "values": [[100, "5"], [115, "NaN"], [130, "-1"], [145, "+Inf"], [160.5, "7.5"]]}
    ]
    # NaN, negative and infinite samples are left out, never read as zero
    assert signals.parse_history(matrix, "history") == [(100.0, 5.0), (160.5, 7.5)]
    assert signals.parse_history([], "history") == []
    with pytest.raises(signals.SignalError, match="history: query returned 2 series"):
        signals.parse_history(matrix * 2, "history")
    with pytest.raises(signals.SignalError, match="history: unexpected result"):
        signals.parse_history([{"metric": {}, "value": [1, "2"]}], "history")


def _series(name: str, value: object, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": f"kubeinfer_quantization_{name}", **labels}, "value": [1.0, str(value)]}


def test_autoscale_signals_quantization_is_the_worst_pods_and_only_when_measured() -> None:
    assert 'namespace="a\\"b"' in signals.quantization_query('a"b', "n")  # label values escaped
    pods = [
        _series("label_agreement_ratio", 0.97, pod="a"),
        _series("label_agreement_ratio", 0.91, pod="b"),
        _series("label_agreement_ratio", "NaN", pod="c"),
        _series("label_agreement_ratio", "oops", pod="d"),
        _series("compared_texts", 349, pod="a", measured_on="held-out sentences"),
        _series("compared_texts", 349, pod="b", measured_on="held-out sentences"),
    ]
    reading = signals.parse_quantization(pods)
    assert reading is not None
    assert (dict(reading.figures), reading.measured_on, reading.texts) == (
        {"labelAgreement": 0.91},
        "held-out sentences",
        349,
    )
    # figures without a count: measured by nobody (quantization none: 1 by definition)
    assert signals.parse_quantization(pods[:2]) is None
    assert signals.parse_quantization([]) is None
