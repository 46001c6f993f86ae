"""The CRD files under crds/ and charts/kubeinfer/crds/ match the pydantic models (no drift)."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubeinfer.operator import crdgen

ROOT = Path(__file__).resolve().parents[3]


def test_crds_match_models() -> None:
    assert crdgen.main(["--root", str(ROOT), "--check"]) == 0, (
        "crds/ drifted from operator/api/: run `make crds`"
    )


def _walk(node: object, path: str = "") -> list[str]:
    bad: list[str] = []
    if isinstance(node, dict):
        for key in ("$ref", "anyOf", "oneOf", "allOf", "title", "const"):
            if key in node:
                bad.append(f"{path}.{key}")
        if "properties" in node and node.get("type") != "object":
            bad.append(f"{path}: properties without type object")
        for k, v in node.items():
            bad.extend(_walk(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            bad.extend(_walk(v, f"{path}[{i}]"))
    return bad


def test_schema_is_structural_with_defaults_and_rules() -> None:
    crd = crdgen.inference_service_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []
    spec = schema["properties"]["spec"]
    assert spec["properties"]["batching"]["default"]["maxQueueDelay"] == "5ms"
    assert "default" not in spec["properties"]["quantization"]["properties"]["calibration"]
    assert spec["properties"]["batching"]["properties"]["maxQueueDelay"]["default"] == "5ms"
    assert spec["properties"]["batching"]["properties"]["maxQueueDelay"]["pattern"]
    assert spec["properties"]["quantization"]["properties"]["mode"]["enum"] == [
        "none",
        "fp16",
        "bf16",
        "int8-dynamic",
        "int8-static",
    ]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("fp16" in r for r in rules)
    auto_rules = [r["rule"] for r in spec["properties"]["autoscaling"]["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.maxReplicas" in auto_rules
    env_value_from = spec["properties"]["runtime"]["properties"]["env"]["items"]["properties"]["valueFrom"]
    assert env_value_from["x-kubernetes-preserve-unknown-fields"] is True
    status = schema["properties"]["status"]
    assert "default" not in yaml.safe_dump(status)
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Ready", "Serving", "Replicas", "P99", "Max-Queue-Delay", "Age"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Replicas"]["jsonPath"] == ".status.updatedReady"  # updated-ready/desired: "1/2"
    assert columns["Serving"]["priority"] == 1  # kubectl get -o wide
    assert version["subresources"]["scale"]["statusReplicasPath"] == ".status.replicas"
