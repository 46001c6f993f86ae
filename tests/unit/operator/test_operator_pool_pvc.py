"""Pooled models from a PersistentVolumeClaim (``pvc://<claim>/<path>`` on an InferenceService with
``spec.pool``): the pool's Deployment mounts each claim its models name once, read-only, where an
InferenceService's own pod mounts it; the ConfigMap names the mounted path; a model joining on a claim
already mounted changes the ConfigMap only; the API accepts the registry's pooled schemes on a pool and
refuses the others (pydantic here, the CRD's CEL rule checked as text; the API server runs it in
tests/integration/operator/test_operator_pool.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
from kubeinfer.operator import api, crdgen
from kubeinfer.operator.builders import build_deployment, build_pool_configmap, build_pool_deployment
from kubeinfer.operator.builders.common import PVC_MOUNT_ROOT
from kubeinfer.operator.builders.pool import pool_claims
from kubeinfer.operator.reconcile import pool as planner
from kubeinfer.runtime.repository import model_config

from kubeinfer.contract import sources as contract
from kubeinfer.contract.sources import SourceScheme

POOL = api.ModelPool.from_body(
    {
        "metadata": {"name": "small", "namespace": "ml", "uid": "u-pool", "generation": 1},
        "spec": {"memoryBudget": "3Gi", "resources": {"gpus": 0, "cpu": "4", "memory": "6Gi"}},
    }
)


def _body(name: str, uri: str, pool: str | None = "small", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1},
        "spec": {**({"pool": pool} if pool else {}), "model": {"uri": uri, "format": "onnx"}, **spec},
    }


def _isvc(name: str, uri: str, **spec: Any) -> api.InferenceService:
    return api.InferenceService.from_body(_body(name, uri, **spec))


def _template(models: list[api.InferenceService]) -> dict[str, Any]:
    """The pool's pod template for ``models``, as the reconciler builds it."""
    members = planner.pool_members("small", "ml", [_body(m.name, m.spec.model.uri) for m in models])
    dep = build_pool_deployment(
        POOL, planner.pinned_in_force(POOL, members), claims=pool_claims(members.models)
    )
    template: dict[str, Any] = dep["spec"]["template"]
    return template


MODELS = [
    _isvc("bert", "pvc://models/bert"),
    _isvc("resnet", "pvc://models/cv/resnet.onnx"),
    _isvc("old", "pvc://archive/old.onnx"),
    _isvc("local", "/models/local"),
]


def test_the_pool_mounts_each_claim_once_read_only_sorted() -> None:
    assert pool_claims(MODELS) == ["archive", "models"]
    spec = _template(MODELS)["spec"]
    claims = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [
        {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "archive", "readOnly": True}},
        {"name": "pvc-1", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
    ]
    (container,) = spec["containers"]
    mounts = [m for m in container["volumeMounts"] if m["name"].startswith("pvc-")]
    assert mounts == [
        {"name": "pvc-0", "mountPath": f"{PVC_MOUNT_ROOT}/archive", "readOnly": True},
        {"name": "pvc-1", "mountPath": f"{PVC_MOUNT_ROOT}/models", "readOnly": True},
    ]
    # where an InferenceService's own pod mounts the same claim
    own = build_deployment(
        api.InferenceService.from_body(_body("bert", "pvc://models/bert", pool=None)), replicas=1
    )
    own_spec = own["spec"]["template"]["spec"]
    (own_mount,) = [m for m in own_spec["containers"][0]["volumeMounts"] if m["name"].startswith("pvc-")]
    assert own_mount["mountPath"] == mounts[1]["mountPath"] and own_mount["readOnly"]
    # a pool of models from its image mounts no claim
    assert not [v for v in _template([MODELS[3]])["spec"]["volumes"] if "persistentVolumeClaim" in v]


def test_a_calibration_claim_is_mounted_too() -> None:
    calibrated = _isvc(
        "q",
        "/models/q",
        model={"uri": "/models/q", "format": "huggingface"},
        quantization={"mode": "int8-static", "calibration": {"uri": "pvc://calib/texts.jsonl"}},
    )
    assert pool_claims([calibrated, MODELS[0]]) == ["calib", "models"]


def test_the_configmap_names_the_mounted_paths(tmp_path: Path) -> None:
    cm = build_pool_configmap(POOL, MODELS)
    expected = {
        "bert": f"{PVC_MOUNT_ROOT}/models/bert",
        "resnet": f"{PVC_MOUNT_ROOT}/models/cv/resnet.onnx",
        "old": f"{PVC_MOUNT_ROOT}/archive/old.onnx",
        "local": "/models/local",
    }
    for name, path in expected.items():
        (tmp_path / f"{name}.yaml").write_text(cm["data"][f"{name}.yaml"])
        assert model_config(tmp_path / f"{name}.yaml", name).model.source == path


def test_a_model_joining_on_a_mounted_claim_changes_the_configmap_only() -> None:
    one = MODELS[:1]
    two = MODELS[:2]  # resnet: on the claim bert already mounts
    assert _template(one) == _template(two)
    assert build_pool_configmap(POOL, one)["data"] != build_pool_configmap(POOL, two)["data"]
    # a claim named for the first time changes the template (one rollout of the pool)
    assert _template(MODELS[:3]) != _template(two)


@pytest.mark.parametrize("uri", ["default", "/models/bert", "pvc://models/bert", "pvc://m/a/b.onnx"])
def test_a_pool_accepts_its_image_and_its_mounted_claims(uri: str) -> None:
    spec = api.InferenceServiceSpec.from_k8s({"pool": "small", "model": {"uri": uri}})
    assert spec.model.uri == uri and api.is_pooled_uri(uri)


@pytest.mark.parametrize(
    "model",
    [
        {"uri": "s3://bucket/model/"},
        {"uri": "https://example.com/m.onnx"},
        {"uri": "http://example.com/m.onnx", "allowInsecureHttp": True},
        {"uri": "hf://org/model"},
        {"uri": "oci://registry.example.com/models/bert:1"},
    ],
)
def test_a_pool_refuses_fetched_and_image_sources(model: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        api.InferenceServiceSpec.from_k8s({"pool": "small", "model": model})
    assert api.pooled_uri_message() in str(err.value)
    assert not api.is_pooled_uri(model["uri"])
    # without a pool, the same model is fine
    api.InferenceServiceSpec.from_k8s({"model": model})


def test_the_refusal_names_the_registry_s_schemes() -> None:
    assert contract.pooled_schemes() == ("pvc",)
    assert api.pooled_uri_message() == (
        "spec.model.uri of an InferenceService with spec.pool must be 'default', an absolute path in the "
        "pool's image or a pvc:// URI (mounted by the pool's pods): a pool does not fetch or mount s3://, "
        "https://, http://, hf:// or oci:// models yet"
    )


def test_the_crd_rule_is_the_registry_s() -> None:
    schema = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    (rule,) = [r for r in rules if r["fieldPath"] == ".model.uri" and "has(self.pool)" in r["rule"]]
    assert rule["rule"] == (
        "!has(self.pool) || self.model.uri == 'default' || self.model.uri.startsWith('/') || "
        "self.model.uri.startsWith('pvc://')"
    )
    assert rule["message"] == api.pooled_uri_message()


def test_a_pooled_row_comes_from_the_registry() -> None:
    with pytest.raises(ValueError, match="only a mounted scheme is pooled"):
        SourceScheme(
            name="toy",
            uri_pattern=r"[a-z]+",
            settings=("fetch",),
            backend="tests.x:fetch",
            pooled=True,
        )
    contract.register(
        SourceScheme(name="toyvol", uri_pattern=r"[a-z]+/.+", mounted="a toy volume", pooled=True)
    )
    try:
        assert api.is_pooled_uri("toyvol://shelf/bert")
        assert (
            api.pooled_uri_cel("u") == "u == 'default' || u.startsWith('/') || u.matches('^(pvc|toyvol)://')"
        )
        assert "a pvc:// or toyvol:// URI" in api.pooled_uri_message()
    finally:
        contract.unregister("toyvol")
    assert not api.is_pooled_uri("toyvol://shelf/bert")
