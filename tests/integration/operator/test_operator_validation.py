"""The API server refuses invalid InferenceServices (schema + CEL) with a message naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.support.cluster import Cluster

BASE: dict[str, Any] = {
    "apiVersion": "kubeinfer.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "bad"},
    "spec": {"resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"}, "runtime": {"device": "cpu"}},
}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


_IO = {"name": "x", "datatype": "FP32", "shape": [-1, 2]}
#: What a quantization mode needs beside it (int8-static: its calibration texts).
CALIBRATION: dict[str, dict[str, Any]] = {"int8-static": {"calibration": {"uri": "/data/calibration.txt"}}}

INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "min>max",
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "spec.autoscaling.minReplicas",
    ),
    (
        "timeout-bounds",
        {"autoscaling": {"maxQueueDelay": {"min": "60ms", "max": "10ms"}}},
        "spec.autoscaling.maxQueueDelay.min",
    ),
    (
        "gpu-band",
        {"autoscaling": {"gpuUtilization": {"low": 0.9, "high": 0.5}}},
        "spec.autoscaling.gpuUtilization.low",
    ),
    ("fp16-no-gpu", {"quantization": {"mode": "fp16"}}, "spec.quantization.mode"),
    ("cuda-no-gpu", {"runtime": {"device": "cuda"}}, "spec.runtime.device"),
    (
        "int8-static-no-calibration",
        {"quantization": {"mode": "int8-static"}},
        "spec.quantization.calibration",
    ),
    ("torchscript-no-io", {"model": {"uri": "/models/m.pt", "format": "torchscript"}}, "spec.model.inputs"),
    (
        "onnx-quantized",
        {"model": {"uri": "/models/m.onnx", "format": "onnx"}, "quantization": {"mode": "int8-dynamic"}},
        "spec.quantization.mode",
    ),
    ("onnx-default-uri", {"model": {"format": "onnx"}}, "spec.model.uri"),
    ("cache-too-small", {"cache": {"enabled": True, "maxBytes": "512"}}, "spec.cache.maxBytes"),
    (
        "aggregation-on-onnx",
        {"model": {"uri": "/m.onnx", "format": "onnx", "aggregationStrategy": "simple"}},
        "spec.model.aggregationStrategy",
    ),
    (
        "aggregation-on-reranker",
        {"model": {"uri": "/m", "task": "reranking", "aggregationStrategy": "simple"}},
        "spec.model.aggregationStrategy",
    ),
    (
        "overflow-on-onnx",
        {"model": {"uri": "/m.onnx", "format": "onnx", "overflow": "truncate"}},
        "spec.model.overflow",
    ),
    (
        "chunk-on-reranker",
        {"model": {"uri": "/m", "task": "reranking", "overflow": "chunk"}},
        "spec.model.overflow",
    ),
    (
        "chunk-on-tagger-without-strategy",
        {"model": {"uri": "/m", "task": "token-classification", "overflow": "chunk"}},
        "spec.model.aggregationStrategy",
    ),
    ("text-tokens-zero", {"model": {"maxTextTokens": 0}}, "spec.model.maxTextTokens"),
    ("gate-over-one", {"quantization": {"gate": {"minCosine": 1.5}}}, "spec.quantization.gate.minCosine"),
    (
        "gate-texts-bad-key",
        {"quantization": {"gate": {"texts": {"name": "texts", "key": "a/b"}}}},
        "spec.quantization.gate.texts.key",
    ),
    (
        "onnxruntime-torchscript",
        {
            "model": {"uri": "/m.pt", "format": "torchscript", "inputs": [_IO], "outputs": [_IO]},
            "runtime": {"engine": "onnxruntime"},
        },
        "spec.runtime.engine",
    ),
    (
        "torch-onnx",
        {"model": {"uri": "/m.onnx", "format": "onnx"}, "runtime": {"engine": "torch"}},
        "spec.runtime.engine",
    ),
    (
        "onnxruntime-pt2",
        {"model": {"uri": "/m.pt2", "format": "pt2"}, "runtime": {"engine": "onnxruntime"}},
        "spec.runtime.engine",
    ),
    (
        "pt2-quantized",
        {"model": {"uri": "/models/m.pt2", "format": "pt2"}, "quantization": {"mode": "int8-dynamic"}},
        "spec.quantization.mode",
    ),
    ("pt2-default-uri", {"model": {"format": "pt2"}}, "spec.model.uri"),
    ("warmup-dims-on-huggingface", {"warmup": {"dims": [16, 128]}}, "spec.warmup.dims"),
    (
        "warmup-dims-zero",
        {"model": {"uri": "/m.onnx", "format": "onnx"}, "warmup": {"dims": [0]}},
        "spec.warmup.dims",
    ),
    (
        "onnxruntime-skip-modules",
        {
            "quantization": {"mode": "int8-dynamic", "skipModules": ["encoder.layer.5"]},
            "runtime": {"device": "cpu", "engine": "onnxruntime"},
        },
        "spec.runtime.engine",
    ),
    (
        "onnxruntime-bf16",
        {"quantization": {"mode": "bf16"}, "runtime": {"device": "cpu", "engine": "onnxruntime"}},
        "spec.runtime.engine",
    ),
    ("bad-uri", {"model": {"uri": "ftp://host/model"}}, "spec.model.uri"),
    ("bad-pvc-uri", {"model": {"uri": "pvc://Bad_Claim/x"}}, "spec.model.uri"),
    ("bad-duration", {"batching": {"maxQueueDelay": "5 ms"}}, "spec.batching.maxQueueDelay"),
    ("bad-quantization", {"quantization": {"mode": "int4"}}, "spec.quantization.mode"),
    (
        "preferred>max",
        {"batching": {"maxBatchSize": 8, "preferredBatchSizes": [16]}},
        "spec.batching.preferredBatchSizes",
    ),
    ("product-no-gpu", {"resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}}, "spec.resources.gpuProduct"),
    ("batch-size-0", {"batching": {"maxBatchSize": 0}}, "spec.batching.maxBatchSize"),
    ("bad-memory", {"resources": {"memory": "lots"}}, "spec.resources.memory"),
    ("zero-target", {"autoscaling": {"targetP99": "0s"}}, "spec.autoscaling.targetP99"),
    ("queue-delay>10s", {"batching": {"maxQueueDelay": "11s"}}, "spec.batching.maxQueueDelay"),
    ("typo-field", {"modle": {"uri": "default"}}, "spec.modle"),
]


@pytest.mark.parametrize("spec_patch, field", [(p, f) for _, p, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_manifest_is_refused_naming_the_field(
    cluster: Cluster, crds: None, namespace: str, spec_patch: dict[str, Any], field: str
) -> None:
    manifest = _merge(BASE, {"spec": spec_patch})
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr, result.stderr


def test_valid_minimal_manifest_gets_defaults(cluster: Cluster, crds: None, namespace: str) -> None:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-o", "yaml", "-f", "-", input=yaml.safe_dump(BASE)
    )
    spec = yaml.safe_load(result.stdout)["spec"]
    assert spec["batching"]["maxQueueDelay"] == "5ms"
    assert spec["autoscaling"]["enabled"] is False
    assert spec["model"]["uri"] == "default"


@pytest.mark.parametrize(
    "task, mode",
    [
        (task, mode)
        for task in ("text-embedding", "text-classification", "reranking", "token-classification")
        for mode in ("none", "int8-dynamic", "int8-static")
    ],
)
def test_every_huggingface_task_is_accepted_on_onnxruntime(
    cluster: Cluster, crds: None, namespace: str, task: str, mode: str
) -> None:
    manifest = _merge(
        BASE,
        {
            "spec": {
                "model": {"uri": "/models/m", "task": task},
                "quantization": {"mode": mode, **CALIBRATION.get(mode, {})},
                "runtime": {"engine": "onnxruntime"},
            }
        },
    )
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-o", "yaml", "-f", "-", input=yaml.safe_dump(manifest)
    )
    spec = yaml.safe_load(result.stdout)["spec"]
    assert (spec["model"]["task"], spec["runtime"]["engine"], spec["quantization"]["mode"]) == (
        task,
        "onnxruntime",
        mode,
    )


def test_warmup_dims_are_accepted_for_a_tensor_model(cluster: Cluster, crds: None, namespace: str) -> None:
    manifest = _merge(
        BASE,
        {"spec": {"model": {"uri": "/models/m.onnx", "format": "onnx"}, "warmup": {"dims": [16, 128]}}},
    )
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-o", "yaml", "-f", "-", input=yaml.safe_dump(manifest)
    )
    assert yaml.safe_load(result.stdout)["spec"]["warmup"] == {"enabled": True, "steps": 1, "dims": [16, 128]}
