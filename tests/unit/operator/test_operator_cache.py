"""spec.cache: rendered into runtime.yaml's cache section (and only when on), a change rolls the pods,
a size below the runtime's minimum is refused naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap, build_deployment
from kubeinfer.runtime.config import RuntimeConfig

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "minilm.yaml"


def _isvc(cache: dict[str, Any] | None) -> api.InferenceService:
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"].update(namespace="ns1", uid="00000000-0000-0000-0000-000000000001")
    if cache is not None:
        body["spec"]["cache"] = cache
    return api.InferenceService.from_body(body)


def _runtime_yaml(isvc: api.InferenceService) -> str:
    text: str = build_configmap(isvc, isvc.spec.max_queue_delay_in_force(None))["data"]["runtime.yaml"]
    return text


def test_the_cache_is_rendered_only_when_on_and_a_change_rolls_the_pods() -> None:
    off = _isvc(None)
    assert "cache" not in yaml.safe_load(_runtime_yaml(off))  # the file reads as before the cache
    on = _isvc({"enabled": True, "maxBytes": "256Mi"})
    cfg = RuntimeConfig.from_yaml(_runtime_yaml(on))
    assert cfg.cache.enabled and cfg.cache.max_bytes == 256 * 2**20
    assert _isvc({"enabled": True}).spec.cache.max_bytes == "64Mi"
    template = lambda isvc: build_deployment(isvc, replicas=1)["spec"]["template"]  # noqa: E731
    assert template(off) != template(on)  # the cache is read at start: a change rolls the pods
    assert _runtime_yaml(off) == _runtime_yaml(_isvc({"enabled": False, "maxBytes": "1Gi"}))


@pytest.mark.parametrize("size", ["512", "1000", "1k"])
def test_a_cache_below_the_runtimes_minimum_is_refused_naming_the_field(size: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=r"spec\.cache\.maxBytes must be at least 1024 bytes"):
        _isvc({"enabled": True, "maxBytes": size})
    schema = yaml.safe_load((EXAMPLE.parents[1] / "crds" / "inferenceservices.kubeinfer.io.yaml").read_text())
    spec = schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["properties"]["cache"]["x-kubernetes-validations"]
    assert [r["fieldPath"] for r in rules] == [".maxBytes"] and "quantity(self.maxBytes)" in rules[0]["rule"]
