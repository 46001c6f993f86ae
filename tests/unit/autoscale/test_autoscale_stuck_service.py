"""Autoscaler signals a production service can produce that must not be read as "idle"."""

from __future__ import annotations

from kubeinfer.operator.autoscale.policy import Current, Observation, State
from kubeinfer.operator.autoscale.policy import decide as decide_
from kubeinfer.operator.autoscale.signals import Queries, read_signals

from tests.unit.autoscale.test_autoscale_policy import POLICY

SETTLED = State(first_seen=-1000.0)


def test_zero_rate_with_a_queue_is_a_stuck_service_and_holds() -> None:
    # no request completed over the window (rate 0, P99 NaN) but 40 are queued: a wedged executor, not an
    # idle service. Read as idle it scaled down to min replicas and stretched the max queue delay.
    stuck = Observation(p99_seconds=None, gpu_utilization=0.0, request_rate=0.0, queue_size=40.0)
    d = decide_(stuck, Current(3, 0.01), POLICY, SETTLED, now=0.0)
    assert (d.replicas, d.max_queue_delay_seconds, d.known) == (3, 0.01, False)
    assert "no request completed in the window while 40 are queued" in d.reason


def test_read_signals_zero_rate_nan_p99_with_queue_holds() -> None:
    answers = {"rate": "0", "age": "1", "gpu": "0", "p99": "NaN", "queue": "40"}
    queries = Queries(
        p99="p99", gpu_utilization=("gpu",), request_rate="rate", queue_size="queue", sample_age="age"
    )

    def query(promql: str) -> list[dict[str, object]]:
        return [{"metric": {}, "value": [0, answers[promql]]}]

    reading = read_signals(query, queries, stale_after_seconds=60)
    d = decide_(reading.observation, Current(3, 0.01), POLICY, SETTLED, now=0.0)
    assert (d.replicas, d.max_queue_delay_seconds, d.known) == (3, 0.01, False)


def test_zero_rate_and_empty_queue_is_still_idle() -> None:
    idle = Observation(p99_seconds=None, gpu_utilization=0.0, request_rate=0.0, queue_size=0.0)
    d = decide_(idle, Current(3, 0.01), POLICY, SETTLED, now=0.0)
    assert d.known and d.replicas == 1 and "no requests" in d.reason
