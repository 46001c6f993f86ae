"""A ModelPool with ``spec.autoscaling``: who owns its Deployment's replicas (the operator's apply leaves
them to the autoscaler, as an InferenceService's), Ready against the autoscaler's count, the
autoscaler's status fields removed with autoscaling off, the pool's status write pinned to the version it
read, and the PromQL over the pool's pods. The autoscaler's tick of a pool is in
tests/unit/autoscale/test_autoscale_loop.py, its wiring in
tests/unit/operator/test_operator_controllers.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator import api, conditions, k8s
from kubeinfer.operator.autoscale import signals
from kubeinfer.operator.builders import build_pool_deployment
from kubeinfer.operator.builders.common import pool_selector_labels
from kubeinfer.operator.reconcile import pool as planner
from kubeinfer.operator.reconcile.pool_reconciler import PoolReconciler
from kubeinfer.operator.reconcile.replicas import pool_replicas

from kubeinfer.contract.pool import POOL_LABEL

NOW = "2026-12-05T12:00:00Z"


def _pool(**spec: Any) -> api.ModelPool:
    return api.ModelPool.from_body(
        {
            "metadata": {"name": "small", "namespace": "ml", "uid": "u", "generation": 3},
            "spec": {"memoryBudget": "1Gi", **spec},
        }
    )


def _deployment(replicas: int, ready: int, *managers: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "small",
            "labels": {POOL_LABEL: "small"},
            "managedFields": [{"manager": m, "fieldsV1": {"f:spec": {"f:replicas": {}}}} for m in managers],
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": ready},
    }


ON = {"enabled": True, "minReplicas": 2, "maxReplicas": 5}


def test_pool_replicas_fixed_without_autoscaling() -> None:
    pool = _pool(replicas=3)
    assert pool_replicas(pool, None) == 3
    assert pool_replicas(pool, _deployment(5, 5, api.AUTOSCALER_FIELD_MANAGER)) == 3
    assert build_pool_deployment(pool, [], replicas=pool_replicas(pool, None))["spec"]["replicas"] == 3


def test_pool_replicas_left_to_the_autoscaler_within_bounds() -> None:
    pool = _pool(replicas=1, autoscaling=ON)
    assert pool_replicas(pool, None) == 2  # a new pool starts at minReplicas
    # the autoscaler owns the count: the operator's apply leaves the field out
    owned = _deployment(4, 4, api.FIELD_MANAGER, api.AUTOSCALER_FIELD_MANAGER)
    assert pool_replicas(pool, owned) is None
    assert "replicas" not in build_pool_deployment(pool, [], replicas=None)["spec"]
    # the operator alone owns it: kept, so that its apply does not drop it to the default
    assert pool_replicas(pool, _deployment(4, 4, api.FIELD_MANAGER)) == 4
    # outside the bounds (the spec changed): clamped
    assert pool_replicas(pool, _deployment(9, 9, api.AUTOSCALER_FIELD_MANAGER)) == 5
    assert pool_replicas(pool, _deployment(1, 1, api.AUTOSCALER_FIELD_MANAGER)) == 2


def test_pool_ready_counts_against_the_autoscalers_replicas() -> None:
    pool = _pool(replicas=1, autoscaling=ON)
    ready = planner.pool_ready(pool, _deployment(4, 3), name_taken=False)
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        conditions.POOL_NOT_READY,
        "3/4 replicas ready",
    )
    ready = planner.pool_ready(pool, _deployment(4, 4), name_taken=False)
    assert (ready.status, ready.message) == ("True", "4/4 replicas ready")
    # without autoscaling spec.replicas is the count to be ready
    fixed = planner.pool_ready(_pool(replicas=2), _deployment(4, 2), name_taken=False)
    assert (fixed.status, fixed.message) == ("True", "2/2 replicas ready")


def test_pool_status_removes_the_autoscalers_fields_with_autoscaling_off() -> None:
    written = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": conditions.POOL_READY,
                "message": "1/1 replicas ready",
            },
            {"type": conditions.CONDITION_AUTOSCALING_ACTIVE, "status": "True", "reason": conditions.ACTIVE},
        ],
        "observed": {"p99Seconds": 0.1},
        "lastDecision": {"replicas": 2},
    }
    members = planner.PoolMembers()
    off = planner.pool_status(_pool(), _deployment(1, 1), members, written, NOW)
    assert [c["type"] for c in off["conditions"]] == ["Ready"]
    assert off["observed"] is None and off["lastDecision"] is None
    on = planner.pool_status(_pool(autoscaling=ON), _deployment(2, 2), members, written, NOW)
    assert conditions.CONDITION_AUTOSCALING_ACTIVE in [c["type"] for c in on["conditions"]]
    assert "observed" not in on and "lastDecision" not in on


def test_pool_queries_select_the_pools_pods_over_all_its_models() -> None:
    q = signals.pool_queries("ml", "small", "60s", {"queue_size": 'sum(my_queue{pool="{name}"})'})
    sel = 'namespace="ml",pool="small"'
    bucket = f"kubeinfer_request_duration_seconds_bucket{{{sel}}}"
    assert q.p99 == f"histogram_quantile(0.99, sum by (le) (rate({bucket}[60s])))"
    assert q.request_rate == f"sum(rate(kubeinfer_requests_total{{{sel}}}[60s]))"
    assert q.inflight == f"sum(kubeinfer_inflight_requests{{{sel}}})"
    assert sel in q.arrival_rate and sel in q.sample_age and all(sel in g for g in q.gpu_utilization)
    assert q.queue_size == 'sum(my_queue{pool="small"})'  # an override's {name} is the pool's
    assert "inferenceservice" not in q.p99
    # each model has its own s(b) and batches: no average over models, the reactive law decides
    assert (q.service_time_a, q.service_time_c, q.max_batch_size, q.instance_concurrency) == ("", "", "", "")
    # the label the queries select on is the one the pool's Deployment sets on its pods
    assert pool_selector_labels("small")[POOL_LABEL] == "small"
    assert signals.POOL_TARGET_LABEL == "pool"


class _Patches:
    def __init__(self, error: k8s.KubeError | None = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.error = error

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        self.sent.append((path, patch))
        if self.error is not None:
            raise self.error
        return patch


async def test_the_pools_status_write_pins_the_version_it_read_when_it_sends_conditions() -> None:
    # the autoscaler writes AutoscalingActive into the same list: a write from an older copy would drop it
    kube = _Patches()
    pools = PoolReconciler(kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "small", "namespace": "ml", "resourceVersion": "41"}, "status": {}}
    await pools._write_status(body, {"conditions": [{"type": "Ready", "status": "True"}], "models": 1})
    await pools._write_status(body, {"models": 2})
    (path, first), (_, second) = kube.sent
    assert path == k8s.MODEL_POOL.path("ml", "small")
    assert first["metadata"] == {"resourceVersion": "41"} and first["status"]["models"] == 1
    assert second == {"status": {"models": 2}}

    # a 409 (the autoscaler wrote meanwhile) waits for the newer version's event; another error is raised
    conflict = _Patches(k8s.TransientError("conflict", status=409))
    await PoolReconciler(conflict)._write_status(body, {"models": 3})  # type: ignore[arg-type]
    assert len(conflict.sent) == 1
    with pytest.raises(k8s.TransientError):
        await PoolReconciler(_Patches(k8s.TransientError("busy", status=503)))._write_status(  # type: ignore[arg-type]
            body, {"models": 3}
        )
