"""The pod template's config hash is stable across operator releases: runtime fields added at their
default (the cache, the engine, authentication, front-end processes) leave it as it was, so upgrading
the operator rolls no pod. The pinned values are what the operator computed for the examples before
those fields existed (commit fe5fd4a). One default changed since: two model instances on a replica
without a GPU of two CPUs or more (``spec.model.instances``), which rolls such a service's pods once
unless it pins ``instances: 1``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders.configmap import config_hash

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

#: config_hash of each example as the operator of fe5fd4a computed it.
BEFORE = {
    "gpu-fp16.yaml": "80413779a111508e",
    "int8-static.yaml": "1b37846ef3fa3eaf",
    "minilm.yaml": "09d6a21bded23b53",
    "pvc-torchscript.yaml": "68c7c5eb8dac45c0",
}


def _isvc(name: str, **spec: object) -> api.InferenceService:
    body = copy.deepcopy(yaml.safe_load((EXAMPLES / name).read_text()))
    body["metadata"].update(namespace="ns1", uid="00000000-0000-0000-0000-000000000001")
    body["spec"].update(spec)
    return api.InferenceService.from_body(body)


#: The examples on a replica without a GPU of two CPUs or more: their default is two instances now.
TWO_INSTANCES = {"int8-static.yaml"}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_an_upgrade_keeps_every_example_pods_hash(name: str) -> None:
    if name not in TWO_INSTANCES:
        assert config_hash(_isvc(name)) == BEFORE[name]
        return
    # the changed default alone moves the hash: with one instance pinned it is as before
    model = {**yaml.safe_load((EXAMPLES / name).read_text())["spec"]["model"], "instances": 1}
    assert config_hash(_isvc(name)) != BEFORE[name]
    assert config_hash(_isvc(name, model=model)) == BEFORE[name]


def test_turning_a_new_field_on_changes_the_hash() -> None:
    base = config_hash(_isvc("minilm.yaml"))
    assert config_hash(_isvc("minilm.yaml", cache={"enabled": True})) != base
    assert config_hash(_isvc("minilm.yaml", cache={"enabled": False, "maxBytes": "1Gi"})) == base
