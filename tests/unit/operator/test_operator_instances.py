"""A model's instances (``spec.model.instances``, Triton's instance_group count) from the API to the
runtime's file, a service's own and a pooled model's; and ``spec.resources.gpus`` above 1 refused (the
runtime runs every instance on one GPU), on an InferenceService, pooled or not, and on a ModelPool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api, crdgen
from kubeinfer.operator.builders import build_configmap, build_deployment, build_pool_configmap, config_hash
from kubeinfer.runtime.config import CONFIG_FILE, RuntimeConfig
from kubeinfer.runtime.repository import model_config

from kubeinfer.contract.instances import MAX_INSTANCES


def _isvc(model: dict[str, Any] | None = None, **spec: Any) -> api.InferenceService:
    body = {
        "metadata": {"name": "m", "namespace": "ml", "uid": "u-m"},
        "spec": {
            "model": model or {},
            "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
            "runtime": {"device": "cpu"},
            **spec,
        },
    }
    return api.InferenceService.from_body(body)


def _runtime_yaml(isvc: api.InferenceService) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(build_configmap(isvc, 0.005)["data"][CONFIG_FILE])
    return data


def test_the_configmap_carries_the_instances() -> None:
    assert _runtime_yaml(_isvc({"instances": 4}))["instances"] == 4
    assert (
        RuntimeConfig.from_yaml(
            build_configmap(_isvc({"instances": 4}), 0.005)["data"][CONFIG_FILE]
        ).instances
        == 4
    )
    # unset or 1: runtime.yaml has no instances (one, what a runtime from before the field reads too)
    assert "instances" not in _runtime_yaml(_isvc())
    assert build_configmap(_isvc({"instances": 1}), 0.005) == build_configmap(_isvc(), 0.005)


def test_instances_roll_the_pods_and_one_keeps_the_hash() -> None:
    plain = config_hash(_isvc())
    assert config_hash(_isvc({"instances": 1})) == plain
    assert len({plain, config_hash(_isvc({"instances": 2})), config_hash(_isvc({"instances": 3}))}) == 3
    # the pod template's annotation follows the hash; the runtime's args do not change
    two = build_deployment(_isvc({"instances": 2}), replicas=1)
    one = build_deployment(_isvc(), replicas=1)
    assert two["spec"]["template"]["metadata"] != one["spec"]["template"]["metadata"]
    assert (
        two["spec"]["template"]["spec"]["containers"][0]["args"]
        == (one["spec"]["template"]["spec"]["containers"][0]["args"])
    )


def test_a_pooled_models_file_carries_its_instances(tmp_path: Path) -> None:
    pool = api.ModelPool.from_body(
        {
            "metadata": {"name": "small", "namespace": "ml", "uid": "u-pool"},
            "spec": {"memoryBudget": "3Gi", "resources": {"gpus": 0, "cpu": "4", "memory": "6Gi"}},
        }
    )
    models = [
        api.InferenceService.from_body(
            {
                "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}"},
                "spec": {"pool": "small", "model": {"uri": f"/models/{name}", "format": "onnx", **extra}},
            }
        )
        for name, extra in (("three", {"instances": 3}), ("one", {}))
    ]
    data = build_pool_configmap(pool, models)["data"]
    for name, expected in (("three", 3), ("one", 1)):
        (tmp_path / f"{name}.yaml").write_text(data[f"{name}.yaml"])
        # what the pool's runtime gives the model's process
        assert model_config(tmp_path / f"{name}.yaml", name).instances == expected


@pytest.mark.parametrize("value", [0, -1, MAX_INSTANCES + 1])
def test_instances_out_of_bounds_are_refused_naming_the_field(value: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="instances"):
        _isvc({"instances": value})


def test_the_bound_is_the_contracts_on_both_sides() -> None:
    assert _isvc({"instances": MAX_INSTANCES}).spec.model.instances == MAX_INSTANCES
    props = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    schema = props["spec"]["properties"]["model"]["properties"]["instances"]
    assert (schema["minimum"], schema["maximum"]) == (1, MAX_INSTANCES)
    assert "default" not in schema  # unset stays unset: a stored object gains no field
    field = RuntimeConfig.model_fields["instances"]
    assert [getattr(m, "le", None) for m in field.metadata if getattr(m, "le", None)] == [MAX_INSTANCES]


_GPUS_REFUSED = (
    r"spec\.resources\.gpus must be 0 or 1: the runtime runs every instance of the model on one GPU"
)


@pytest.mark.parametrize("gpus", [2, 8, 16])
def test_more_than_one_gpu_is_refused_naming_the_field_and_why(gpus: int) -> None:
    with pytest.raises(pydantic.ValidationError, match=_GPUS_REFUSED):
        _isvc(resources={"gpus": gpus}, runtime={"device": "auto"})
    with pytest.raises(pydantic.ValidationError, match=_GPUS_REFUSED):
        _isvc({"uri": "/models/m"}, pool="small", resources={"gpus": gpus}, runtime={"device": "auto"})
    with pytest.raises(pydantic.ValidationError, match=_GPUS_REFUSED):
        api.ModelPoolSpec.from_k8s({"memoryBudget": "1Gi", "resources": {"gpus": gpus}})


def test_zero_or_one_gpu_is_accepted() -> None:
    assert _isvc(resources={"gpus": 1}, runtime={"device": "cuda"}).spec.resources.gpus == 1
    assert _isvc().spec.resources.gpus == 0
    assert api.ModelPoolSpec.from_k8s({"memoryBudget": "1Gi", "resources": {"gpus": 1}}).resources.gpus == 1
