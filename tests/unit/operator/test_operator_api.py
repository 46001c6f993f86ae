"""The API models: defaults, camelCase, durations and the cross-field rules (mirrors of the CEL rules)."""

from __future__ import annotations

import pydantic
import pytest
from kubeinfer.operator import api


@pytest.mark.parametrize(
    "text, seconds",
    [("10ms", 0.01), ("1.5s", 1.5), ("5m", 300.0), ("1h30m", 5400.0), ("250us", 0.00025), ("0s", 0.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert api.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "-1s", "1d", "ms", "1.s", "10 ms"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        api.parse_duration(text)


@pytest.mark.parametrize("seconds", [0.0, 0.0005, 0.005, 0.0125, 1.0, 90.0, 0.0000001])
def test_format_duration_round_trips(seconds: float) -> None:
    assert api.parse_duration(api.format_duration(seconds)) == pytest.approx(seconds, abs=1e-9)


def test_defaults_and_camel_case() -> None:
    spec = api.InferenceServiceSpec.from_k8s({})
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["batching"] == {
        "maxBatchSize": 32,
        "maxQueueDelay": "5ms",
        "maxQueueSize": 1024,
        "preferredBatchSizes": [],
    }
    assert spec.served_model_name("x") == "minilm"
    assert dumped["server"] == {"grpcPort": 8081}
    assert api.InferenceServiceSpec.from_k8s({"model": {"uri": "/m"}}).served_model_name("x") == "x"


INVALID = [
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas"),
    ({"autoscaling": {"maxQueueDelay": {"min": "60ms", "max": "10ms"}}}, "maxQueueDelay.min"),
    ({"autoscaling": {"gpuUtilization": {"low": 0.9, "high": 0.5}}}, "gpuUtilization.low"),
    ({"quantization": {"mode": "fp16"}, "resources": {"gpus": 0}}, "fp16"),
    ({"runtime": {"device": "cuda"}, "resources": {"gpus": 0}}, "runtime.device"),
    ({"quantization": {"mode": "int8-static"}}, "calibration"),
    ({"model": {"uri": "/m.pt", "format": "torchscript"}}, "model.inputs"),
    ({"model": {"uri": "ftp://host/x"}}, "uri"),
    ({"batching": {"maxQueueDelay": "5 ms"}}, "maxQueueDelay"),
    ({"batching": {"maxBatchSize": 8, "preferredBatchSizes": [16]}}, "preferredBatchSizes"),
    ({"quantization": {"mode": "int4"}}, "mode"),
    ({"resources": {"gpus": 0, "gpuProduct": "NVIDIA-H100-80GB-HBM3"}}, "gpuProduct"),
    ({"server": {"grpcPort": 8080}}, "grpcPort"),
    ({"server": {"grpcPort": 80}}, "grpcPort"),
]


@pytest.mark.parametrize("spec, field", INVALID, ids=[f for _, f in INVALID])
def test_invalid_specs_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field.split(".")[-1]):
        api.InferenceServiceSpec.from_k8s(spec)


def test_pvc_uri() -> None:
    assert api.parse_pvc_uri("pvc://models/a/b.pt") == ("models", "a/b.pt")
    assert api.parse_pvc_uri("/a/b") is None
