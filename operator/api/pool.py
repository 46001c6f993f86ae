"""The ModelPool resource: a Deployment of the runtime in its model repository mode that serves every
InferenceService naming the pool (``spec.pool``), each model loaded on its first request and evicted
least recently used under the pool's memory budget.

``kubeinfer.io/v1alpha1``, kind ``ModelPool`` (plural ``modelpools``, short name ``kpool``; not
"InferencePool", the Gateway API inference extension's kind), namespaced. The kind's names and the label
of its pods are ``kubeinfer.contract.pool``'s (the runtime reads the repository layout from there too).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from kubeinfer.operator.api.autoscaling import AutoscalingSpec, MaxQueueDelayBounds
from kubeinfer.operator.api.base import _cel, _cel_at_default, _identity, _Spec, _Status
from kubeinfer.operator.api.formats import Quantity, cpu_cores
from kubeinfer.operator.api.status import AutoscalerDecisionStatus, Condition, ObservedSignals
from kubeinfer.operator.api.workload import DEFAULT_IMAGE, ResourcesSpec
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from kubeinfer.contract.activator import API_VERSION
from kubeinfer.contract.pool import POOL_KIND

#: A model name of the pool (``spec.pinned``): a served model name (``spec.model.name``'s pattern).
MODEL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
#: The message of a budget above the pod's memory.
_BUDGET_OVER_MEMORY = "spec.memoryBudget must not exceed spec.resources.memory (the pod's memory limit)"
_ModelName = Annotated[str, StringConstraints(pattern=MODEL_NAME_PATTERN, max_length=63)]


def _pool_autoscaling_refused() -> list[tuple[str, Any, str]]:
    """The fields of ``spec.autoscaling`` that do not apply to a pool, each with its default as JSON and
    why: a ModelPool must leave them out (or at their defaults). One list makes both the CEL rules and
    the pydantic check (:meth:`ModelPoolSpec._rules`)."""
    defaults = AutoscalingSpec().model_dump(by_alias=True, mode="json")
    per_model = "the max queue delay is each model's (its InferenceService's spec.batching.maxQueueDelay)"
    return [
        ("maxQueueDelay", MaxQueueDelayBounds().model_dump(by_alias=True, mode="json"), per_model),
        ("maxQueueDelayCooldown", defaults["maxQueueDelayCooldown"], per_model),
        (
            "scaleToZero",
            None,
            "a pool does not scale to zero (the activator holds an InferenceService's "
            "requests, not a pool's)",
        ),
    ]


def _pool_autoscaling_message(field: str, why: str) -> str:
    return f"spec.autoscaling.{field} does not apply to a ModelPool ({why}): leave it out"


#: A pool's floor: it keeps a replica (no scale to zero).
_POOL_MIN_REPLICAS_MESSAGE = (
    "spec.autoscaling.minReplicas must be at least 1 on a ModelPool (a pool does not scale to zero)"
)


class PoolRuntimeSpec(_Spec):
    """The pool's runtime container: its image (the models' own settings are in their InferenceServices)."""

    image: str = Field(default=DEFAULT_IMAGE, min_length=1, max_length=512)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None


class ModelPoolSpec(_Spec):
    """``ModelPool.spec``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "quantity(self.memoryBudget).compareTo(quantity(self.resources.memory)) <= 0",
                    _BUDGET_OVER_MEMORY,
                    ".memoryBudget",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.resources.gpuProduct) || self.resources.gpus > 0",
                    "spec.resources.gpuProduct requires spec.resources.gpus > 0",
                    ".resources.gpuProduct",
                    "FieldValueInvalid",
                ),
                *(
                    _cel(
                        f"!has(self.autoscaling) || {_cel_at_default(f'self.autoscaling.{field}', default)}",
                        _pool_autoscaling_message(field, why),
                        f".autoscaling.{field}",
                        "FieldValueForbidden",
                    )
                    for field, default, why in _pool_autoscaling_refused()
                ),
                _cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) "
                    "|| self.autoscaling.minReplicas >= 1",
                    _POOL_MIN_REPLICAS_MESSAGE,
                    ".autoscaling.minReplicas",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    runtime: PoolRuntimeSpec = Field(default_factory=PoolRuntimeSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    replicas: int = Field(
        default=1, ge=1, le=1000, description="Replicas of the pool's runtime when autoscaling is off."
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="Replicas from the pool's signals over all its models (an InferenceService's fields and "
        "units; maxQueueDelay, maxQueueDelayCooldown and scaleToZero do not apply: the max queue delay is "
        "each model's, and a pool keeps at least 1 replica).",
    )
    memory_budget: Quantity = Field(
        description="Resident bytes the loaded models of a replica may take together (the runtime's "
        "--memory-budget: the RSS of each model's process after load and warmup), e.g. 3Gi; at most "
        "resources.memory."
    )
    pinned: list[_ModelName] = Field(
        default_factory=list,
        max_length=64,
        description="Served model names loaded at start and never evicted (each must be a model of the "
        "pool: an InferenceService naming the pool serves it).",
    )

    @model_validator(mode="after")
    def _rules(self) -> ModelPoolSpec:
        if cpu_cores(self.memory_budget) > cpu_cores(self.resources.memory):
            raise ValueError(_BUDGET_OVER_MEMORY)
        if self.resources.gpu_product is not None and self.resources.gpus == 0:
            raise ValueError("spec.resources.gpuProduct requires spec.resources.gpus > 0")
        scaling = self.autoscaling.model_dump(by_alias=True, mode="json")
        for field, default, why in _pool_autoscaling_refused():
            if scaling.get(field) != default:
                raise ValueError(_pool_autoscaling_message(field, why))
        if self.autoscaling.min_replicas < 1:
            raise ValueError(_POOL_MIN_REPLICAS_MESSAGE)
        return self

    @classmethod
    def from_k8s(cls, spec: Any) -> ModelPoolSpec:
        """Validate a custom resource's ``spec`` mapping (camelCase). Raises ``pydantic.ValidationError``."""
        return cls.model_validate(dict(spec or {}))

    def memory_budget_bytes(self) -> int:
        """``memoryBudget`` in bytes (``3Gi`` -> 3221225472), rounded down."""
        return int(cpu_cores(self.memory_budget))


class PoolReplicaStatus(_Status):
    """One ready replica of a pool as its model repository index says (``ModelPool.status.replicaModels``)."""

    pod: str = Field(description="The pod's name.")
    loaded: list[str] = Field(default_factory=list, description="Served model names loaded on it, sorted.")
    resident_bytes: int = Field(default=0, description="Resident bytes of its loaded models together.")
    evictions: int = Field(default=0, description="Models it unloaded for the budget since it started.")


class ModelPoolStatus(_Status):
    """``ModelPool.status``, written by the operator. The loaded models, bytes and evictions are read from
    each ready replica's model repository index (polled every autoscaler interval); absent until the first
    replica answers."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    models: int | None = Field(default=None, description="InferenceServices served by the pool.")
    replicas: int | None = Field(default=None, description="Pods of the pool (its Deployment's).")
    ready_replicas: int | None = Field(default=None, description="Ready pods of the pool.")
    loaded_models: int | None = Field(
        default=None, description="Models loaded on at least one ready replica (the Loaded printer column)."
    )
    resident_bytes: int | None = Field(
        default=None,
        description="Resident bytes of the loaded models on the fullest replica (the budget is per replica).",
    )
    memory_used: str | None = Field(
        default=None,
        description="residentBytes of memoryBudget, e.g. '412Mi/1Gi' (the Memory printer column).",
    )
    evictions: int | None = Field(
        default=None,
        description="Models unloaded for the memory budget, over the ready replicas since they started.",
    )
    replica_models: list[PoolReplicaStatus] | None = Field(
        default=None, description="Each ready replica that answered its model repository index, by pod name."
    )
    observed: ObservedSignals | None = Field(
        default=None, description="The pool's signals over all its models' requests (autoscaling on)."
    )
    last_decision: AutoscalerDecisionStatus | None = Field(
        default=None, description="The autoscaler's last decision that changed the replicas."
    )

    @classmethod
    def from_k8s(cls, status: Any) -> ModelPoolStatus:
        """Parse a custom resource's ``status`` mapping; unknown keys are ignored."""
        return cls.model_validate(dict(status or {}))


def pool_configmap_name(pool: str) -> str:
    """Name of a pool's model repository ConfigMap (``<pool>-repository``)."""
    return f"{pool}-repository"


def pool_reference(body: Any) -> dict[str, Any]:
    """The ModelPool ``body`` as the ``involved`` object of an Event (apiVersion, kind, metadata)."""
    return {"apiVersion": API_VERSION, "kind": POOL_KIND, "metadata": body.get("metadata") or {}}


class ModelPool(BaseModel):
    """A parsed ModelPool: identity (name, namespace, uid, generation) + spec + status."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    spec: ModelPoolSpec
    status: ModelPoolStatus = Field(default_factory=ModelPoolStatus)

    @classmethod
    def from_body(cls, body: Any) -> ModelPool:
        """Parse a custom-resource mapping (``metadata``/``spec``/``status``).

        Raises:
            pydantic.ValidationError: the spec breaks a rule (the message names the field).
        """
        return cls(
            **_identity(body),
            spec=ModelPoolSpec.from_k8s(body.get("spec")),
            status=ModelPoolStatus.from_k8s(body.get("status")),
        )
