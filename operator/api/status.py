"""``InferenceService.status``: conditions, replica counts, the max queue delay in force, and what the
autoscaler last observed and decided.
"""

from __future__ import annotations

from typing import Any, Literal

from kubeinfer.operator.api.base import _Status
from kubeinfer.operator.api.formats import Duration
from pydantic import Field

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(_Status):
    """A ``metav1.Condition``. ``lastTransitionTime``: RFC 3339 UTC string."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ObservedSignals(_Status):
    """The signals the autoscaler last read from Prometheus. ``None`` = unknown (never a zero)."""

    p99: str | None = Field(
        default=None,
        description="P99 request latency as a duration rounded to 3 significant digits, e.g. '23.4ms' "
        "(the P99 printer column; p99Seconds is the same value in seconds).",
    )
    p99_seconds: float | None = Field(default=None, description="P99 request latency, seconds.")
    gpu_utilization: float | None = Field(
        default=None,
        description="Utilization, ratio 0..1: the GPUs' (DCGM), else the runtime's device utilization "
        "(NVML on CUDA; on a service without a GPU, the share of time the runtime's executor is busy).",
    )
    request_rate: float | None = Field(default=None, description="Requests per second.")
    queue_size: float | None = Field(default=None, description="Queued requests (sum over replicas).")
    arrival_rate: float | None = Field(
        default=None, description="Requests per second arriving (the SLO-capacity rule's demand)."
    )
    inflight_requests: float | None = Field(
        default=None, description="Requests received and not yet answered (sum over replicas)."
    )
    service_time_intercept_seconds: float | None = Field(
        default=None, description="The runtime's batch service time s(b) = a + c*b: a, seconds."
    )
    service_time_slope_seconds: float | None = Field(
        default=None, description="The runtime's batch service time s(b) = a + c*b: c, seconds per row."
    )
    instance_concurrency: float | None = Field(
        default=None,
        description="Mean model instances running a batch at once while any is (1 with one instance): "
        "a replica's SLO capacity is this times b / s(b).",
    )
    time: str | None = Field(default=None, description="RFC 3339 time of the observation.")
    unknown_reason: str | None = Field(
        default=None, description="Why a signal is unknown (no data, stale, NaN)."
    )


class QuantizationStatus(_Status):
    """The served model's deviation from fp32, as its runtime measured it at load (its
    ``kubeinfer_quantization_*`` gauges, read from Prometheus by the autoscaler: the least value over the
    service's pods), beside the quality gate's bars."""

    cosine_mean: float | None = Field(
        default=None, description="Embedders: mean cosine of the served embeddings to fp32's, 0..1."
    )
    retrieval_agreement: float | None = Field(
        default=None,
        description="Embedders: share of texts whose nearest neighbour among the others is fp32's, 0..1.",
    )
    label_agreement: float | None = Field(
        default=None,
        description="Classifiers and taggers: share of labels (a tagger's: per token) equal to fp32's; "
        "rerankers: share of queries whose top candidate is fp32's, 0..1.",
    )
    min_cosine: float | None = Field(default=None, description="The gate's bar (spec.quantization.gate).")
    min_agreement: float | None = Field(default=None, description="The gate's bar (spec.quantization.gate).")
    measured_on: str | None = Field(
        default=None,
        description="What the figures were measured on: 'gate texts' (spec.quantization.gate.texts), "
        "'held-out sentences' (the runtime's bundled English sentences) or 'held-out pairs' (a reranker's).",
    )
    texts: int | None = Field(default=None, description="How many texts (or pairs) they were measured on.")
    time: str | None = Field(default=None, description="RFC 3339 time these figures were first read.")


#: Status fields an older operator wrote under another name, old name -> new name: the operator's status
#: patches delete the old ones (``None`` in a merge patch), so a reader finds the new name alone.
RENAMED_STATUS_FIELDS = {"batchTimeout": "maxQueueDelay"}


class AutoscalerDecisionStatus(_Status):
    """The last autoscaling decision."""

    time: str | None = None
    replicas: int | None = None
    max_queue_delay: Duration | None = Field(default=None, description="The max queue delay it chose.")
    reason: str | None = None


class PooledModelStatus(_Status):
    """The model of a pooled InferenceService (``spec.pool``) on its pool's ready replicas, as their model
    repository indexes say (polled every autoscaler interval). Counts are over those replicas, since each
    started."""

    loaded_on: list[str] = Field(default_factory=list, description="Pods of the pool it is loaded on.")
    replicas: int = Field(default=0, description="Ready replicas of the pool that answered their index.")
    resident_bytes: int = Field(
        default=0,
        description="Resident bytes of its process (RSS after load and warmup), the largest of them.",
    )
    last_used: str | None = Field(
        default=None, description="RFC 3339 time of its latest request on any replica, to the minute."
    )
    loads: int = Field(default=0, description="Loads that succeeded.")
    load_failures: int = Field(default=0, description="Loads that failed (the cause: ModelLoadFailed).")
    evictions: int = Field(default=0, description="Unloads for the pool's memory budget.")


class InferenceServiceStatus(_Status):
    """``InferenceService.status``. The operator writes conditions/replicas/selector/url; the autoscaler
    writes ``maxQueueDelay``, ``observed``, ``lastDecision``, ``scaledToZeroAt``, ``quantization`` (and the
    AutoscalingActive condition)."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int | None = Field(
        default=None, description="Pods of every version, surge and old ones included (Deployment's)."
    )
    ready_replicas: int | None = Field(default=None, description="Ready pods of any version.")
    updated_replicas: int | None = Field(default=None, description="Pods of the current version.")
    updated_ready: str | None = Field(
        default=None, description="Ready pods of the current version / desired replicas, e.g. '1/2'."
    )
    selector: str | None = Field(default=None, description="Label selector of the pods (scale subresource).")
    max_queue_delay: Duration | None = Field(
        default=None,
        description="The max queue delay in force (the runtime's batch timeout), a duration: the "
        "autoscaler's with autoscaling on, else spec.batching.maxQueueDelay.",
    )
    url: str | None = None
    observed: ObservedSignals | None = None
    last_decision: AutoscalerDecisionStatus | None = None
    quantization: QuantizationStatus | None = Field(
        default=None,
        description="The served model's deviation from fp32 measured at load (written by the autoscaler from "
        "Prometheus once a pod's metrics are scraped; absent with autoscaling off, or when nothing was "
        "measured: quantization none on engine torch). A model under the gate never serves: its figures "
        "are in the Ready=False QuantizationBelowGate message instead.",
    )
    model: PooledModelStatus | None = Field(
        default=None,
        description="A pooled InferenceService's model on the pool's replicas (loaded on which, bytes, last "
        "use, counts); absent without a replica that answered.",
    )
    scaled_to_zero_at: str | None = Field(
        default=None,
        description="RFC 3339 time the autoscaler last took the service to zero replicas; a demand of the "
        "activator (annotation kubeinfer.io/activator-demand) newer than it brings a replica back.",
    )

    @classmethod
    def from_k8s(cls, status: Any) -> InferenceServiceStatus:
        """Parse a custom resource's ``status`` mapping; unknown keys are ignored."""
        return cls.model_validate(dict(status or {}))

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, or ``None``."""
        return next((c for c in self.conditions if c.type == type_), None)
