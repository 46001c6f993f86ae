"""A persistent API-server error becomes Ready=False ApiServerError once, and clears on success."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from kubeinfer.operator import k8s
from kubeinfer.operator.reconcile import backoff, report
from kubeinfer.operator.reconcile.reconciler import Reconciler
from kubeinfer.operator.status import ConditionState as ReadyState

WEBHOOK_ERROR = (
    'PATCH /apis/apps/v1/namespaces/ns/deployments/m: 500 Internal error occurred: failed calling webhook "'
    'deny.test": dial tcp 127.0.0.1:9: connect: connection refused'
)


def test_retry_delay_backs_off_exponentially_up_to_the_cap() -> None:
    delays = [backoff.retry_delay(n, base=5.0, cap=60.0) for n in range(1, 8)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert backoff.retry_delay(1, base=5.0, cap=60.0, retry_after=30.0) == 30.0
    assert backoff.retry_delay(1000, base=5.0, cap=60.0) == 60.0


def test_api_error_state_only_at_threshold_and_only_on_transition() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "MinimumReplicasAvailable", "message": "1/1"}
    status = {"conditions": [ready]}
    assert backoff.api_error_state(status, 2, "boom", threshold=3) is None
    state = backoff.api_error_state(status, 3, "boom", threshold=3)
    assert state == ReadyState(
        "False", "ApiServerError", "3 consecutive reconciles failed; retrying with back-off: boom"
    )
    shown = {"conditions": [{"type": "Ready", "status": "False", "reason": "ApiServerError", "message": "x"}]}
    assert backoff.api_error_state(shown, 7, "boom", threshold=3) is None
    assert backoff.api_error_state({}, 3, "e" * 5000, threshold=3) is not None
    long_state = backoff.api_error_state({}, 3, "e" * 5000, threshold=3)
    assert long_state is not None and long_state.message.endswith(": " + "e" * 1000)


def test_ready_conditions_keeps_other_types_and_transition_time() -> None:
    other = {"type": "AutoscalingActive", "status": "True", "reason": "Active", "message": ""}
    previous = {
        "type": "Ready",
        "status": "False",
        "reason": "Progressing",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    state = ReadyState("False", "ApiServerError", "m")
    conds = report.ready_conditions({"conditions": [previous, other]}, state, "2026-02-02T00:00:00Z", 4)
    assert conds == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "ApiServerError",
            "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 4,
        },
        other,
    ]
    flipped = report.ready_conditions({"conditions": [previous]}, ReadyState("True", "A", ""), "T2", 4)
    assert flipped[0]["lastTransitionTime"] == "T2"


class FakeKube:
    """In-memory stand-in for :class:`k8s.Kube`: Deployment applies fail while ``failing``."""

    def __init__(self, isvc: dict[str, Any]) -> None:
        self.isvc = isvc
        self.failing = True
        self.rv = 10
        self.status_patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        if obj["kind"] == "Deployment" and self.failing:
            raise k8s.TransientError(WEBHOOK_ERROR, status=500, reason="InternalError")
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        return stored

    async def get(self, path: str) -> dict[str, Any] | None:
        if "/inferenceservices/" in path:
            return copy.deepcopy(self.isvc)
        return None

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        return []

    async def delete(self, path: str) -> bool:
        return False

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        assert subresource == "status"
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != self.isvc["metadata"]["resourceVersion"]:
            raise k8s.TransientError("conflict", status=409)
        self.status_patches.append(copy.deepcopy(patch["status"]))
        self.isvc.setdefault("status", {}).update(copy.deepcopy(patch["status"]))
        self.isvc["metadata"]["resourceVersion"] = self._next_rv()
        return copy.deepcopy(self.isvc)

    async def post_event(
        self, involved: Mapping[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.events.append((type_, reason, message))

    # the real helpers of k8s.Kube, over this stand-in's requests
    record_event = k8s.Kube.record_event
    retry_on_conflict = k8s.Kube.retry_on_conflict


def _ready(kube: FakeKube) -> dict[str, Any]:
    return next(c for c in kube.isvc["status"]["conditions"] if c["type"] == "Ready")


@pytest.mark.timeout(10)
async def test_persistent_api_error_is_shown_once_and_cleared_on_success() -> None:
    isvc: dict[str, Any] = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "5"},
        "spec": {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}},
    }
    kube = FakeKube(copy.deepcopy(isvc))
    rec = Reconciler(kube=kube, clock=lambda: "2026-01-01T00:00:00Z", retry_delay=3600.0)  # type: ignore[arg-type]

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    async def reconcile_and_settle() -> None:  # as after a watch event: the body as stored
        await rec.reconcile(copy.deepcopy(kube.isvc), lookup)
        await asyncio.gather(*rec._background)

    try:
        for _ in range(2):  # below the threshold: nothing written
            await reconcile_and_settle()
        assert kube.status_patches == [] and kube.events == []

        await reconcile_and_settle()  # third consecutive failure: the transition
        assert len(kube.status_patches) == 1
        ready = _ready(kube)
        assert (ready["status"], ready["reason"]) == ("False", "ApiServerError")
        assert ready["message"] == (
            "3 consecutive reconciles failed; retrying with back-off: " + WEBHOOK_ERROR
        )
        assert [(t, r) for t, r, _ in kube.events] == [("Warning", "ApiServerError")]
        assert ("ns", "m") in rec._retries  # still retrying

        for _ in range(3):  # still failing: no further status write, no further Event
            await reconcile_and_settle()
        assert len(kube.status_patches) == 1 and len(kube.events) == 1

        kube.failing = False  # the webhook is back: the next success clears it
        await reconcile_and_settle()
        ready = _ready(kube)
        assert (ready["status"], ready["reason"]) == ("False", "Progressing")
        assert len(kube.status_patches) == 2

        kube.failing = True  # a new image: the Deployment must be written again, and fails
        kube.isvc["spec"]["runtime"]["image"] = "registry.example/kubeinfer-runtime:2"
        kube.isvc["metadata"]["generation"] = 2
        kube.isvc["metadata"]["resourceVersion"] = kube._next_rv()
        # the count started over after the success: two failures write nothing
        for _ in range(2):
            await reconcile_and_settle()
        assert len(kube.status_patches) == 2
        await reconcile_and_settle()
        assert _ready(kube)["reason"] == "ApiServerError" and len(kube.status_patches) == 3
    finally:
        rec.forget("ns", "m")


class NoReplicaSetsKube(FakeKube):
    """An older chart's RBAC: listing ReplicaSets is forbidden."""

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        if "/replicasets" in path:
            raise k8s.PermanentError(f"GET {path}: 403 forbidden", status=403)
        return []


@pytest.mark.timeout(10)
async def test_forbidden_replicaset_list_still_writes_status(caplog: pytest.LogCaptureFixture) -> None:
    isvc: dict[str, Any] = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "5"},
        "spec": {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}},
    }
    kube = NoReplicaSetsKube(copy.deepcopy(isvc))
    kube.failing = False
    rec = Reconciler(kube=kube, clock=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    rolling = {  # mid-rollout: the reconcile lists ReplicaSets and pods
        "metadata": {"name": "m", "generation": 2, "resourceVersion": "9"},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "readyReplicas": 1},
    }

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return rolling if kind == "Deployment" else None

    try:
        for _ in range(2):
            await rec.reconcile(copy.deepcopy(kube.isvc), lookup)
        ready = _ready(kube)
        assert (ready["status"], ready["reason"]) == ("False", "Progressing")
        assert kube.isvc["status"]["updatedReady"] == "0/1"  # from the Deployment's counts alone
        refused = [r for r in caplog.records if "listing ReplicaSets refused" in r.getMessage()]
        assert len(refused) == 1
    finally:
        await asyncio.gather(*rec._background)
        rec.forget("ns", "m")
