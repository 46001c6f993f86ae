"""spec.runtime.engine: rendered into runtime.yaml's model.engine only when set; the combinations the
runtime cannot serve are refused naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap
from kubeinfer.runtime.config import RuntimeConfig

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "minilm.yaml"


def _isvc(spec: dict[str, Any]) -> api.InferenceService:
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"].update(namespace="ns1", uid="00000000-0000-0000-0000-000000000001")
    body["spec"].update(spec)
    return api.InferenceService.from_body(body)


def _runtime(isvc: api.InferenceService) -> RuntimeConfig:
    text = build_configmap(isvc, isvc.spec.max_queue_delay_in_force(None))["data"]["runtime.yaml"]
    return RuntimeConfig.from_yaml(text)


def test_the_engine_is_rendered_only_when_set() -> None:
    base = {"quantization": {"mode": "none"}}
    assert (
        "engine" not in yaml.safe_load(build_configmap(_isvc(base), 0.005)["data"]["runtime.yaml"])["model"]
    )
    on = _isvc({**base, "runtime": {"device": "cpu", "engine": "onnxruntime"}})
    assert _runtime(on).model.engine == "onnxruntime"


@pytest.mark.parametrize(
    "spec",
    [
        {"quantization": {"mode": "bf16"}, "runtime": {"device": "cpu", "engine": "onnxruntime"}},
        {"quantization": {"mode": "none"}, "resources": {"gpus": 1}, "runtime": {"engine": "onnxruntime"}},
        {
            "quantization": {"mode": "int8-dynamic", "skipModules": ["encoder.layer.5"]},
            "runtime": {"device": "cpu", "engine": "onnxruntime"},
        },
        {
            "model": {"uri": "/m.onnx", "format": "onnx"},
            "quantization": {"mode": "none"},
            "runtime": {"engine": "torch"},
        },
        {
            "model": {"uri": "/m.pt2", "format": "pt2"},
            "quantization": {"mode": "none"},
            "runtime": {"device": "cpu", "engine": "onnxruntime"},
        },
    ],
)
def test_what_the_engine_cannot_serve_is_refused_naming_the_field(spec: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError, match=r"spec\.runtime\.engine"):
        _isvc(spec)


def test_a_pt2_model_needs_no_declared_tensors_runs_on_torch_and_is_served_as_exported() -> None:
    isvc = _isvc({"model": {"uri": "/models/simple.pt2", "format": "pt2"}, "quantization": {"mode": "none"}})
    model = _runtime(isvc).model
    assert (model.format, model.engine, model.inputs, model.outputs) == ("pt2", None, [], [])
    on_torch = _isvc(
        {**isvc.spec.model_dump(by_alias=True, exclude_none=True), "runtime": {"engine": "torch"}}
    )
    assert _runtime(on_torch).model.engine == "torch"
    for spec, field in (
        (
            {"model": {"uri": "/m.pt2", "format": "pt2"}, "quantization": {"mode": "int8-dynamic"}},
            "quantization.mode",
        ),
        ({"model": {"format": "pt2"}, "quantization": {"mode": "none"}}, "model.uri"),
    ):
        with pytest.raises(pydantic.ValidationError, match=rf"spec\.{field}.*pt2"):
            _isvc(spec)


@pytest.mark.parametrize(
    "task", ["text-embedding", "text-classification", "reranking", "token-classification"]
)
@pytest.mark.parametrize("mode", ["none", "int8-dynamic", "int8-static"])
def test_every_huggingface_task_runs_on_onnxruntime(task: str, mode: str) -> None:
    calibration = {"calibration": {"uri": "/data/calibration.txt"}} if mode == "int8-static" else {}
    isvc = _isvc(
        {
            "model": {"uri": "/models/m", "task": task},
            "quantization": {"mode": mode, **calibration},
            "runtime": {"device": "cpu", "engine": "onnxruntime"},
        }
    )
    model = _runtime(isvc).model
    assert (model.task, model.engine) == (task, "onnxruntime")


def test_warmup_dims_reach_the_runtime_and_the_startup_budget() -> None:
    from kubeinfer.operator.builders.deployment import WARMUP_STEP_BUDGET_SECONDS, startup_budget_seconds

    model = {"uri": "/models/simple.onnx", "format": "onnx"}
    plain = _isvc({"model": model, "quantization": {"mode": "none"}})
    swept = _isvc(
        {"model": model, "quantization": {"mode": "none"}, "warmup": {"steps": 2, "dims": [16, 64, 256]}}
    )
    assert _runtime(plain).warmup.dims is None and _runtime(swept).warmup.dims == [16, 64, 256]
    # every size is a pass of every step: the startupProbe allows for each
    assert startup_budget_seconds(swept) - startup_budget_seconds(plain) == WARMUP_STEP_BUDGET_SECONDS * (
        6 - 1
    )
    with pytest.raises(
        pydantic.ValidationError, match=r"spec\.warmup\.dims applies to onnx, pt2 and torchscript"
    ):
        _isvc({"quantization": {"mode": "none"}, "warmup": {"dims": [16]}})


def test_warmup_before_ready_reaches_the_runtime_and_unset_leaves_the_file_and_hash_as_they_were() -> None:
    from kubeinfer.operator.builders.configmap import config_hash

    def _text(isvc: api.InferenceService) -> str:
        return str(build_configmap(isvc, 0.005)["data"]["runtime.yaml"])

    plain = _isvc({})
    first, every = (_isvc({"warmup": {"beforeReady": value}}) for value in ("first", "all"))
    assert _runtime(plain).warmup.before_ready is None and "before_ready" not in _text(plain)
    assert _runtime(every).warmup.before_ready == "all" and "before_ready: all" in _text(every)
    # a setting is a pod-template change (the runtime reads it at start); unset keeps the old hash
    assert len({config_hash(plain), config_hash(first), config_hash(every)}) == 3
    with pytest.raises(pydantic.ValidationError, match="beforeReady"):
        _isvc({"warmup": {"beforeReady": "some"}})
