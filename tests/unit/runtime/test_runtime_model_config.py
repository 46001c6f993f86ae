"""The model configuration in Triton's schema (``kubeinfer.runtime.model_config``), for the tensors each
format and task declares: every document parses into ``tritonclient``'s ``ModelConfig`` with no field
unknown to Triton's ``model_config.proto``, and says what the runtime does."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.dtypes import DATATYPES
from kubeinfer.runtime.model_config import DATA_TYPES, model_config_doc, tensor_config
from tritonclient.grpc import model_config_pb2


def meta(
    platform: str, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]]
) -> dict[str, Any]:
    """A v2 model metadata document as ``dataplane.model_metadata_doc`` writes it."""
    return {
        "name": "m",
        "versions": ["1"],
        "platform": platform,
        "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
        "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs],
    }


def parsed(doc: dict[str, Any]) -> Any:
    """``doc`` as Triton's ``ModelConfig``: ParseDict refuses any field name the schema lacks."""
    return json_format.ParseDict(doc, model_config_pb2.ModelConfig())


#: (format/task, metadata, optional inputs, the expected (name, data_type, dims) of inputs and outputs).
SHAPES: list[
    tuple[str, dict[str, Any], set[str], list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]
] = [
    (
        "huggingface text-embedding (torch)",
        meta("pytorch", [("text", "BYTES", [-1])], [("embedding", "FP32", [-1, 384])]),
        set(),
        [("text", "TYPE_STRING", [1])],
        [("embedding", "TYPE_FP32", [384])],
    ),
    (
        "huggingface text-classification (onnx engine)",
        meta(
            "onnxruntime_onnx",
            [("text", "BYTES", [-1])],
            [("label", "BYTES", [-1]), ("score", "FP32", [-1]), ("logits", "FP32", [-1, 3])],
        ),
        set(),
        [("text", "TYPE_STRING", [1])],
        [("label", "TYPE_STRING", [1]), ("score", "TYPE_FP32", [1]), ("logits", "TYPE_FP32", [3])],
    ),
    (
        "huggingface reranking",
        meta("pytorch", [("query", "BYTES", [-1]), ("text", "BYTES", [-1])], [("score", "FP32", [-1])]),
        set(),
        [("query", "TYPE_STRING", [1]), ("text", "TYPE_STRING", [1])],
        [("score", "TYPE_FP32", [1])],
    ),
    (
        "huggingface token-classification",
        meta(
            "pytorch",
            [("text", "BYTES", [-1]), ("aggregation_strategy", "BYTES", [1])],
            [("entities", "BYTES", [-1])],
        ),
        {"aggregation_strategy"},
        [("text", "TYPE_STRING", [1]), ("aggregation_strategy", "TYPE_STRING", [1])],
        [("entities", "TYPE_STRING", [1])],
    ),
    (
        "onnx (variable dimension)",
        meta("onnxruntime_onnx", [("x", "FP32", [-1, -1, 8])], [("y", "FP16", [-1, 4])]),
        set(),
        [("x", "TYPE_FP32", [-1, 8])],
        [("y", "TYPE_FP16", [4])],
    ),
    (
        "pt2 (Triton's simple model)",
        meta(
            "pytorch",
            [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])],
            [("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])],
        ),
        set(),
        [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])],
        [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])],
    ),
    (
        "torchscript (declared tensors)",
        meta("pytorch", [("x", "BF16", [-1, 4]), ("k", "INT64", [-1])], [("y", "BOOL", [-1, 2, 2])]),
        set(),
        [("x", "TYPE_BF16", [4]), ("k", "TYPE_INT64", [1])],
        [("y", "TYPE_BOOL", [2, 2])],
    ),
]


@pytest.mark.parametrize(
    ("what", "metadata", "optional", "inputs", "outputs"), SHAPES, ids=[s[0] for s in SHAPES]
)
def test_each_format_and_task_is_described_in_tritons_schema(
    what: str,
    metadata: dict[str, Any],
    optional: set[str],
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
) -> None:
    settings = BatchSettings(max_batch_size=16, max_queue_delay_seconds=0.0025, preferred_batch_sizes=(4, 8))
    doc = model_config_doc(metadata, settings, optional_inputs=optional)
    config = parsed(doc)
    assert config.name == "m" and config.platform == metadata["platform"]
    assert config.backend == ("onnxruntime" if metadata["platform"] == "onnxruntime_onnx" else "pytorch")
    assert config.max_batch_size == 16
    got_in = [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.input]
    got_out = [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.output]
    assert (got_in, got_out) == (inputs, outputs)
    for tensor in [*config.input, *config.output]:
        # dims [1] that stand for no dimension beyond the batch say so with an empty reshape
        spec = next(s for s in [*metadata["inputs"], *metadata["outputs"]] if s["name"] == tensor.name)
        assert tensor.HasField("reshape") == (len(spec["shape"]) == 1)
        if tensor.HasField("reshape"):
            assert list(tensor.reshape.shape) == []
    assert {t.name for t in config.input if t.optional} == optional
    batching = config.dynamic_batching
    assert batching.max_queue_delay_microseconds == 2500
    assert list(batching.preferred_batch_size) == [4, 8]
    assert (batching.priority_levels, batching.default_priority_level) == (2, 2)


def test_the_scheduler_reports_priorities_queue_limits_instances_and_the_cache() -> None:
    metadata = meta("pytorch", [("x", "FP32", [-1, 2])], [("y", "FP32", [-1, 2])])
    settings = BatchSettings(
        max_batch_size=8,
        max_queue_delay_seconds=0.0000014,  # rounded to the microsecond
        max_queue_size=100,
        priority_levels=3,
        default_priority_level=2,
        priority_queue_sizes={3: 5, 1: 50},
    )
    doc = model_config_doc(metadata, settings, instances=2, device="cuda:1", cache=True)
    config = parsed(doc)
    batching = config.dynamic_batching
    assert batching.max_queue_delay_microseconds == 1
    assert (batching.priority_levels, batching.default_priority_level) == (3, 2)
    assert {k: v.max_queue_size for k, v in batching.priority_queue_policy.items()} == {1: 50, 3: 5}
    assert all(v.allow_timeout_override for v in batching.priority_queue_policy.values())
    # the whole-queue limit is no per-level limit: not reported with several levels
    assert not batching.HasField("default_queue_policy")
    assert list(doc["dynamic_batching"]["priority_queue_policy"]) == ["1", "3"]
    (group,) = config.instance_group
    assert (group.count, model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind), list(group.gpus)) == (
        2,
        "KIND_GPU",
        [1],
    )
    assert config.response_cache.enable

    one = model_config_doc(
        metadata, BatchSettings(priority_levels=1, default_priority_level=1, max_queue_size=7)
    )
    config = parsed(one)
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 7
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_CPU"
    assert not config.response_cache.enable


def test_every_protocol_datatype_has_its_triton_data_type() -> None:
    assert set(DATA_TYPES) == set(DATATYPES)
    for datatype, name in DATA_TYPES.items():
        assert model_config_pb2.DataType.Value(name) > 0, datatype
    assert DATA_TYPES["BYTES"] == "TYPE_STRING"


def test_what_the_schema_cannot_say_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="tensor 'x': a shape needs the batch dimension"):
        tensor_config({"name": "x", "datatype": "FP32", "shape": []})
    with pytest.raises(ValueError, match="tensor 'x': datatype COMPLEX"):
        tensor_config({"name": "x", "datatype": "COMPLEX", "shape": [-1]})
    with pytest.raises(ValueError, match="platform 'tensorflow'"):
        model_config_doc(meta("tensorflow", [], []), BatchSettings())
