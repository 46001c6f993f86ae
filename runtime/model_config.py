"""Triton's model configuration extension: what the runtime does, in Triton's model configuration schema.

``GET /v2/models/{name}[/versions/{v}]/config`` and gRPC ``ModelConfig`` answer ``model_config_doc``:
Triton's ``model_config.proto`` in its JSON form (the field names of ``inference.ModelConfig``; numbers
as JSON numbers, as Triton's HTTP endpoint writes them). ``perf_analyzer`` and ``model-analyzer`` read
it before anything else, for the batch dimension and the scheduler. It is derived from the v2 model
metadata (``dataplane.model_metadata_doc``: the same tensors ``GET /v2/models/{name}`` lists) and the
batching settings in force (which a config reload changes while the runtime serves), so the two never
disagree:

- ``name``, ``platform``: the metadata's (``pytorch``, ``onnxruntime_onnx``); ``backend``: the engine
  that runs the model, ``onnxruntime`` or ``pytorch``.
- ``max_batch_size``: the batching settings' (rows per batch; always >= 1: every kubeinfer model
  batches along the first dimension of its tensors).
- ``input`` / ``output``: ``name``, ``data_type`` (``TYPE_FP32``...; BYTES is ``TYPE_STRING``) and
  ``dims``, the metadata's shape without its first (batch) dimension, -1 where variable. A tensor
  with no dimension but the batch is ``dims: [1]`` with ``reshape: {shape: []}`` (Triton's way to
  write it). An input a request may leave out (a token classifier's ``aggregation_strategy``, one
  value for the whole request) is ``optional``.
- ``dynamic_batching``: ``max_queue_delay_microseconds`` (the delay in force), ``preferred_batch_size``,
  ``priority_levels`` and ``default_priority_level``, ``priority_queue_policy`` (a level's queue
  limit, ``batching.priority_queue_sizes``) and, with one priority level, ``default_queue_policy``
  (``max_queue_size``: with several levels kubeinfer's limit is one for the whole queue, Triton's one
  per level, so it is not reported). Every queue policy has ``allow_timeout_override``: a request's
  ``timeout`` parameter is honoured.
- ``instance_group``: the model's instances (the runtime config's ``instances``, one executor thread
  each) on the model's device, ``KIND_CPU`` or ``KIND_GPU`` with its index.
- ``response_cache``: ``enable`` when the response cache is on.
- ``parameters``: the model's own settings (``ServableModel.parameters``) as ``string_value``s: a text
  model's ``max_text_tokens`` (tokens per text), ``max_sequence_length`` (its window, tokens) and
  ``overflow`` (refuse, truncate or chunk).

Pure: standard library only, no server or batching code (import-linter keeps it so); the batching
settings are anything with ``BatchingInForce``'s attributes (``batching.BatchSettings``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

#: v2 datatype -> Triton's ``DataType`` name (``model_config.proto``); BYTES is ``TYPE_STRING``.
DATA_TYPES: dict[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}

#: v2 metadata ``platform`` -> Triton's ``backend`` (the engine that runs the model).
BACKENDS: dict[str, str] = {"onnxruntime_onnx": "onnxruntime", "pytorch": "pytorch"}


class BatchingInForce(Protocol):
    """The batching settings the configuration reports (``batching.BatchSettings`` has them).

    Attributes:
        max_batch_size: rows per batch, >= 1.
        max_queue_delay_seconds: seconds the oldest queued request waits for a batch to fill.
        max_queue_size: requests the whole queue holds.
        priority_levels: request ``priority`` values are 1..priority_levels (1 highest).
        default_priority_level: the level of a request without a priority.
        preferred_batch_sizes: row counts dispatched as soon as reached.
        priority_queue_sizes: level -> the requests that level's queue holds.
    """

    @property
    def max_batch_size(self) -> int: ...

    @property
    def max_queue_delay_seconds(self) -> float: ...

    @property
    def max_queue_size(self) -> int: ...

    @property
    def priority_levels(self) -> int: ...

    @property
    def default_priority_level(self) -> int: ...

    @property
    def preferred_batch_sizes(self) -> Sequence[int]: ...

    @property
    def priority_queue_sizes(self) -> Mapping[int, int]: ...


def tensor_config(spec: Mapping[str, Any], *, optional: bool = False) -> dict[str, Any]:
    """One ``ModelInput``/``ModelOutput`` of Triton's schema from a metadata tensor.

    Args:
        spec: ``{"name", "datatype", "shape"}`` of the v2 model metadata; ``shape`` (ints, -1 variable)
            starts with the batch dimension.
        optional: the input may be left out of a request (Triton's ``optional``; inputs only).

    Returns:
        ``{"name", "data_type", "dims"}`` with the shape's batch dimension dropped; ``dims: [1]`` and
        ``reshape: {"shape": []}`` when nothing is left; ``optional: true`` when ``optional``.

    Raises:
        ValueError: a datatype Triton's schema has no name for, or a shape without the batch dimension.
    """
    datatype = spec["datatype"]
    if datatype not in DATA_TYPES:
        raise ValueError(f"tensor '{spec['name']}': datatype {datatype} has no Triton data type")
    shape = [int(d) for d in spec["shape"]]
    if not shape:
        raise ValueError(f"tensor '{spec['name']}': a shape needs the batch dimension")
    doc: dict[str, Any] = {"name": spec["name"], "data_type": DATA_TYPES[datatype], "dims": shape[1:]}
    if not shape[1:]:
        doc["dims"] = [1]
        doc["reshape"] = {"shape": []}
    if optional:
        doc["optional"] = True
    return doc


def _queue_policy(max_queue_size: int) -> dict[str, Any]:
    return {"max_queue_size": max_queue_size, "allow_timeout_override": True}


def dynamic_batching(settings: BatchingInForce) -> dict[str, Any]:
    """Triton's ``ModelDynamicBatching`` of ``settings`` (see the module docstring).

    ``max_queue_delay_microseconds`` is the delay's seconds x 1e6, rounded to the microsecond; the keys
    of ``priority_queue_policy`` are the levels as strings (JSON's map keys).
    """
    doc: dict[str, Any] = {
        "preferred_batch_size": list(settings.preferred_batch_sizes),
        "max_queue_delay_microseconds": round(settings.max_queue_delay_seconds * 1e6),
        "priority_levels": settings.priority_levels,
        "default_priority_level": settings.default_priority_level,
    }
    if settings.priority_levels <= 1:
        doc["default_queue_policy"] = _queue_policy(settings.max_queue_size)
    if settings.priority_queue_sizes:
        doc["priority_queue_policy"] = {
            str(level): _queue_policy(size) for level, size in sorted(settings.priority_queue_sizes.items())
        }
    return doc


def instance_group(instances: int, device: str) -> dict[str, Any]:
    """Triton's ``ModelInstanceGroup`` of ``instances`` (executor threads) on ``device`` (``cpu``,
    ``cuda``, ``cuda:N``): ``KIND_CPU``, or ``KIND_GPU`` with ``gpus: [N]`` (0 when the device names no
    index)."""
    doc: dict[str, Any] = {"name": "kubeinfer", "count": instances}
    if device.startswith("cuda"):
        index = device.partition(":")[2]
        doc["kind"] = "KIND_GPU"
        doc["gpus"] = [int(index) if index else 0]
    else:
        doc["kind"] = "KIND_CPU"
    return doc


def model_config_doc(
    metadata: Mapping[str, Any],
    settings: BatchingInForce,
    *,
    optional_inputs: Collection[str] = (),
    instances: int = 1,
    device: str = "cpu",
    cache: bool = False,
    parameters: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The model's configuration in Triton's JSON form (``inference.ModelConfig``).

    Args:
        metadata: the v2 model metadata (``dataplane.model_metadata_doc``): ``name``, ``platform``,
            ``inputs`` and ``outputs`` (``name``, ``datatype``, ``shape`` with the batch first).
        settings: the batching settings in force.
        optional_inputs: names of the inputs a request may leave out (``ServableModel.request_inputs``).
        instances: the model's instances, executor threads running batches (``instances`` of the
            runtime config).
        device: the model's device (``cpu``, ``cuda:0``).
        cache: the response cache is on.
        parameters: the model's own settings a client may want to know (``ServableModel.parameters``:
            a text model's window and overflow policy), as Triton's ``parameters`` map of
            ``string_value``s; none: no ``parameters``.

    Returns:
        A dict of ``model_config.proto``'s field names (see the module docstring); it parses into
        ``tritonclient.grpc.model_config_pb2.ModelConfig`` with ``google.protobuf.json_format``.

    Raises:
        ValueError: a tensor ``tensor_config`` refuses, or a platform without a known backend.
    """
    platform = metadata["platform"]
    if platform not in BACKENDS:
        raise ValueError(f"platform {platform!r} has no Triton backend name")
    doc: dict[str, Any] = {
        "name": metadata["name"],
        "platform": platform,
        "backend": BACKENDS[platform],
        "max_batch_size": settings.max_batch_size,
        "input": [tensor_config(s, optional=s["name"] in optional_inputs) for s in metadata["inputs"]],
        "output": [tensor_config(s) for s in metadata["outputs"]],
        "dynamic_batching": dynamic_batching(settings),
        "instance_group": [instance_group(instances, device)],
        "response_cache": {"enable": cache},
    }
    if parameters:
        doc["parameters"] = {k: {"string_value": v} for k, v in sorted(parameters.items())}
    return doc
