"""Request-duration buckets: Prometheus' histogram_quantile(0.99) within 10 % of the exact P99 1ms-10s."""

from __future__ import annotations

import itertools
import math
import sys
import types

import numpy as np
import pytest
from kubeinfer.runtime.metrics import (
    DURATION_BUCKET_RATIO,
    DURATION_BUCKETS,
    BusyTracker,
    RuntimeMetrics,
    merge_expositions,
)
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def histogram_quantile(q: float, bounds: list[float], cumulative: list[float]) -> float:
    """Prometheus' classic-histogram quantile (promql/quantile.go, bucketQuantile): find the bucket whose
    cumulative count reaches rank = q * count, interpolate linearly between its lower and upper bound
    (lower bound 0 for the first bucket); in the +Inf bucket answer the last finite bound."""
    total = cumulative[-1]
    rank = q * total
    b = next(i for i, c in enumerate(cumulative) if c >= rank)
    if math.isinf(bounds[b]):
        return bounds[-2]
    start = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else cumulative[b - 1]
    count = cumulative[b] - below
    return start + (bounds[b] - start) * (rank - below) / count


def p99_via_metric(samples: np.ndarray) -> float:
    metrics = RuntimeMetrics("m")
    for s in samples:
        metrics.request_duration.observe(float(s))
    bounds: list[float] = []
    cumulative: list[float] = []
    for family in metrics.registry.collect():
        if family.name == "kubeinfer_request_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bounds.append(float(sample.labels["le"]))
                    cumulative.append(sample.value)
    return histogram_quantile(0.99, bounds, cumulative)


def test_buckets_are_geometric_over_the_range() -> None:
    finite = [b for b in DURATION_BUCKETS if b >= 0.001]
    assert finite[0] == 0.001 and finite[-1] >= 10.0
    ratios = [b / a for a, b in itertools.pairwise(finite)]
    assert max(ratios) <= DURATION_BUCKET_RATIO + 1e-4 and DURATION_BUCKET_RATIO - 1 < 0.1


@pytest.mark.parametrize("seed", range(6))
def test_p99_error_under_10_percent_on_synthetic_latencies(seed: int) -> None:
    rng = np.random.default_rng(seed)
    worst = 0.0
    for median in np.geomspace(0.0008, 5.0, 12):
        for sigma in (0.05, 0.3, 1.0):
            samples = rng.lognormal(math.log(median), sigma, 2000)
            exact = float(np.quantile(samples, 0.99))
            if not 0.001 <= exact <= 10.0:
                continue
            err = abs(p99_via_metric(samples) - exact) / exact
            worst = max(worst, err)
            assert err < 0.10, (median, sigma, exact, err)
    # adversarial: every sample at one value anywhere in the range (the interpolation's worst case)
    for value in rng.uniform(math.log(0.001), math.log(10.0), 20):
        samples = np.full(200, math.exp(value))
        exact = float(samples[0])
        err = abs(p99_via_metric(samples) - exact) / exact
        worst = max(worst, err)
        assert err < 0.10, (exact, err)
    assert worst > 0  # the check measured something


def test_busy_tracker_ratio_over_window() -> None:
    now = [0.0]
    t = BusyTracker(executors=2, window=10.0, clock=lambda: now[0])
    now[0] = 10.0
    tok = t.begin()
    now[0] = 15.0
    t.end(tok)  # one of two executors busy 5 s of the last 10 s
    assert t.ratio() == pytest.approx(0.25)
    now[0] = 30.0
    assert t.ratio() == 0.0
    for _ in range(1000):  # never scraped: the record stays bounded by the window
        now[0] += 1.0
        t.end(t.begin())
    assert len(t._done) <= 11


def test_instance_concurrency_is_the_mean_of_executors_busy_while_any_is() -> None:
    now = [0.0]
    t = BusyTracker(executors=2, window=10.0, clock=lambda: now[0])
    assert t.concurrency() == 1.0  # nothing ran: one instance's worth
    a = t.begin()
    now[0] = 2.0
    b = t.begin()  # 2 s alone, then 2 s together, then 2 s of b alone: 8 busy s over 6 s with any busy
    now[0] = 4.0
    t.end(a)
    now[0] = 6.0
    t.end(b)
    assert t.concurrency() == pytest.approx(8 / 6)
    now[0] = 7.0
    c, d = t.begin(), t.begin()  # both running now, 1 s so far: counted while they run
    now[0] = 8.0
    assert t.concurrency() == pytest.approx(10 / 7)
    t.end(c)
    t.end(d)
    now[0] = 30.0  # out of the window
    assert t.concurrency() == 1.0
    one = BusyTracker(executors=1, window=10.0, clock=lambda: now[0])
    for _ in range(3):  # one executor, back to back: exactly 1
        token = one.begin()
        now[0] += 1.5
        one.end(token)
    assert one.concurrency() == 1.0


def test_instance_concurrency_is_exported() -> None:
    metrics = RuntimeMetrics("m", executors=2)
    text = generate_latest(metrics.registry).decode()
    assert 'kubeinfer_instance_concurrency{model="m"} 1.0' in text


def test_cuda_device_uses_nvml_and_torch_reserved_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    fake_nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=37, memory=5),
    )
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory_reserved=lambda i: 2.5e9 + i))
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    metrics = RuntimeMetrics("m")
    metrics.use_device("cuda:1")
    text = metrics.exposition().decode()
    assert calls == [1]
    assert 'kubeinfer_device_utilization_ratio{model="m"} 0.37' in text
    assert 'kubeinfer_accelerator_memory_bytes{model="m"} 2.500000001e+09' in text
    cpu = RuntimeMetrics("c")
    cpu.use_device("cpu")  # CPU: busy-time ratio, no accelerator memory series
    assert "kubeinfer_accelerator_memory_bytes{" not in cpu.exposition().decode()


def test_the_success_count_is_exported_at_zero_before_any_request() -> None:
    """The autoscaler reads ``sum(rate(kubeinfer_requests_total[w]))``: a replica that has answered nothing
    must show 0 (idle: scale to zero may take it), not no series (MetricsMissing, forever)."""
    text = generate_latest(RuntimeMetrics("m").registry).decode()
    assert 'kubeinfer_requests_total{code="200",model="m"} 0.0' in text


def test_merged_exposition_writes_each_family_once_with_every_models_series() -> None:
    # the model repository mode's /metrics: the repository's series and each model process's
    a, b = RuntimeMetrics("a"), RuntimeMetrics("b")
    a.count_request(200, 0.01)
    b.count_request(200, 0.02)
    b.count_request(500, 0.3)
    repository = CollectorRegistry()
    Gauge("kubeinfer_repository_resident_bytes", "bytes", registry=repository).set(5)
    texts = [generate_latest(repository), generate_latest(a.registry), generate_latest(b.registry)]
    merged = merge_expositions(texts).decode()
    assert merged.count("# TYPE kubeinfer_request_duration_seconds histogram") == 1
    assert merged.count("# TYPE kubeinfer_requests_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    requests = {
        (s.labels["model"], s.labels["code"]): s.value
        for s in families["kubeinfer_requests"].samples
        if s.name == "kubeinfer_requests_total"
    }
    assert requests == {("a", "200"): 1.0, ("b", "200"): 1.0, ("b", "500"): 1.0}
    counts = {
        s.labels["model"]: s.value
        for s in families["kubeinfer_request_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"a": 1.0, "b": 2.0}
    assert families["kubeinfer_repository_resident_bytes"].samples[0].value == 5.0
    # one process's exposition is written back as it was
    assert merge_expositions([generate_latest(a.registry)]) == generate_latest(a.registry)
