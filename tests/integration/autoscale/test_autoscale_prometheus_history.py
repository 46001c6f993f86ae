"""The arrival-rate history an operator reads back after a restart, from a real Prometheus.

A runtime's metrics (``RuntimeMetrics``) are scraped every second while requests are counted at a steady
rate; ``PrometheusSignals.history`` then runs the default arrival-rate PromQL (``irate`` of the
responses plus ``deriv`` of the requests in flight) as a range query, as ``loop.Autoscaler`` does on its
first tick, and must give that rate back, one sample per step. The second test drops the rate suddenly
and checks that the history read back carries what the policy holds for a level the traffic left
(``headroom.left_level``): the decision of an operator restarted after the drop keeps the replicas of
the level, where one that relearns from nothing follows the traffic down. The third writes a past with
recurring bursts into the TSDB (``PrometheusServer.backfill``, as the end-to-end burst-headroom test
does) and checks that it reads back exactly and gives the burst headroom's count. A ModelPool's
signals (``signals.pool_queries``) are read from two pool replicas, each serving the merged ``/metrics``
of two model processes (``metrics.merge_expositions``, as the runtime's model repository mode does):
summed over the pool's pods and models, and no InferenceService's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubeinfer.operator.autoscale.policy import Current, Observation, Policy, State, decide, restore_arrivals
from kubeinfer.operator.autoscale.prometheus import PrometheusConfig, PrometheusSignals
from kubeinfer.operator.autoscale.signals import default_queries, pool_queries
from kubeinfer.runtime.metrics import RuntimeMetrics, merge_expositions
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hack.devtools.prom import PrometheusError, PrometheusServer, Series

pytestmark = pytest.mark.timeout(120)

RATE = 40.0  # requests/s counted


@dataclass
class _Counted:
    """A runtime's metrics scraped by the test Prometheus while a thread counts requests at ``rate[0]``
    per second (change it to change the rate), and a client of that Prometheus."""

    client: PrometheusSignals
    rate: list[float]


@contextlib.contextmanager
def _counted(prometheus: PrometheusServer, service: str, rate: float, inflight: int) -> Iterator[_Counted]:
    """Serve a ``RuntimeMetrics`` for ``t/<service>``, count requests at ``rate``/s, wait for its first
    scrape; stop and close everything on exit."""
    metrics = RuntimeMetrics("m")
    metrics.inflight.set(inflight)  # requests in flight, steady: deriv() adds 0
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    stop = threading.Event()
    counted = _Counted(PrometheusSignals(PrometheusConfig(url=prometheus.url)), [rate])

    def count() -> None:
        while not stop.wait(1 / counted.rate[0]):
            metrics.count_request(200, 0.01)

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        target = f"127.0.0.1:{server.server_port}"
        prometheus.set_targets([(target, {"namespace": "t", "inferenceservice": service})])
        prometheus.wait_for_scrape(target, timeout=60)
        yield counted
    finally:
        stop.set()
        counter.join(5)
        counted.client.close()
        server.shutdown()
        thread.join(5)


def test_autoscale_history_of_the_arrival_rate(prometheus: PrometheusServer) -> None:
    with _counted(prometheus, "svc", RATE, inflight=3) as counted:
        client = counted.client
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


HIGH, LOW = 60.0, 5.0  # requests/s before and after the drop


def test_autoscale_history_carries_a_level_left_suddenly(prometheus: PrometheusServer) -> None:
    # A reaction time of 4 s (the lead): a level stands 8 s, a drop counts within 4 s after it.
    policy = Policy(target_p99_seconds=1.0, burst_lead_seconds=4.0, burst_memory_seconds=300.0)
    with _counted(prometheus, "drop", HIGH, inflight=2) as counted:
        started = dt.datetime.now(dt.UTC)
        time.sleep(20)
        counted.rate[0] = LOW  # the traffic leaves: x12 at once, as in a failover
        time.sleep(12)
        queries = default_queries("t", "drop", "10s", arrival_window="3s")
        wall = dt.datetime.now(dt.UTC)
        samples = counted.client.history(queries.arrival_rate, started, wall - dt.timedelta(seconds=1), 1.0)
        print(f"{len(samples)} samples: {[round(v) for _, v in samples]}")
        assert len(samples) >= 25
        now = 1000.0  # the policy's clock; the samples' ages come from the wall clock
        state = restore_arrivals(
            State(), [(wall.timestamp() - ts, v) for ts, v in samples], now=now, policy=policy
        )
        assert len(state.arrivals) == len(samples)
        # s(b) = 40 ms + 20 ms*b, B = 4: one replica serves 4 / 0.12 s = 33/s at full batches
        obs = Observation(
            p99_seconds=0.2,
            gpu_utilization=0.3,
            request_rate=LOW,
            queue_size=0.0,
            inflight_requests=2.0,
            sample_age_seconds=1.0,
            arrival_rate=LOW,
            service_time_a_seconds=0.04,
            service_time_c_seconds=0.02,
            max_batch_size=4,
        )
        capacity = 4 / (0.04 + 0.02 * 4)
        assert math.ceil(LOW / (0.85 * capacity)) == 1  # the traffic now needs one replica
        current = Current(replicas=2, max_queue_delay_seconds=0.005, ready_replicas=2)
        restored = decide(obs, current, policy, state, now)
        print(restored.reason)
        assert "the traffic left suddenly" in restored.reason
        held = float(restored.reason.split("held for the ")[1].split("/s")[0])
        assert 0.5 * HIGH <= held <= 1.2 * HIGH
        # the level's replicas at a replica's full capacity: kept (2), or added when it needs more
        assert restored.replicas == max(2, math.ceil(held / capacity))
        # without the history read back, nothing is held: the count follows the traffic (after the
        # stabilization window, which a fresh state starts now)
        fresh = decide(obs, current, policy, State(), now)
        assert "left suddenly" not in fresh.reason
        assert fresh.state.recommendations[-1][1] == 1


PAST_RATE, PAST_BURST = 66.0, 1.8  # requests/s, and its bursts' factor


def _bursty_past(service: str, end: float) -> list[Series]:
    """15 minutes up to ``end`` (Unix seconds) at ``PAST_RATE`` with x``PAST_BURST`` bursts of 20 s every
    3 minutes (farther apart than two reaction times, or they would read as a level), 1 s samples, as a
    runtime's request counter and in-flight gauge."""
    labels = {"namespace": "t", "inferenceservice": service, "pod": "gone"}
    counter, inflight, total = [], [], 0.0
    for t in range(int(end) - 900, int(end) + 1):
        total += PAST_RATE * (PAST_BURST if (t - int(end)) % 180 < 20 and t < end - 90 else 1.0)
        counter.append((float(t), total))
        inflight.append((float(t), 0.0))
    return [
        Series("kubeinfer_requests_total", labels, counter),
        Series("kubeinfer_inflight_requests", labels, inflight),
    ]


def test_autoscale_history_backfilled_with_bursts_gives_the_burst_headroom(
    prometheus: PrometheusServer,
) -> None:
    # A past the server did not scrape, written as blocks (promtool) and loaded by a restart, is what
    # the history query reads back; an operator restarted onto it keeps the headroom its bursts need.
    prometheus.backfill(_bursty_past("past", time.time() - 5))
    client = PrometheusSignals(PrometheusConfig(url=prometheus.url))
    try:
        wall = dt.datetime.now(dt.UTC)
        queries = default_queries("t", "past", "10s", arrival_window="10s")
        samples = client.history(queries.arrival_rate, wall - dt.timedelta(seconds=900), wall, 5.0)
    finally:
        client.close()
    rates = sorted(v for _, v in samples)
    print(f"{len(samples)} samples: median {rates[len(rates) // 2]:.1f}/s, max {rates[-1]:.1f}/s")
    assert len(samples) >= 170
    assert rates[len(rates) // 2] == pytest.approx(PAST_RATE, rel=1e-6)
    assert rates[-1] == pytest.approx(PAST_BURST * PAST_RATE, rel=1e-6)
    policy = Policy(target_p99_seconds=1.0)
    now = 5000.0
    state = restore_arrivals(
        State(), [(wall.timestamp() - ts, v) for ts, v in samples], now=now, policy=policy
    )
    # s(b) = 40 ms + 20 ms*b, B = 4: a replica serves 33.3/s at the SLO; the rate is two replicas' worth.
    obs = Observation(
        p99_seconds=0.3,
        gpu_utilization=0.6,
        request_rate=PAST_RATE,
        queue_size=0.0,
        inflight_requests=0.0,
        sample_age_seconds=1.0,
        arrival_rate=PAST_RATE,
        service_time_a_seconds=0.04,
        service_time_c_seconds=0.02,
        max_batch_size=4,
    )
    current = Current(replicas=3, max_queue_delay_seconds=0.005, ready_replicas=3)
    restored = decide(obs, current, policy, state, now)
    print(restored.reason)
    assert "burst headroom x1.80 learned from" in restored.reason
    assert restored.replicas == math.ceil(PAST_BURST * PAST_RATE / (4 / 0.12)) == 4
    assert decide(obs, current, policy, State(), now).replicas == 3  # nothing learned: the rule's 3


def test_a_backfill_promtool_refuses_is_an_error_and_the_server_runs_again(
    prometheus: PrometheusServer,
) -> None:
    with pytest.raises(PrometheusError, match="promtool refused the backfill"):
        prometheus.backfill([Series("m", {"0bad": "label name"}, [(time.time() - 60, 1.0)])])
    assert prometheus.running
    assert prometheus.query("vector(1)")[0]["value"][1] == "1"


class _PoolReplica:
    """A pool replica's ``/metrics``: the merged exposition of its model processes' metrics."""

    def __init__(self, models: list[RuntimeMetrics]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        merged = merge_expositions(generate_latest(m.registry) for m in self.models)
        return iter(text_string_to_metric_families(merged.decode()))


def test_autoscale_pool_signals_sum_the_pools_pods_and_models(prometheus: PrometheusServer) -> None:
    # two replicas of the pool "small"; replica 0 serves models a and b, replica 1 model a
    replicas = [[RuntimeMetrics("a"), RuntimeMetrics("b")], [RuntimeMetrics("a")]]
    rates = [(20.0, 0.01), (10.0, 0.05), (10.0, 0.01)]  # requests/s and seconds, per model process
    processes = [m for models in replicas for m in models]
    for m in processes:
        m.inflight.set(1)
    stop = threading.Event()

    def count(metrics: RuntimeMetrics, rate: float, seconds: float) -> None:
        while not stop.wait(1 / rate):
            metrics.count_request(200, seconds)

    counters = [
        threading.Thread(target=count, args=(m, r, d), daemon=True)
        for m, (r, d) in zip(processes, rates, strict=True)
    ]
    servers = []
    for models in replicas:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PoolReplica(models))  # type: ignore[arg-type]
        servers.append(start_http_server(0, addr="127.0.0.1", registry=registry))
    client = PrometheusSignals(PrometheusConfig(url=prometheus.url))
    try:
        for t in counters:
            t.start()
        targets = [f"127.0.0.1:{server.server_port}" for server, _ in servers]
        prometheus.set_targets(
            [(t, {"namespace": "t", "pool": "small", "pod": f"small-{i}"}) for i, t in enumerate(targets)]
        )
        for t in targets:
            prometheus.wait_for_scrape(t, timeout=60)
        time.sleep(8)
        reading = client.read(pool_queries("t", "small", "6s", arrival_window="3s"), 30.0)
        obs = reading.observation
        print(obs)
        assert reading.condition_reason is None, obs.unknown_reason
        # the pool's rate is every model's on every replica (40/s; sleep-paced counters run a little under)
        assert obs.request_rate is not None and 0.6 * 40 <= obs.request_rate <= 1.2 * 40
        assert obs.inflight_requests == 3.0
        # the P99 of all the pool's requests: a quarter take 50 ms, so the 99th percentile is in their bucket
        assert obs.p99_seconds is not None and 0.03 < obs.p99_seconds <= 0.08
        assert obs.service_time_a_seconds is None and obs.max_batch_size is None  # no s(b) of a pool
        # an InferenceService of the pool's name selects none of the pool's series
        missing = client.read(default_queries("t", "small", "6s"), 30.0)
        assert missing.condition_reason == "MetricsMissing"
    finally:
        stop.set()
        for t in counters:
            t.join(5)
        client.close()
        for server, thread in servers:
            server.shutdown()
            thread.join(5)
