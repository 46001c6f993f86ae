"""spec.model.task: accepted for huggingface models, refused naming the field for the others, rendered
into runtime.yaml's model.task when set; a spec without it renders the runtime.yaml (and so the config
hash) it rendered before the field existed. spec.model.aggregationStrategy likewise, for token
classifiers only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "minilm.yaml"


def _isvc(model: dict[str, Any]) -> api.InferenceService:
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"].update(namespace="ns1", uid="00000000-0000-0000-0000-000000000001")
    body["spec"]["model"] = model
    return api.InferenceService.from_body(body)


@pytest.mark.parametrize(
    "task", ["text-embedding", "text-classification", "token-classification", "reranking"]
)
def test_a_huggingface_model_takes_a_task(task: str) -> None:
    assert _isvc({"uri": "/models/m", "task": task}).spec.model.task == task


def test_the_task_is_unset_by_default_and_not_rendered() -> None:
    isvc = _isvc({"uri": "default"})
    assert isvc.spec.model.task is None
    assert "task" not in yaml.safe_load(build_configmap(isvc, 0.005)["data"]["runtime.yaml"])["model"]


@pytest.mark.parametrize("task", ["text-classification", "token-classification", "reranking"])
def test_a_set_task_reaches_runtime_yaml(task: str) -> None:
    isvc = _isvc({"uri": "/models/m", "task": task})
    model = yaml.safe_load(build_configmap(isvc, 0.005)["data"]["runtime.yaml"])["model"]
    assert model["task"] == task


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"uri": "/models/m.onnx", "format": "onnx", "task": "reranking"}, "spec.model.task applies"),
        ({"uri": "/models/m", "task": "token-tagging"}, "task"),
    ],
)
def test_a_task_is_refused_naming_the_field(model: dict[str, Any], words: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=words):
        _isvc(model)


def test_the_crd_states_the_task_and_its_rule() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "crds" / "inferenceservices.kubeinfer.io.yaml").read_text()
    )
    model = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "model"
    ]
    assert model["properties"]["task"]["enum"] == [
        "text-embedding",
        "text-classification",
        "token-classification",
        "reranking",
    ]
    rules = {r["rule"]: r for r in model["x-kubernetes-validations"]}
    assert rules["!has(self.task) || self.format == 'huggingface'"]["fieldPath"] == ".task"


@pytest.mark.parametrize("task", [None, "token-classification"])
def test_a_token_classifiers_aggregation_strategy_reaches_runtime_yaml(task: str | None) -> None:
    model_spec: dict[str, Any] = {"uri": "/models/ner", "aggregationStrategy": "simple"}
    if task is not None:
        model_spec["task"] = task
    isvc = _isvc(model_spec)
    assert isvc.spec.model.aggregation_strategy == "simple"
    model = yaml.safe_load(build_configmap(isvc, 0.005)["data"]["runtime.yaml"])["model"]
    assert model["aggregation_strategy"] == "simple"
    plain = yaml.safe_load(build_configmap(_isvc({"uri": "/models/ner"}), 0.005)["data"]["runtime.yaml"])
    assert "aggregation_strategy" not in plain["model"]  # unset: runtime.yaml (and its hash) as before


@pytest.mark.parametrize(
    "model",
    [
        {"uri": "/models/m.onnx", "format": "onnx", "aggregationStrategy": "simple"},
        {"uri": "/models/m", "task": "reranking", "aggregationStrategy": "first"},
        {"uri": "/models/m", "aggregationStrategy": "mean"},
    ],
)
def test_an_aggregation_strategy_is_refused_naming_the_field(model: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError, match="aggregation"):
        _isvc(model)


def test_the_crd_states_the_aggregation_strategy_and_its_rule() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "crds" / "inferenceservices.kubeinfer.io.yaml").read_text()
    )
    model = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "model"
    ]
    assert model["properties"]["aggregationStrategy"]["enum"] == ["none", "simple", "first", "average", "max"]
    rules = {r["fieldPath"]: r for r in model["x-kubernetes-validations"] if "fieldPath" in r}
    rule = rules[".aggregationStrategy"]
    assert "self.task == 'token-classification'" in rule["rule"]
    assert rule["message"].startswith("spec.model.aggregationStrategy applies")
