"""The ModelPool API and ``spec.pool`` of an InferenceService: the fields a pool decides are refused on a
pooled InferenceService naming the field (pydantic here; the same rules as CEL in the CRD, checked by
the API server in tests/integration/operator/test_operator_pool.py)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from kubeinfer.operator import api, crdgen


def _pool(**spec: Any) -> api.ModelPool:
    return api.ModelPool.from_body(
        {"metadata": {"name": "small", "namespace": "ml"}, "spec": {"memoryBudget": "3Gi", **spec}}
    )


def test_pool_defaults_and_budget_bytes() -> None:
    pool = _pool()
    assert pool.spec.replicas == 1 and pool.spec.pinned == []
    assert pool.spec.runtime.image == api.DEFAULT_IMAGE  # as an InferenceService's
    assert pool.spec.memory_budget_bytes() == 3 * 1024**3
    assert api.pool_configmap_name("small") == "small-repository"


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"replicas": 0}, "replicas"),
        ({"memoryBudget": "9Gi"}, "spec.memoryBudget"),  # above resources.memory (8Gi)
        ({"memoryBudget": "0"}, "memoryBudget"),
        ({"pinned": ["Not_A_Name"]}, "pinned"),
        # what does not apply to a pool: the max queue delay is each model's, and no scale to zero
        ({"autoscaling": {"maxQueueDelay": {"max": "20ms"}}}, r"spec\.autoscaling\.maxQueueDelay "),
        ({"autoscaling": {"maxQueueDelayCooldown": "30s"}}, r"spec\.autoscaling\.maxQueueDelayCooldown"),
        ({"autoscaling": {"enabled": True, "minReplicas": 0}}, r"spec\.autoscaling\.minReplicas"),
        (
            {"autoscaling": {"enabled": True, "minReplicas": 0, "scaleToZero": {"idleAfter": "1m"}}},
            r"spec\.autoscaling\.scaleToZero",
        ),
        # the InferenceService's bounds, under the same names
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, r"spec\.autoscaling\.minReplicas"),
        ({"autoscaling": {"maxScaleUpStep": 0}}, "maxScaleUpStep"),
    ],
)
def test_pool_refusals_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        _pool(**spec)


def test_pool_autoscaling_has_the_inference_services_fields() -> None:
    pool = _pool(
        replicas=2,
        autoscaling={
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 8,
            "targetP99": "150ms",
            "window": "30s",
            "scaleDownStabilization": "2m",
            "scaleUpCooldown": "10s",
            "maxScaleUpStep": 2,
            "gpuUtilization": {"low": 0.4, "high": 0.7},
        },
    )
    scaling = pool.spec.autoscaling
    assert isinstance(scaling, api.AutoscalingSpec)  # one model, the InferenceService's
    assert (scaling.target_p99, scaling.window, scaling.scale_down_stabilization) == (0.15, 30, 120)
    assert (scaling.max_replicas, scaling.max_scale_up_step, pool.spec.replicas) == (8, 2, 2)
    # the refused fields written out at their defaults are accepted (as on a pooled InferenceService)
    _pool(autoscaling={"maxQueueDelay": {"min": "1ms", "max": "50ms"}, "maxQueueDelayCooldown": "15s"})


def test_pool_autoscaling_cel_and_pydantic_say_the_same() -> None:
    spec = crdgen.model_pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {r["fieldPath"]: r for r in spec["x-kubernetes-validations"]}
    for field, value in (
        ("maxQueueDelay", {"max": "20ms"}),
        ("maxQueueDelayCooldown", "30s"),
    ):
        rule = rules[f".autoscaling.{field}"]
        assert (
            rule["rule"].startswith("!has(self.autoscaling) || ") and rule["reason"] == "FieldValueForbidden"
        )
        with pytest.raises(pydantic.ValidationError) as err:
            _pool(autoscaling={field: value})
        assert rule["message"] in str(err.value)  # one message, from one rule
    delay = rules[".autoscaling.maxQueueDelay"]["rule"]
    assert "self.autoscaling.maxQueueDelay.min == '1ms'" in delay and "maxQueueDelay.max == '50ms'" in delay
    assert rules[".autoscaling.scaleToZero"]["rule"] == (
        "!has(self.autoscaling) || !has(self.autoscaling.scaleToZero)"
    )
    floor = rules[".autoscaling.minReplicas"]
    assert "self.autoscaling.minReplicas >= 1" in floor["rule"]
    with pytest.raises(pydantic.ValidationError) as err:
        _pool(autoscaling={"enabled": True, "minReplicas": 0})
    assert floor["message"] in str(err.value)
    # the InferenceService's own rules of spec.autoscaling come with the shared model
    inner = spec["properties"]["autoscaling"]["x-kubernetes-validations"]
    assert any(r["fieldPath"] == ".minReplicas" and "self.maxReplicas" in r["rule"] for r in inner)


def test_pool_needs_a_budget() -> None:
    with pytest.raises(pydantic.ValidationError, match="memoryBudget"):
        api.ModelPoolSpec.from_k8s({})


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"resources": {"cpu": "4"}}, "spec.resources"),
        ({"resources": {"memory": "1Gi"}}, "spec.resources"),
        ({"replicas": 3}, "spec.replicas"),
        ({"autoscaling": {"enabled": True}}, "spec.autoscaling"),
        ({"autoscaling": {"enabled": True, "minReplicas": 0}}, "spec.autoscaling"),
        ({"model": {"uri": "s3://bucket/model/"}}, "spec.model.uri"),
        # guards of an InferenceService's own pods a pool does not apply yet: refused, never served unguarded
        ({"server": {"auth": {"bearerTokenSecretRef": {"name": "s", "key": "k"}}}}, "spec.server.auth"),
        ({"server": {"allowFrom": [{"podSelector": {"matchLabels": {"a": "b"}}}]}}, "spec.server.allowFrom"),
    ],
)
def test_pooled_isvc_refuses_what_the_pool_decides(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field.replace(".", r"\.")):
        api.InferenceServiceSpec.from_k8s({"pool": "small", **spec})
    # without a pool, the same spec is fine (the model's source aside, which needs its settings)
    if "model" not in spec:
        api.InferenceServiceSpec.from_k8s(spec)


def test_pooled_isvc_accepts_defaults_written_out_and_a_cpu_model() -> None:
    spec = api.InferenceServiceSpec.from_k8s(
        {
            "pool": "small",
            "model": {"uri": "/models/bert"},
            "resources": {"cpu": "2", "memory": "8Gi", "gpus": 0},
            "replicas": 1,
            "autoscaling": {"enabled": False},
        }
    )
    assert spec.pool == "small"


def _rules(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["message"]: r for r in schema.get("x-kubernetes-validations", [])}


def test_crd_rules_of_a_pooled_isvc_name_each_field() -> None:
    spec = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    pooled = {m: r for m, r in _rules(spec).items() if "has(self.pool)" in r["rule"]}
    paths = sorted(r["fieldPath"] for r in pooled.values())
    assert paths == [
        ".autoscaling",
        ".model.uri",
        ".replicas",
        ".resources",
        ".server.allowFrom",
        ".server.auth",
    ]
    for message, rule in pooled.items():
        assert message.startswith("spec" + rule["fieldPath"]), message
        assert rule["rule"].startswith("!has(self.pool) || ")
    resources = next(r["rule"] for r in pooled.values() if r["fieldPath"] == ".resources")
    # absent or at the default, whether or not the API server filled the defaults in; gpus apart
    assert "(!has(self.resources.cpu) || self.resources.cpu == '2')" in resources
    assert "!has(self.resources.gpuProduct)" in resources and "gpus" not in resources
    autoscaling = next(r["rule"] for r in pooled.values() if r["fieldPath"] == ".autoscaling")
    assert (
        "self.autoscaling.enabled == false" in autoscaling
        and "!has(self.autoscaling.scaleToZero)" in autoscaling
    )


def test_pool_crd() -> None:
    crd = crdgen.model_pool_crd()
    assert crd["metadata"]["name"] == "modelpools.kubeinfer.io"
    assert crd["spec"]["names"]["shortNames"] == ["kpool"] and crd["spec"]["names"]["kind"] == "ModelPool"
    version = crd["spec"]["versions"][0]
    assert version["name"] == api.VERSION and version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["memoryBudget"] and schema["required"] == ["spec"]
    assert spec["properties"]["replicas"]["minimum"] == 1
    assert "targetP99" in spec["properties"]["autoscaling"]["properties"]
    assert spec["properties"]["pinned"]["items"]["pattern"]
    assert [r["fieldPath"] for r in spec["x-kubernetes-validations"]] == [
        ".memoryBudget",
        ".resources.gpuProduct",
        ".autoscaling.maxQueueDelay",
        ".autoscaling.maxQueueDelayCooldown",
        ".autoscaling.scaleToZero",
        ".autoscaling.minReplicas",
    ]
    assert set(schema["properties"]["status"]["properties"]) >= {"conditions", "observedGeneration", "models"}
