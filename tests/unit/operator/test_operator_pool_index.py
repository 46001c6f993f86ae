"""From a pool's replicas' model repository indexes to the statuses (operator/reconcile/poolindex.py and
the pool planner's use of it): which pods a model is loaded on, its bytes, last use and counts; a failed
load is Ready=False ModelLoadFailed on its own InferenceService only, naming the pod and the cause; the
pool's loaded models, bytes of the budget and evictions; an answer that is not an index is refused and
a bad entry skipped; a model used again within the same minute changes nothing (no status write)."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator import api, conditions, status
from kubeinfer.operator.reconcile import pool as planner
from kubeinfer.operator.reconcile.poolindex import (
    PoolIndex,
    format_bytes,
    index_url,
    load_failure,
    parse_index,
    pool_usage,
    pooled_model_status,
)

NOW = "2026-12-06T03:00:00Z"
MiB = 1 << 20


def _entry(name: str, state: str = "UNAVAILABLE", **more: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "state": state, "reason": "", **more}


def _index(**pods: list[dict[str, Any]]) -> PoolIndex:
    return PoolIndex({pod: parse_index(doc) for pod, doc in pods.items()})


INDEX = _index(
    **{
        "small-0": [
            _entry(
                "alpha",
                "READY",
                residentBytes=300 * MiB,
                loads=2,
                evictions=1,
                lastUsed="2026-12-06T02:58:41Z",
            ),
            _entry("beta", "READY", residentBytes=100 * MiB, loads=1),
            _entry(
                "broken", reason="failed to load: x", loadFailures=3, loadError="model load failed: bad onnx"
            ),
        ],
        "small-1": [
            _entry("alpha", "READY", residentBytes=310 * MiB, loads=1, lastUsed="2026-12-06T02:59:05Z"),
            _entry("beta", evictions=2),
            _entry("broken"),
        ],
    }
)


def test_a_models_status_over_the_replicas() -> None:
    assert pooled_model_status("alpha", INDEX) == {
        "loadedOn": ["small-0", "small-1"],
        "replicas": 2,
        "residentBytes": 310 * MiB,
        "lastUsed": "2026-12-06T02:59:00Z",  # the latest, to the minute
        "loads": 3,
        "loadFailures": 0,
        "evictions": 1,
    }
    beta = pooled_model_status("beta", INDEX)
    assert beta is not None and beta["loadedOn"] == ["small-0"] and beta["evictions"] == 2
    assert "lastUsed" not in beta  # never used
    # a model no replica lists yet (the kubelet has not refreshed the ConfigMap): not loaded, no counts
    assert pooled_model_status("new", INDEX) == {
        "loadedOn": [],
        "replicas": 2,
        "residentBytes": 0,
        "loads": 0,
        "loadFailures": 0,
        "evictions": 0,
    }
    assert pooled_model_status("alpha", None) is None and pooled_model_status("alpha", PoolIndex()) is None


def test_a_failed_load_names_the_pod_and_the_cause() -> None:
    assert load_failure("broken", INDEX) == ("small-0", "model load failed: bad onnx")
    assert load_failure("alpha", INDEX) is None and load_failure("broken", None) is None


def test_the_pools_usage() -> None:
    usage = pool_usage(INDEX, "1Gi")
    assert usage["loadedModels"] == 2
    assert usage["residentBytes"] == 400 * MiB and usage["memoryUsed"] == "400Mi/1Gi"
    assert usage["evictions"] == 3
    assert usage["replicaModels"] == [
        {"pod": "small-0", "loaded": ["alpha", "beta"], "residentBytes": 400 * MiB, "evictions": 1},
        {"pod": "small-1", "loaded": ["alpha"], "residentBytes": 310 * MiB, "evictions": 2},
    ]
    # no replica answered: every field removed
    assert set(pool_usage(PoolIndex(), "1Gi").values()) == {None}


@pytest.mark.parametrize(
    "n, text",
    [(0, "0"), (1536, "1.5Ki"), (412 * MiB, "412Mi"), (3 << 30, "3Gi"), (int(1.25 * (1 << 30)), "1.25Gi")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_an_answer_that_is_not_an_index() -> None:
    with pytest.raises(ValueError, match="not a JSON array"):
        parse_index({"error": "not found"})
    parsed = parse_index(
        [
            "junk",
            {"state": "READY"},  # no name
            _entry("m", "READY", residentBytes="many", loads=-1, lastUsed="yesterday", extra={"x": 1}),
        ]
    )
    assert list(parsed) == ["m"]
    m = parsed["m"]
    assert m.loaded and m.resident_bytes == 0 and m.loads == 0 and m.last_used is None


def _pool() -> dict[str, Any]:
    return {
        "metadata": {"name": "small", "namespace": "ml", "uid": "u", "generation": 1},
        "spec": {"memoryBudget": "1Gi", "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"}},
    }


def _isvc(name: str, model: str | None = None) -> api.InferenceService:
    spec: dict[str, Any] = {"pool": "small", "model": {"uri": f"/models/{name}", "format": "onnx"}}
    if model:
        spec["model"]["name"] = model
    return api.InferenceService.from_body(
        {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1}, "spec": spec}
    )


DEPLOYMENT = {
    "metadata": {"name": "small", "labels": {"kubeinfer.io/pool": "small"}},
    "spec": {"replicas": 2},
    "status": {"replicas": 2, "readyReplicas": 2},
}


def test_a_failed_load_is_not_ready_on_its_own_isvc_only() -> None:
    broken = planner.pooled_ready(_isvc("broken"), _pool(), DEPLOYMENT, None, INDEX)
    assert (broken.status, broken.reason) == ("False", conditions.MODEL_LOAD_FAILED)
    assert broken.message == (
        "model 'broken' failed to load on pod small-0 of ModelPool small: model load failed: bad onnx"
    )
    alpha = planner.pooled_ready(_isvc("alpha"), _pool(), DEPLOYMENT, None, INDEX)
    assert (alpha.status, alpha.reason) == ("True", conditions.POOL_READY)
    fields = planner.pooled_status(_isvc("broken"), broken, {}, NOW, INDEX)
    ready = next(c for c in fields["conditions"] if c["type"] == conditions.CONDITION_READY)
    assert ready["reason"] == conditions.MODEL_LOAD_FAILED
    assert fields["model"]["loadFailures"] == 3 and fields["model"]["loadedOn"] == []


def test_an_isvc_whose_model_name_is_taken_reports_no_model() -> None:
    taken = planner.pooled_ready(_isvc("zeta", model="alpha"), _pool(), DEPLOYMENT, "alpha", INDEX)
    assert planner.pooled_status(_isvc("zeta", model="alpha"), taken, {}, NOW, INDEX)["model"] is None


def test_a_use_within_the_minute_writes_nothing() -> None:
    isvc = _isvc("alpha")
    ready = planner.pooled_ready(isvc, _pool(), DEPLOYMENT, None, INDEX)
    first = planner.pooled_status(isvc, ready, {}, NOW, INDEX)
    stored = {k: v for k, v in first.items() if v is not None}
    later = _index(
        **{
            "small-0": [
                _entry(
                    "alpha",
                    "READY",
                    residentBytes=300 * MiB,
                    loads=2,
                    evictions=1,
                    lastUsed="2026-12-06T02:59:59Z",
                )
            ],
            "small-1": [
                _entry("alpha", "READY", residentBytes=310 * MiB, loads=1, lastUsed="2026-12-06T02:59:30Z")
            ],
        }
    )
    again = planner.pooled_status(isvc, ready, stored, NOW, later)
    assert status.status_patch(again, stored) == {}


def test_a_key_gone_from_a_status_object_is_removed_by_the_patch() -> None:
    stored = {"model": {"loadedOn": [], "lastUsed": "2026-12-06T02:59:00Z", "loads": 1}}
    desired = {"model": {"loadedOn": [], "loads": 0}}  # the pod restarted: no last use any more
    assert status.status_patch(desired, stored) == {"model": {"loadedOn": [], "loads": 0, "lastUsed": None}}


def test_pool_status_carries_the_usage() -> None:
    pool = api.ModelPool.from_body(_pool())
    fields = planner.pool_status(pool, DEPLOYMENT, planner.PoolMembers(), {}, NOW, index=INDEX)
    assert fields["loadedModels"] == 2 and fields["memoryUsed"] == "400Mi/1Gi"
    assert planner.pool_status(pool, DEPLOYMENT, planner.PoolMembers(), {}, NOW)["memoryUsed"] is None


def _pod(**status_: Any) -> dict[str, Any]:
    ready = [{"type": "Ready", "status": "True"}]
    return {
        "metadata": {"name": "small-0"},
        "spec": {"containers": [{"name": "runtime", "ports": [{"name": "http", "containerPort": 18080}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": ready, **status_},
    }


def test_index_url_of_a_ready_pod_only() -> None:
    assert index_url(_pod()) == "http://10.0.0.7:18080/v2/repository/index"
    assert index_url(_pod(podIP="fd00::7")) == "http://[fd00::7]:18080/v2/repository/index"
    assert index_url(_pod(conditions=[{"type": "Ready", "status": "False"}])) is None
    assert index_url(_pod(phase="Pending")) is None and index_url(_pod(podIP="")) is None
    unnamed = _pod()
    unnamed["spec"]["containers"][0]["ports"] = []
    assert index_url(unnamed) == "http://10.0.0.7:8080/v2/repository/index"
