"""``InferenceService.spec``: the parts put together, the rules that span them, and the values in
force that the builders and the autoscaler read (served model name, PVC claims, HTTP workers, batch
timeout).
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.base import _cel, _cel_at_default, _check_table, _Spec, _table_rules
from kubeinfer.operator.api.formats import DNS_SUBDOMAIN_PATTERN, cpu_cores
from kubeinfer.operator.api.model import (
    DEFAULT_MODEL_NAME,
    BatchingSpec,
    CacheSpec,
    ModelSpec,
    QuantizationSpec,
    WarmupSpec,
)
from kubeinfer.operator.api.server import BEARER_TOKEN_ENV, ServerSpec
from kubeinfer.operator.api.sources import (
    is_pooled_uri,
    parse_pvc_uri,
    pooled_uri_cel,
    pooled_uri_message,
)
from kubeinfer.operator.api.workload import ResourcesSpec, RuntimeSpec
from kubeinfer.runtime.config import BUNDLED_MODEL
from pydantic import ConfigDict, Field, model_validator

#: Largest default of ``server.httpWorkers`` (``InferenceServiceSpec.http_workers_in_force``).
MAX_DEFAULT_HTTP_WORKERS = 8

#: ``model.instances``' default on a replica without a GPU of at least this many CPUs
#: (``InferenceServiceSpec.instances_in_force``).
CPU_INSTANCES_MIN_CPUS = 2
#: ``model.instances``' default on such a replica: two batches computed at once, each on its own core.
#: Measured on the bundled MiniLM int8 graph on two cores (bench/README.md, Peers: x1.11 the rate at a
#: P99 of 100 ms on short sentences, x1.18 on passages, against one instance), where one instance leaves
#: the second core to the front end and tokenization part of the time.
DEFAULT_CPU_INSTANCES = 2

#: A ModelPool's name (``spec.pool``): a DNS label (it names the pool's Deployment and labels its pods).
POOL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _pool_decides() -> list[tuple[str, Any]]:
    """The fields of ``spec`` a ModelPool decides for the InferenceServices on it, with their defaults as
    JSON: a pooled InferenceService must leave them out (or at their defaults)."""
    return [
        ("resources", _pooled_resources(ResourcesSpec())),
        ("replicas", 1),
        ("autoscaling", AutoscalingSpec().model_dump(by_alias=True, mode="json")),
    ]


def _pooled_resources(resources: ResourcesSpec) -> dict[str, Any]:
    """``resources`` as JSON without ``gpus``: a pooled InferenceService may say ``gpus: 0`` (its model
    runs on the CPU, which the format rules ask of an onnxruntime model) or 1 (the only other count
    ``ResourcesSpec`` accepts)."""
    data: dict[str, Any] = resources.model_dump(by_alias=True, mode="json")
    del data["gpus"]
    return data


#: The guards of an InferenceService's own pods that a pool does not apply yet: a pooled one that set
#: them would be served unguarded, so it is refused instead.
_POOL_UNGUARDED = ("auth", "allowFrom")


def _pool_unguarded_message(field: str) -> str:
    return (
        f"spec.server.{field} is not applied by a pool yet (its model would be served without it): leave it "
        "out of an InferenceService with spec.pool"
    )


def _pool_message(field: str) -> str:
    what = " (scale to zero included)" if field == "autoscaling" else ""
    return f"spec.{field} is decided by the pool{what}: leave it out of an InferenceService with spec.pool"


#: What a pooled InferenceService's model may be in this release: what the pool's image holds or its pods
#: mount (the registry's pooled schemes).
_POOL_MODEL_URI_MESSAGE = pooled_uri_message()


class InferenceServiceSpec(_Spec):
    """``InferenceService.spec``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_table_rules(""),
                _cel(
                    "!has(self.resources.gpuProduct) || self.resources.gpus > 0",
                    "spec.resources.gpuProduct requires spec.resources.gpus > 0",
                    ".resources.gpuProduct",
                    "FieldValueInvalid",
                ),
                *(
                    _cel(
                        f"!has(self.pool) || {_cel_at_default(f'self.{field}', default)}",
                        _pool_message(field),
                        f".{field}",
                        "FieldValueForbidden",
                    )
                    for field, default in _pool_decides()
                ),
                *(
                    _cel(
                        f"!has(self.pool) || !has(self.server.{field})",
                        _pool_unguarded_message(field),
                        f".server.{field}",
                        "FieldValueForbidden",
                    )
                    for field in _POOL_UNGUARDED
                ),
                _cel(
                    f"!has(self.pool) || {pooled_uri_cel()}",
                    _POOL_MODEL_URI_MESSAGE,
                    ".model.uri",
                    "FieldValueForbidden",
                ),
                _cel(
                    "!has(self.server.auth) || !has(self.runtime.env) || "
                    f"!self.runtime.env.exists(e, e.name == '{BEARER_TOKEN_ENV}')",
                    f"spec.runtime.env must not set {BEARER_TOKEN_ENV}: spec.server.auth fills it from "
                    "the Secret",
                    ".runtime.env",
                    "FieldValueForbidden",
                ),
            ]
        }
    )

    model: ModelSpec = Field(default_factory=ModelSpec)
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas when autoscaling is off.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount of the runtime pods, with its token mounted (workload identity, e.g. "
        "IRSA for an s3:// model without credentials). Unset: the namespace's default ServiceAccount and "
        "no token in the pods (automountServiceAccountToken false).",
    )

    pool: str | None = Field(
        default=None,
        max_length=63,
        pattern=POOL_NAME_PATTERN,
        description="A ModelPool of this namespace serving this model: the pool's pods serve it (loaded on "
        "its first request, evicted least recently used under the pool's memory budget) behind this "
        "InferenceService's own Service; no Deployment of its own. resources, replicas and autoscaling are "
        "the pool's and must be left out.",
    )

    @model_validator(mode="after")
    def _rules(self) -> InferenceServiceSpec:
        _check_table("", self)
        if self.pool is not None:
            self._pooled_rules()
        if self.resources.gpu_product is not None and self.resources.gpus == 0:
            raise ValueError("spec.resources.gpuProduct requires spec.resources.gpus > 0")
        if self.server.auth is not None and any(e.name == BEARER_TOKEN_ENV for e in self.runtime.env):
            raise ValueError(
                f"spec.runtime.env must not set {BEARER_TOKEN_ENV}: spec.server.auth fills it from the Secret"
            )
        return self

    def _pooled_rules(self) -> None:
        """The rules of a pooled InferenceService (the CEL rules' mirrors). Raises ``ValueError``."""
        for name, default in _pool_decides():
            value = getattr(self, name)
            if name == "resources":
                value = _pooled_resources(value)
            elif name == "autoscaling":
                value = value.model_dump(by_alias=True, mode="json")
            if value != default:
                raise ValueError(_pool_message(name))
        if self.server.auth is not None:
            raise ValueError(_pool_unguarded_message("auth"))
        if self.server.allow_from is not None:
            raise ValueError(_pool_unguarded_message("allowFrom"))
        if not is_pooled_uri(self.model.uri):
            raise ValueError(_POOL_MODEL_URI_MESSAGE)

    @classmethod
    def from_k8s(cls, spec: Any) -> InferenceServiceSpec:
        """Validate a custom resource's ``spec`` mapping (camelCase). Raises ``pydantic.ValidationError``."""
        return cls.model_validate(dict(spec or {}))

    def served_model_name(self, isvc_name: str) -> str:
        """The v2 model name: ``model.name``, else ``"minilm"`` for the bundled model, else ``isvc_name``."""
        if self.model.name:
            return self.model.name
        return DEFAULT_MODEL_NAME if self.model.uri == BUNDLED_MODEL else isvc_name

    def pvc_claims(self) -> list[str]:
        """Names of the PersistentVolumeClaims referenced by ``model.uri`` and calibration, sorted."""
        uris = [self.model.uri]
        if self.quantization.calibration is not None:
            uris.append(self.quantization.calibration.uri)
        return sorted({p[0] for u in uris if (p := parse_pvc_uri(u)) is not None})

    def http_workers_in_force(self) -> int:
        """``server.httpWorkers``, else the default from the CPU request (``resources.cpu``, request and
        limit): ``min(MAX_DEFAULT_HTTP_WORKERS, floor(cpus / 2))``, at least 1 -- a front end per two
        CPUs, the other CPU of each pair left to the model process (batching, tokenization, the device's
        host work). Below 4 CPUs (the default 2 included) that is 1: one process, as without the field.
        """
        if self.server.http_workers is not None:
            return self.server.http_workers
        return max(1, min(MAX_DEFAULT_HTTP_WORKERS, int(cpu_cores(self.resources.cpu) // 2)))

    def instances_in_force(self) -> int:
        """``model.instances``, else the default from the replica's device and CPUs: on a replica without
        a GPU (``resources.gpus`` 0) of at least ``CPU_INSTANCES_MIN_CPUS`` CPUs (``resources.cpu``),
        ``DEFAULT_CPU_INSTANCES``; otherwise 1 (a GPU's instances share the one device: more is a choice
        the user measures)."""
        if self.model.instances is not None:
            return self.model.instances
        if self.resources.gpus == 0 and cpu_cores(self.resources.cpu) >= CPU_INSTANCES_MIN_CPUS:
            return DEFAULT_CPU_INSTANCES
        return 1

    def max_queue_delay_in_force(self, status_max_queue_delay: float | None) -> float:
        """The max queue delay the runtime should use, float seconds.

        ``status_max_queue_delay``: the InferenceService's ``status.maxQueueDelay`` (seconds, parsed with
        the status; ``None``: unset). With autoscaling on and it set (the autoscaler's value), that value
        clamped to ``[autoscaling.maxQueueDelay.min, .max]``; otherwise ``batching.maxQueueDelay``.
        """
        if self.autoscaling.enabled and status_max_queue_delay is not None:
            bounds = self.autoscaling.max_queue_delay
            return float(min(max(status_max_queue_delay, bounds.min), bounds.max))
        return float(self.batching.max_queue_delay)
