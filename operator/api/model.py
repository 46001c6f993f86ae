"""What is served and how the runtime serves it: ``spec.model`` (source, format, tensors),
``spec.quantization`` (with its calibration data), ``spec.batching``, ``spec.warmup`` and
``spec.cache``.
"""

from __future__ import annotations

from typing import Annotated

from kubeinfer.operator.api.base import _cel, _check_table, _if_durations, _Spec, _table_rules
from kubeinfer.operator.api.formats import (
    DNS_SUBDOMAIN_PATTERN,
    SECRET_KEY_PATTERN,
    Duration,
    Quantity,
    Seconds,
    cpu_cores,
)
from kubeinfer.operator.api.sources import (
    _CALIBRATION_SETTINGS,
    _MODEL_SETTINGS,
    DATA_URI_PATTERN,
    MODEL_URI_PATTERN,
    SHA256_PATTERN,
    CaBundleSpec,
    CredentialsSpec,
    FetchSpec,
    HuggingFaceSpec,
    S3Spec,
    _check_source,
    _registry_pattern,
    _settings_of,
    _source_rules,
)
from kubeinfer.runtime.config import (
    BUNDLED_MODEL,
    AggregationStrategy,
    Datatype,
    ModelFormat,
    Overflow,
    Quantization,
    Task,
    WarmupBeforeReady,
)
from pydantic import ConfigDict, Field, StringConstraints, model_validator

from kubeinfer.contract import sources as contract
from kubeinfer.contract.batching import MAX_QUEUE_DELAY_LIMIT_SECONDS
from kubeinfer.contract.instances import MAX_INSTANCES

#: Served model name when ``model.uri`` is the bundled default and ``model.name`` is unset.
DEFAULT_MODEL_NAME = "minilm"


class TensorSpec(_Spec):
    """A declared model input or output (TorchScript: required; ONNX, pt2: refines what the model declares).
    ``shape``: -1 for a variable dimension."""

    name: str = Field(min_length=1, max_length=128)
    datatype: Datatype
    shape: list[int] = Field(min_length=1, max_length=8)


class ModelSpec(_Spec):
    """Where the model comes from and its format."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_table_rules("model"),
                *_source_rules("spec.model", _MODEL_SETTINGS),
            ]
        }
    )

    uri: str = Field(
        default=BUNDLED_MODEL,
        pattern=MODEL_URI_PATTERN,
        json_schema_extra=_registry_pattern(contract.model_uri_pattern),
        max_length=1024,
        description="'default' (bundled all-MiniLM-L6-v2), an absolute path inside the runtime image, "
        "pvc://<claim>/<path> (mounted read-only); fetched by an init container into an emptyDir at "
        "/mnt/models: s3://bucket/key-or-prefix/, https://host/path (a file, or a .tar, .tar.gz, .tgz, "
        ".zip archive unpacked), http://... (with allowInsecureHttp), hf://org/repo[@revision]; or "
        "oci://registry/repo:tag | oci://registry/repo@sha256:<digest>, an OCI image mounted read-only "
        "at /mnt/models as an image volume (Kubernetes >= 1.33 with ImageVolume).",
    )
    format: ModelFormat = Field(
        default="huggingface",
        description="huggingface | torchscript (deprecated: torch deprecates TorchScript; export to pt2) | "
        "onnx (a .onnx file or its directory, run on ONNX Runtime; its tensors are read from the model) | "
        "pt2 (a torch.export program saved by torch.export.save, or an AOTInductor package, run on torch; "
        "its tensors are read from the program)",
    )
    task: Task | None = Field(
        default=None,
        description="huggingface only: text-embedding (text -> embedding), text-classification (text -> "
        "label, score, logits), token-classification (text -> entities with character offsets, as the "
        "transformers pipeline aggregates them) or reranking (query, text -> score, and POST /v1/rerank). "
        "Unset: detected from the model's config.json (*ForSequenceClassification: reranking with one "
        "label, else text-classification; *ForTokenClassification: token-classification; otherwise "
        "text-embedding).",
    )
    aggregation_strategy: AggregationStrategy | None = Field(
        default=None,
        description="token-classification only: how token labels become entities when a request sends "
        "no aggregation_strategy input: none | simple | first | average | max, as the transformers "
        "pipeline's aggregation_strategy. Unset: none, the pipeline's default (overflow chunk needs "
        "another).",
    )
    overflow: Overflow | None = Field(
        default=None,
        description="huggingface only: what a text longer than the model's window (256 tokens) gets: "
        "refuse (413 naming the tensor and the row), truncate (cut to the window as transformers' "
        "truncation=True does; a reranker keeps the query whole and truncates the text; counted in "
        "kubeinfer_truncated_rows_total) or chunk (text-embedding and token-classification: texts up to "
        "maxTextTokens split into windows overlapping by an eighth; an embedder answers their "
        "embeddings averaged, weighted by their tokens, a token classifier their entities merged with "
        "offsets into the whole text as transformers' stride does, which needs an aggregationStrategy "
        "other than none; counted in kubeinfer_chunked_rows_total). Unset: refuse.",
    )
    max_text_tokens: int | None = Field(
        default=None,
        ge=1,
        le=131072,
        description="Text models (huggingface; other formats have no text to count): tokens per text "
        "(special tokens included) beyond which a text is "
        "refused with 413, whatever overflow says; the window is at most the model's 256 tokens, so "
        "above that this is the budget of a text overflow chunk splits (the runtime's "
        "limits.max_text_tokens). Unset: 512.",
    )
    instances: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INSTANCES,
        description="Instances of the model in each replica (Triton's instance_group count): that many "
        "batches of its one queue run at once, each on an executor thread of the model's process, all on "
        "the replica's one device (the GPU, cuda:0, or the CPU), sharing one copy of the weights (a pt2 "
        "AOTInductor package loads one runner per instance). More than one helps where a batch leaves the "
        "device idle part of the time (tokenization, small batches, several CPU cores); the runtime's "
        "instances and the model configuration's instance_group count. Unset: 2 on a replica without a "
        "GPU (resources.gpus 0) of at least 2 CPUs (resources.cpu), else 1.",
    )
    name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        max_length=63,
        description="Served model name (v2 protocol). Default: 'minilm' for the bundled model, else "
        "metadata.name.",
    )
    inputs: list[TensorSpec] = Field(
        default_factory=list,
        max_length=16,
        description="TorchScript: required. ONNX, pt2: optional, refines the model's own (same names and "
        "datatypes); required for an AOTInductor package without its program.",
    )
    outputs: list[TensorSpec] = Field(
        default_factory=list,
        max_length=16,
        description="TorchScript: required. ONNX, pt2: optional, refines the model's own (same names and "
        "datatypes); required for an AOTInductor package without its program.",
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="SHA-256 (hex) of the single file or archive fetched (s3, https, http; an hf:// "
        "model is pinned by its revision): a mismatch fails the fetch.",
    )
    allow_insecure_http: bool = Field(
        default=False,
        description="Allow an http:// uri: the model (and a bearer token) travel unencrypted; a sha256 "
        "at least detects a changed file.",
    )
    s3: S3Spec | None = Field(default=None, description="s3:// only: endpoint, region, addressing style.")
    hf: HuggingFaceSpec | None = Field(default=None, description="hf:// only: endpoint, allowPatterns.")
    credentials: CredentialsSpec | None = Field(
        default=None, description="The Secret with the source's credentials (keys per scheme)."
    )
    fetch: FetchSpec | None = Field(
        default=None,
        description="Limits of the fetch init container (size, timeouts, retries); unset: their defaults.",
    )
    ca_bundle: CaBundleSpec | None = Field(
        default=None,
        description="s3://, https://, hf:// only: a ConfigMap key with the PEM CA certificates of a "
        "private CA (an on-prem MinIO, an internal artifact server or hub), trusted by the fetch besides "
        "the public CAs. Unset: the public CAs of the runtime image only.",
    )

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        settings = _settings_of(self, _MODEL_SETTINGS)
        _check_source("spec.model", self.uri, settings, self.allow_insecure_http)
        _check_table("model", self)
        return self


class CalibrationSpec(_Spec):
    """Calibration data for int8-static: one file, one text sample per line."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_source_rules("spec.quantization.calibration", _CALIBRATION_SETTINGS)
            ]
        }
    )

    uri: str = Field(
        pattern=DATA_URI_PATTERN,
        json_schema_extra=_registry_pattern(contract.data_uri_pattern),
        max_length=1024,
        description="/path, pvc://<claim>/<path>, or a file fetched by an init container: "
        "s3://bucket/key, https://host/path/file (http:// with allowInsecureHttp).",
    )
    sha256: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="SHA-256 (hex) of the fetched file."
    )
    allow_insecure_http: bool = Field(
        default=False, description="Allow an http:// uri (the file travels unencrypted)."
    )
    s3: S3Spec | None = Field(default=None, description="s3:// only: endpoint, region, addressing style.")
    credentials: CredentialsSpec | None = Field(
        default=None, description="The Secret with the credentials (keys as for spec.model.credentials)."
    )
    ca_bundle: CaBundleSpec | None = Field(
        default=None,
        description="s3://, https:// only: a ConfigMap key with the PEM CA certificates of a private CA "
        "(as spec.model.caBundle).",
    )

    @model_validator(mode="after")
    def _rules(self) -> CalibrationSpec:
        settings = _settings_of(self, _CALIBRATION_SETTINGS)
        _check_source("spec.quantization.calibration", self.uri, settings, self.allow_insecure_http)
        return self


class ConfigMapKeyRef(_Spec):
    """A key of a ConfigMap in the InferenceService's namespace (mounted into the pod)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the ConfigMap."
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key in the ConfigMap's data: a text file, one text per non-empty line (at least "
        "10, 100 to 200 recommended).",
    )


class GateSpec(_Spec):
    """The quality gate: measured at load against the fp32 model; under a bar the replica does not
    become Ready and the InferenceService is Ready=False QuantizationBelowGate, the figures and the
    bars in its message."""

    min_cosine: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Embedders: the least mean cosine of the served embeddings to fp32's (the runtime's "
        "kubeinfer_quantization_cosine_mean_ratio).",
    )
    min_agreement: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="The least agreement with fp32: an embedder's retrieval agreement (each text's nearest "
        "neighbour among the others), a classifier's or tagger's label agreement, a reranker's (on its "
        "held-out pairs).",
    )
    texts: ConfigMapKeyRef | None = Field(
        default=None,
        description="Your own texts to measure on (embedders, classifiers, taggers); unset: the runtime's "
        "bundled English held-out sentences.",
    )


class QuantizationSpec(_Spec):
    """Post-training quantization applied by the runtime at load."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_table_rules("quantization"),
            ]
        }
    )

    mode: Quantization = Field(default="none", description="none | fp16 | bf16 | int8-dynamic | int8-static")
    calibration: CalibrationSpec | None = None
    skip_modules: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=64,
        description="Module-name prefixes left unquantized (non-empty).",
    )
    gate: GateSpec | None = Field(
        default=None,
        description="A quality gate on the deviation from fp32 measured at load (unset: none; the "
        "figures are in the runtime's kubeinfer_quantization_* metrics either way, and with autoscaling "
        "on in status.quantization with the bars).",
    )

    @model_validator(mode="after")
    def _rules(self) -> QuantizationSpec:
        _check_table("quantization", self)
        return self


class BatchingSpec(_Spec):
    """Dynamic batching (hot-reloaded by the runtime: changing it does not roll the pods)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.preferredBatchSizes) || "
                    "self.preferredBatchSizes.all(b, b <= self.maxBatchSize)",
                    "spec.batching.preferredBatchSizes must not exceed spec.batching.maxBatchSize",
                    ".preferredBatchSizes",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations(
                        f"duration(self.maxQueueDelay) <= duration('{MAX_QUEUE_DELAY_LIMIT_SECONDS}s')",
                        "maxQueueDelay",
                    ),
                    f"spec.batching.maxQueueDelay must be at most {MAX_QUEUE_DELAY_LIMIT_SECONDS}s",
                    ".maxQueueDelay",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    max_batch_size: int = Field(default=32, ge=1, le=4096, description="Rows per batch.")
    max_queue_delay: Duration = Field(
        default=Seconds("5ms"), description="Max queue delay (the batch timeout), a duration such as '5ms'."
    )
    max_queue_size: int = Field(
        default=1024, ge=1, le=1_000_000, description="Queued requests beyond which 429."
    )
    preferred_batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=list, max_length=32
    )
    priority_min_share: float | None = Field(
        default=None,
        ge=0.0,
        le=0.5,
        description="Share of the batches each priority level heads at least while a higher level keeps "
        "the server busy (a level earns that share of a turn per batch taken while it waits), so no level "
        "starves; 0: strict priority. Unset: the runtime's default, 0.1.",
    )
    max_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        le=16777216,
        description="Text models: the most tokens a batch may cost, counted padded (its rows times its "
        "longest row's tokens, a row's tokens estimated from its bytes, at most the model's window; with "
        "overflow chunk a longer row counts as its windows laid end to end): a "
        "request that would pass it waits for the next batch, so a long text does not pad a batch of "
        "short ones to its length (TEI's max_batch_tokens). One window's tokens (256 for the bundled "
        "MiniLM) keeps short requests' P99 lowest beside long ones, which then take longer; with two "
        "instances (spec.model.instances) on a two-core replica a short request also runs beside a batch "
        "of windows. Hot-reloaded. "
        "Unset: rows alone bound a batch (maxBatchSize).",
    )

    @model_validator(mode="after")
    def _rules(self) -> BatchingSpec:
        if any(b > self.max_batch_size for b in self.preferred_batch_sizes):
            raise ValueError("spec.batching.preferredBatchSizes must not exceed spec.batching.maxBatchSize")
        if self.max_queue_delay > MAX_QUEUE_DELAY_LIMIT_SECONDS:
            raise ValueError(f"spec.batching.maxQueueDelay must be at most {MAX_QUEUE_DELAY_LIMIT_SECONDS}s")
        return self


class WarmupSpec(_Spec):
    """Warmup: every batch-size bucket up to maxBatchSize, ``steps`` times (before Ready: ``beforeReady``)."""

    enabled: bool = True
    steps: int = Field(default=1, ge=1, le=100)
    before_ready: WarmupBeforeReady | None = Field(
        default=None,
        description="What warms up before the replica turns Ready. first (unset): the batches of one row "
        "(every sequence length, or every warmup.dims size), what a first request needs; the larger "
        "batches warm up after, in the background, while no request is in flight (a replica woken from "
        "zero answers sooner). all: every batch-size bucket before Ready (a request never meets a cold "
        "batch size).",
    )
    dims: list[Annotated[int, Field(ge=1, le=65536)]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="onnx, pt2 and torchscript models: the sizes every variable (-1) non-batch dimension "
        "of the inputs takes in warmup, all at once, each size a pass over the batch buckets (e.g. the "
        "sequence lengths clients send). Unset: 8. A huggingface model warms its own sequence-length "
        "buckets.",
    )


#: Smallest ``spec.cache.maxBytes`` (the runtime's ``cache.max_bytes`` minimum).
MIN_CACHE_BYTES = 1024


class CacheSpec(_Spec):
    """The runtime's response cache: a request whose input tensors were answered before gets the same
    outputs without the queue and the model (a request opts out with the parameter ``cache: false``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    f"quantity(self.maxBytes).compareTo(quantity('{MIN_CACHE_BYTES}')) >= 0",
                    f"spec.cache.maxBytes must be at least {MIN_CACHE_BYTES} bytes",
                    ".maxBytes",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    enabled: bool = Field(default=False, description="Answer repeated requests from the cache.")
    max_bytes: Quantity = Field(
        default="64Mi",
        description="Bytes of cached outputs kept per replica (least recently used go first); counts "
        "toward resources.memory.",
    )

    @model_validator(mode="after")
    def _rules(self) -> CacheSpec:
        if cpu_cores(self.max_bytes) < MIN_CACHE_BYTES:
            raise ValueError(f"spec.cache.maxBytes must be at least {MIN_CACHE_BYTES} bytes")
        return self
