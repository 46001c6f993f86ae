"""Which Secrets and ServiceAccounts an InferenceService may name (operator/reconcile/references.py, the
settings secret_references_allowed / service_account_references_allowed): one naming another is refused,
Ready=False SecretNotAllowed (ServiceAccountNotAllowed) naming it and the field, and nothing is applied.
Also the reconciler's side of the model's fetch: the pods listed once more as a fetched model's rollout
completes, for the Ready Event's note."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_deployment
from kubeinfer.operator.controllers import Controllers
from kubeinfer.operator.reconcile.reconciler import Reconciler
from kubeinfer.operator.reconcile.references import ReferencePolicy, matches, secret_references
from kubeinfer.operator.settings import Settings

from tests.unit.operator.test_operator_api_errors import FakeKube
from tests.unit.operator.test_operator_health import deployment, replicaset


@pytest.mark.parametrize(
    "patterns, namespace, name, ok",
    [
        (["*"], "ns", "anything", True),
        ([], "ns", "anything", False),
        (["model-*"], "ns", "model-s3", True),
        (["model-*"], "ns", "db-password", False),
        (["team-a/*"], "team-a", "x", True),
        (["team-a/*"], "team-b", "x", False),
        (["*/hf-token"], "any", "hf-token", True),
        (["team-?/model-*", "shared"], "team-b", "model-1", True),
        (["team-?/model-*", "shared"], "team-b", "shared", True),
        (["Model-*"], "ns", "model-1", False),  # case-sensitive, as names are
    ],
)
def test_patterns(patterns: list[str], namespace: str, name: str, ok: bool) -> None:
    assert matches(patterns, namespace, name) is ok


def _isvc(**spec: Any) -> api.InferenceService:
    base: dict[str, Any] = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, **spec}
    return api.InferenceService.from_body({"metadata": {"name": "m", "namespace": "ns"}, "spec": base})


EVERY_REFERENCE: dict[str, Any] = {
    "model": {"uri": "s3://models/m", "credentials": {"secretName": "model-s3"}},
    "quantization": {
        "mode": "int8-static",
        "calibration": {"uri": "s3://data/c.txt", "credentials": {"secretName": "calib-s3"}},
    },
    "server": {"auth": {"bearerTokenSecretRef": {"name": "api-token"}}},
    "runtime": {
        "device": "cpu",
        "env": [
            {"name": "A", "value": "1"},
            {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        ],
    },
}


def test_every_secret_an_inferenceservice_names() -> None:
    assert secret_references(_isvc(**EVERY_REFERENCE).spec) == [
        ("spec.model.credentials.secretName", "model-s3"),
        ("spec.quantization.calibration.credentials.secretName", "calib-s3"),
        ("spec.server.auth.bearerTokenSecretRef.name", "api-token"),
        ("spec.runtime.env[1].valueFrom.secretKeyRef.name", "db-password"),
    ]


def test_refusal_names_the_secret_and_the_field() -> None:
    isvc = _isvc(**EVERY_REFERENCE)
    assert ReferencePolicy().refusal(isvc) is None  # the default: any
    policy = ReferencePolicy(secrets=("model-*", "calib-*", "api-token"))
    refused = policy.refusal(isvc)
    assert refused is not None and (refused.status, refused.reason) == ("False", "SecretNotAllowed")
    assert refused.message.startswith('spec.runtime.env[1].valueFrom.secretKeyRef.name: Secret "db-password"')
    assert "model-*, calib-*, api-token" in refused.message
    assert ReferencePolicy(secrets=()).refusal(_isvc()) is None  # names none: nothing to refuse
    none = ReferencePolicy(secrets=()).refusal(
        _isvc(model={"uri": "oci://r.io/a:1", "credentials": {"secretName": "pull"}})
    )
    assert none is not None and 'spec.model.credentials.secretName: Secret "pull"' in none.message


def test_service_account_policy() -> None:
    named = _isvc(serviceAccountName="admin")
    refused = ReferencePolicy(service_accounts=("models-*",)).refusal(named)
    assert refused is not None and refused.reason == "ServiceAccountNotAllowed"
    assert refused.message.startswith('spec.serviceAccountName: ServiceAccount "admin"')
    assert ReferencePolicy(service_accounts=("ns/admin",)).refusal(named) is None
    assert ReferencePolicy(service_accounts=()).refusal(_isvc()) is None


def test_settings_default_allow_all_and_lists_from_env_and_flags() -> None:
    default = Settings.from_env({})
    assert default.secret_references_allowed == ["*"] and default.service_account_references_allowed == ["*"]
    env = Settings.from_env({"KUBEINFER_SECRET_REFERENCES_ALLOWED": "model-*, team-a/*"})
    assert env.secret_references_allowed == ["model-*", "team-a/*"]
    assert Settings.from_env({"KUBEINFER_SECRET_REFERENCES_ALLOWED": ""}).secret_references_allowed == []
    flags = Settings.from_args(["--service-account-references-allowed", "models"], env={})
    assert flags.service_account_references_allowed == ["models"]
    made = Controllers.create(FakeKube({}), env)  # type: ignore[arg-type]
    assert made.reconciler.references == ReferencePolicy(secrets=("model-*", "team-a/*"))
    made.autoscaler.close()


# --- the reconciler ------------------------------------------------------------------------------------


class PodsKube(FakeKube):
    """FakeKube whose applies succeed (and are recorded) and whose pod and ReplicaSet lists are given."""

    def __init__(self, isvc: dict[str, Any]) -> None:
        super().__init__(isvc)
        self.failing = False
        self.applied: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.replicasets: list[dict[str, Any]] = []
        self.lists: list[str] = []

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        self.applied.append(obj["kind"])
        return await super().apply(obj, field_manager=field_manager, force=force)

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.lists.append(path.rsplit("/", 1)[-1])
        return copy.deepcopy(self.replicasets if path.endswith("/replicasets") else self.pods)


def _body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "5"},
        "spec": {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, **spec},
    }


async def _settle(rec: Reconciler, kube: FakeKube, lookup: Any) -> None:
    await rec.reconcile(copy.deepcopy(kube.isvc), lookup)
    await asyncio.gather(*rec._background)


def _no_objects(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


@pytest.mark.timeout(10)
async def test_a_refused_secret_applies_nothing_and_says_why_once() -> None:
    kube = PodsKube(_body(model={"uri": "s3://models/m", "credentials": {"secretName": "db-password"}}))
    rec = Reconciler(kube=kube, clock=lambda: "T", references=ReferencePolicy(secrets=("model-*",)))  # type: ignore[arg-type]
    try:
        await _settle(rec, kube, _no_objects)
        await _settle(rec, kube, _no_objects)  # a resync: no new write, no new Event
        assert kube.applied == [] and kube.lists == []
        conditions = {c["type"]: c for c in kube.isvc["status"]["conditions"]}
        assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "SecretNotAllowed")
        assert 'Secret "db-password"' in conditions["Ready"]["message"]
        assert "spec.model.credentials.secretName" in conditions["Ready"]["message"]
        assert (conditions["Stalled"]["status"], conditions["Stalled"]["reason"]) == (
            "True",
            "SecretNotAllowed",
        )
        assert len(kube.status_patches) == 1
        assert [(t, r) for t, r, _ in kube.events] == [("Warning", "SecretNotAllowed")]
        # the admin allows it (operator restarted with the new setting): applied as usual
        rec2 = Reconciler(kube=kube, clock=lambda: "T", references=ReferencePolicy(secrets=("db-*",)))  # type: ignore[arg-type]
        await _settle(rec2, kube, _no_objects)
        assert "Deployment" in kube.applied
        rec2.forget("ns", "m")
    finally:
        rec.forget("ns", "m")


@pytest.mark.timeout(10)
async def test_fetched_model_becoming_ready_lists_pods_once_for_the_ready_event() -> None:
    kube = PodsKube(_body(model={"uri": "s3://models/m"}))
    kube.isvc["status"] = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "Progressing", "message": "0/1"}]
    }
    # the Deployment as applied before, its rollout now complete
    built = build_deployment(api.InferenceService.from_body(kube.isvc), replicas=1)
    counts = deployment(replicas=1, updated=1, ready=1)
    annotations = {**built["metadata"]["annotations"], **counts["metadata"]["annotations"]}
    meta = {**built["metadata"], "generation": 2, "resourceVersion": "3", "annotations": annotations}
    done = {**built, "metadata": meta, "status": counts["status"]}
    kube.replicasets = [replicaset("2", "new", 1)]
    kube.pods = [
        {
            "metadata": {"name": "m-1", "labels": {"pod-template-hash": "new"}},
            "spec": {"initContainers": [{"name": "fetch", "terminationMessagePolicy": "File"}]},
            "status": {
                "initContainerStatuses": [
                    {
                        "name": "fetch",
                        "ready": True,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "message": "fetched 3 files, 87.2 MB in 4.1 s from s3://models/m",
                                "startedAt": "2026-01-01T00:00:00Z",
                                "finishedAt": "2026-01-01T00:00:04Z",
                            }
                        },
                    }
                ]
            },
        }
    ]

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return done if kind == "Deployment" else None

    rec = Reconciler(kube=kube, clock=lambda: "T")  # type: ignore[arg-type]
    try:
        await _settle(rec, kube, lookup)
        ready = [e for e in kube.events if e[1] == "MinimumReplicasAvailable"]
        assert ready == [
            (
                "Normal",
                "MinimumReplicasAvailable",
                "Ready=True: 1/1 replicas ready; model fetched in 4 s (pod m-1): fetched 3 files, 87.2 MB in "
                "4.1 s from s3://models/m",
            )
        ]
        listed = list(kube.lists)
        assert sorted(listed) == ["pods", "replicasets"] and "Deployment" not in kube.applied
        await _settle(rec, kube, lookup)  # Ready now: the steady state lists nothing, writes nothing
        assert kube.lists == listed and len(kube.status_patches) == 1
    finally:
        rec.forget("ns", "m")
