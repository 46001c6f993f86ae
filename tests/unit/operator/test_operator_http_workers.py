"""``spec.server.httpWorkers`` and ``spec.model.instances``: the defaults from the replica's CPUs (and GPU),
the explicit values, and what the operator renders into the runtime's configuration (``server.http_workers``,
``instances``)."""

from __future__ import annotations

import pydantic
import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders.configmap import build_configmap, config_hash


@pytest.mark.parametrize(
    ("quantity", "cores"),
    [("2", 2.0), ("500m", 0.5), ("1.5", 1.5), ("4000m", 4.0), ("1e1", 10.0), ("2k", 2000.0), ("1Ki", 1024.0)],
)
def test_cpu_cores(quantity: str, cores: float) -> None:
    assert api.cpu_cores(quantity) == pytest.approx(cores)


def test_cpu_cores_refuses_what_is_no_quantity() -> None:
    with pytest.raises(ValueError, match="quantity"):
        api.cpu_cores("-1")


@pytest.mark.parametrize(
    ("cpu", "workers"),
    [("500m", 1), ("1", 1), ("2", 1), ("3900m", 1), ("4", 2), ("7", 3), ("16", 8), ("64", 8)],
)
def test_default_is_one_front_end_per_two_cpus_at_most_eight(cpu: str, workers: int) -> None:
    spec = api.InferenceServiceSpec.from_k8s(
        {"resources": {"cpu": cpu, "gpus": 0}, "runtime": {"device": "cpu"}}
    )
    assert spec.http_workers_in_force() == workers


@pytest.mark.parametrize(
    ("resources", "instances"),
    [
        ({"cpu": "2", "gpus": 0}, 2),
        ({"cpu": "16", "gpus": 0}, 2),
        ({"cpu": "1900m", "gpus": 0}, 1),
        ({"cpu": "500m", "gpus": 0}, 1),
        ({"cpu": "4", "gpus": 1}, 1),  # a GPU's instances share the one device
        ({}, 1),  # the default replica has a GPU
    ],
)
def test_default_instances_are_two_on_a_cpu_replica_of_two_cpus_or_more(
    resources: dict[str, object], instances: int
) -> None:
    spec = api.InferenceServiceSpec.from_k8s({"resources": resources})
    assert spec.instances_in_force() == instances
    told = api.InferenceServiceSpec.from_k8s({"resources": resources, "model": {"instances": 3}})
    assert told.instances_in_force() == 3


def test_default_instances_are_rendered_and_one_keeps_the_old_file_and_hash() -> None:
    cpu = _isvc({"resources": {"cpu": "2", "gpus": 0}})
    assert yaml.safe_load(build_configmap(cpu, 0.005)["data"]["runtime.yaml"])["instances"] == 2
    assert config_hash(cpu) == config_hash(
        _isvc({"resources": {"cpu": "2", "gpus": 0}, "model": {"instances": 2}})
    )
    assert config_hash(cpu) != config_hash(
        _isvc({"resources": {"cpu": "2", "gpus": 0}, "model": {"instances": 1}})
    )
    small = _isvc({"resources": {"cpu": "1", "gpus": 0}})  # one instance: the file as before the default
    assert "instances" not in yaml.safe_load(build_configmap(small, 0.005)["data"]["runtime.yaml"])
    assert config_hash(small) == config_hash(
        _isvc({"resources": {"cpu": "1", "gpus": 0}, "model": {"instances": 1}})
    )


def test_explicit_value_wins_and_is_bounded() -> None:
    spec = api.InferenceServiceSpec.from_k8s({"server": {"httpWorkers": 3}, "resources": {"cpu": "1"}})
    assert spec.http_workers_in_force() == 3
    for bad in (0, 65):
        with pytest.raises(pydantic.ValidationError, match="httpWorkers"):
            api.InferenceServiceSpec.from_k8s({"server": {"httpWorkers": bad}})


def _isvc(spec: dict[str, object]) -> api.InferenceService:
    return api.InferenceService.from_body(
        {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1}, "spec": spec}
    )


def test_rendered_into_the_runtime_config_and_one_keeps_the_old_file_and_hash() -> None:
    default = _isvc({})
    text = build_configmap(default, 0.005)["data"]["runtime.yaml"]
    assert "http_workers" not in yaml.safe_load(text)["server"]  # default CPU 2: one process, as before
    four = _isvc({"resources": {"cpu": "4"}})
    assert yaml.safe_load(build_configmap(four, 0.005)["data"]["runtime.yaml"])["server"]["http_workers"] == 2
    # a worker count change rolls the pods (it needs a restart); one worker hashes as before the field
    assert config_hash(four) != config_hash(_isvc({"resources": {"cpu": "4"}, "server": {"httpWorkers": 1}}))
    assert config_hash(default) == config_hash(_isvc({"server": {"httpWorkers": 1}}))
