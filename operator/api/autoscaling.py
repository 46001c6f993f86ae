"""``spec.autoscaling``: the SLO the autoscaler keeps, the bounds of its two levers (replicas and
the max queue delay), its pacing and its PromQL overrides.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.base import _cel, _if_durations, _refuse_renamed, _schema_with_renamed, _Spec
from kubeinfer.operator.api.formats import Duration, Seconds
from pydantic import ConfigDict, Field, model_validator

from kubeinfer.contract.activator import COLD_START_TIMEOUT_DEFAULT
from kubeinfer.contract.batching import MAX_QUEUE_DELAY_LIMIT_SECONDS


class GpuUtilizationBand(_Spec):
    """The GPU-utilization band (ratios 0..1) the autoscaler keeps replicas in."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.low < self.high",
                    "spec.autoscaling.gpuUtilization.low must be less than "
                    "spec.autoscaling.gpuUtilization.high",
                    ".low",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    low: float = Field(default=0.5, ge=0.0, le=1.0)
    high: float = Field(default=0.8, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _rules(self) -> GpuUtilizationBand:
        if not self.low < self.high:
            raise ValueError(
                "spec.autoscaling.gpuUtilization.low must be less than spec.autoscaling.gpuUtilization.high"
            )
        return self


class MaxQueueDelayBounds(_Spec):
    """Bounds within which the autoscaler tunes the max queue delay (the runtime's batch timeout)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    _if_durations("duration(self.min) <= duration(self.max)", "min", "max"),
                    "spec.autoscaling.maxQueueDelay.min must not exceed spec.autoscaling.maxQueueDelay.max",
                    ".min",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations(
                        f"duration(self.max) <= duration('{MAX_QUEUE_DELAY_LIMIT_SECONDS}s')", "max"
                    ),
                    f"spec.autoscaling.maxQueueDelay.max must be at most {MAX_QUEUE_DELAY_LIMIT_SECONDS}s",
                    ".max",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    min: Duration = Seconds("1ms")
    max: Duration = Seconds("50ms")

    @model_validator(mode="after")
    def _rules(self) -> MaxQueueDelayBounds:
        if self.min > self.max:
            raise ValueError(
                "spec.autoscaling.maxQueueDelay.min must not exceed spec.autoscaling.maxQueueDelay.max"
            )
        if self.max > MAX_QUEUE_DELAY_LIMIT_SECONDS:
            raise ValueError(
                f"spec.autoscaling.maxQueueDelay.max must be at most {MAX_QUEUE_DELAY_LIMIT_SECONDS}s"
            )
        return self


class PromQueries(_Spec):
    """Optional PromQL overrides of the autoscaler's default queries ("" = default).

    The autoscaler substitutes ``{namespace}`` and ``{name}`` (see ``operator/autoscale/signals.py``).
    """

    p99: str = Field(default="", max_length=4096)
    gpu_utilization: str = Field(default="", max_length=4096)
    request_rate: str = Field(default="", max_length=4096)
    queue_size: str = Field(default="", max_length=4096)


class ScaleToZeroSpec(_Spec):
    """Scale to zero (with ``minReplicas: 0``): how long a service idles before its last replica goes,
    and how long a request held while a replica starts may wait."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    _if_durations("duration(self.idleAfter) > duration('0s')", "idleAfter"),
                    "spec.autoscaling.scaleToZero.idleAfter must be greater than 0",
                    ".idleAfter",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.coldStartTimeout) > duration('0s')", "coldStartTimeout"),
                    "spec.autoscaling.scaleToZero.coldStartTimeout must be greater than 0",
                    ".coldStartTimeout",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    idle_after: Duration = Field(
        default=Seconds("5m"),
        description="Time without requests (none completed, queued or in flight) after which the last "
        "replica goes.",
    )
    cold_start_timeout: Duration = Field(
        default=Seconds(COLD_START_TIMEOUT_DEFAULT),
        description="Longest a request held while the first replica starts waits for it (then 504).",
    )

    @model_validator(mode="after")
    def _rules(self) -> ScaleToZeroSpec:
        if self.idle_after <= 0:
            raise ValueError("spec.autoscaling.scaleToZero.idleAfter must be greater than 0")
        if self.cold_start_timeout <= 0:
            raise ValueError("spec.autoscaling.scaleToZero.coldStartTimeout must be greater than 0")
        return self


#: Fields of ``spec.autoscaling`` that were renamed, old name -> new name: the CRD keeps the old ones
#: only to refuse them with a message naming the new field (``base._schema_with_renamed``).
RENAMED_AUTOSCALING_FIELDS = {
    "batchTimeout": "maxQueueDelay",
    "batchTimeoutCooldown": "maxQueueDelayCooldown",
}


class AutoscalingSpec(_Spec):
    """SLO-driven autoscaling of replicas and of the max queue delay."""

    model_config = ConfigDict(
        json_schema_extra=_schema_with_renamed(
            [
                _cel(
                    "self.minReplicas <= self.maxReplicas",
                    "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
                    ".minReplicas",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.targetP99) > duration('0s')", "targetP99"),
                    "spec.autoscaling.targetP99 must be greater than 0",
                    ".targetP99",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.window) > duration('0s')", "window"),
                    "spec.autoscaling.window must be greater than 0 (a PromQL range)",
                    ".window",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.minReplicas >= 1 || self.enabled",
                    "spec.autoscaling.minReplicas 0 needs spec.autoscaling.enabled (the autoscaler takes "
                    "an idle service to zero)",
                    ".minReplicas",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.scaleToZero) || self.minReplicas == 0",
                    "spec.autoscaling.scaleToZero applies only with spec.autoscaling.minReplicas 0",
                    ".scaleToZero",
                    "FieldValueInvalid",
                ),
                # the schema's minimum lets an exact 0 through (seen on the API server used here)
                _cel(
                    "!has(self.planUtilization) || self.planUtilization >= 0.05",
                    "spec.autoscaling.planUtilization must be at least 0.05",
                    ".planUtilization",
                    "FieldValueInvalid",
                ),
            ],
            "spec.autoscaling",
            RENAMED_AUTOSCALING_FIELDS,
        )
    )

    enabled: bool = False
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas; 0 lets an idle service scale to zero (needs enabled, and the "
        "activator installed: without it the service keeps 1).",
    )
    max_replicas: int = Field(default=4, ge=1, le=1000)
    target_p99: Duration = Field(
        default=Seconds("200ms"), description="P99 latency objective (request duration)."
    )
    gpu_utilization: GpuUtilizationBand = Field(default_factory=GpuUtilizationBand)
    max_queue_delay: MaxQueueDelayBounds = Field(
        default_factory=MaxQueueDelayBounds,
        description="Bounds of the max queue delay the autoscaler tunes (spec.batching.maxQueueDelay is "
        "its start).",
    )
    tolerance: float = Field(default=0.1, ge=0.0, le=1.0, description="Dead band around the target, ratio.")
    window: Duration = Field(default=Seconds("60s"), description="PromQL range window of the signals.")
    scale_down_stabilization: Duration = Field(
        default=Seconds("300s"),
        description="Stabilization window: scale down to the max recommendation over it.",
    )
    scale_up_cooldown: Duration = Seconds("30s")
    scale_down_cooldown: Duration = Seconds("60s")
    max_queue_delay_cooldown: Duration = Field(
        default=Seconds("15s"), description="Least time between two changes of the max queue delay."
    )
    max_scale_up_step: int = Field(default=4, ge=1, le=100, description="Most replicas added per decision.")
    plan_utilization: float = Field(
        default=0.85,
        ge=0.05,
        le=1.0,
        description="Share of a replica's SLO capacity (b/s(b) at the P99 target) the fleet is planned at; "
        "lower keeps more standing headroom for load increases nobody has seen, at a cost in replicas "
        "(the counterpart of the HPA's target utilization).",
    )
    queries: PromQueries = Field(default_factory=PromQueries)
    scale_to_zero: ScaleToZeroSpec | None = Field(
        default=None,
        description="With minReplicas 0: the idle window and the cold-start budget (defaults when absent).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        _refuse_renamed(data, "spec.autoscaling", RENAMED_AUTOSCALING_FIELDS)
        return data

    @model_validator(mode="after")
    def _rules(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas")
        if self.target_p99 <= 0:
            raise ValueError("spec.autoscaling.targetP99 must be greater than 0")
        if self.window <= 0:
            raise ValueError("spec.autoscaling.window must be greater than 0 (a PromQL range)")
        if self.min_replicas == 0 and not self.enabled:
            raise ValueError(
                "spec.autoscaling.minReplicas 0 needs spec.autoscaling.enabled (the autoscaler takes an "
                "idle service to zero)"
            )
        if self.scale_to_zero is not None and self.min_replicas != 0:
            raise ValueError("spec.autoscaling.scaleToZero applies only with spec.autoscaling.minReplicas 0")
        return self

    @property
    def scale_to_zero_in_force(self) -> ScaleToZeroSpec:
        """``scaleToZero`` as written, else its defaults (idle 5m, cold start 2m)."""
        return self.scale_to_zero if self.scale_to_zero is not None else ScaleToZeroSpec()
