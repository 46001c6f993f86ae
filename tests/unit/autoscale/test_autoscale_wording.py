"""A service without a GPU: the autoscaler's reasons, conditions and Events speak of the runtime
executor's busy time (what ``kubeinfer_device_utilization_ratio`` is on a CPU), never of a GPU."""

from __future__ import annotations

import math
from typing import Any

from kubeinfer.operator.autoscale.policy import Current, Observation, Policy, decide, restore_state
from kubeinfer.operator.autoscale.signals import Reading
from kubeinfer.operator.autoscale.wording import for_device

from tests.unit.autoscale.test_autoscale_loop import DEPLOYMENT, body, scaler


def test_for_device_rewords_the_utilization_only_without_a_gpu() -> None:
    reason = "P99 0.40 s > target 0.20 s, GPU 0.10 not busy: max queue delay 10 ms → 5 ms"
    assert for_device(reason, gpus=1) == reason
    assert for_device(reason, gpus=0) == (
        "P99 0.40 s > target 0.20 s, executor busy time 0.10 (not busy): max queue delay 10 ms → 5 ms"
    )
    assert (
        for_device("GPU 0.91 busy: 3 → 5 replicas", gpus=0)
        == "executor busy time 0.91 (busy): 3 → 5 replicas"
    )
    missing = "GPU utilization missing: no GPU utilization data for this service"
    assert (
        for_device(missing, gpus=0)
        == "executor busy time missing: no executor busy time data for this service"
    )
    assert for_device("GPU utilization is nan", gpus=0) == "executor busy time is nan"
    assert for_device("request rate is nan", gpus=0) == "request rate is nan"


def test_every_reason_of_the_policy_names_no_gpu_once_reworded() -> None:
    # the policy's words for the utilization over the kinds of decision (timeout cut, scale out,
    # headroom, hold, signal missing or NaN): each says GPU, none is left saying it once reworded
    p = Policy(max_replicas=8)
    cases = [
        Observation(0.4, 0.1, 5.0, 3.0, 1.0),
        Observation(0.5, 0.95, 100.0, 50.0, 1.0),
        Observation(0.05, 0.9, 100.0, 0.0, 1.0),
        Observation(0.2, 0.5, 5.0, 1.0, 1.0),
        Observation(0.1, None, 5.0, 1.0, 1.0),
        Observation(0.1, math.nan, 5.0, 1.0, 1.0),
    ]
    for obs in cases:
        reason = decide(obs, Current(2, 0.01), p, restore_state(now=0.0), 1000.0).reason
        assert "GPU" in reason
        worded = for_device(reason, gpus=0)
        assert "GPU" not in worded and "executor busy time" in worded, worded


def _cpu(status: dict[str, Any] | None = None) -> dict[str, Any]:
    b = body(status)
    b["spec"]["resources"] = {"gpus": 0}
    b["spec"]["runtime"] = {"device": "cpu"}
    return b


async def test_a_cpu_service_decision_condition_and_event_speak_of_executor_busy_time() -> None:
    a, rec, canned = scaler()
    canned.reading = Reading(Observation(0.4, 0.1, 5.0, 3.0, 1.0), None)  # over target, executor idle
    r = await a.tick(_cpu({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.decision is not None and r.decision.max_queue_delay_changed
    assert "executor busy time 0.10 (not busy)" in r.decision.reason and "GPU" not in r.decision.reason
    written = rec.calls[0][1]["status"]
    assert "GPU" not in written["lastDecision"]["reason"]
    assert "GPU" not in written["conditions"][-1]["message"]

    gpu, _, canned = scaler()  # the same signals on a GPU service: its GPU's words
    canned.reading = Reading(Observation(0.4, 0.1, 5.0, 3.0, 1.0), None)
    r = await gpu.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.decision is not None and "GPU 0.10 not busy" in r.decision.reason


async def test_a_cpu_service_missing_utilization_names_the_executor() -> None:
    a, rec, canned = scaler()
    missing = "GPU utilization missing: no GPU utilization data for this service"
    canned.reading = Reading(Observation.unknown(missing), "MetricsMissing")
    await a.tick(_cpu({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    cond = rec.calls[0][1]["status"]["conditions"][-1]
    assert (cond["status"], cond["reason"]) == ("False", "MetricsMissing")
    assert cond["message"] == "executor busy time missing: no executor busy time data for this service"
    assert rec.calls[0][1]["status"]["observed"]["unknownReason"] == cond["message"]
