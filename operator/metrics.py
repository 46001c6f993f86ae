"""The operator's own Prometheus metrics (prometheus-client), served by :func:`serve`.

Two kinds:

- the operator's work: reconciles, their duration and errors, its API writes;
- the state of every InferenceService it watches, as kube-state-metrics exposes a Deployment's, for the
  chart's dashboard and alert rules (``charts/kubeinfer/files/``), each with the labels ``namespace``
  and ``inferenceservice`` (the chart's ServiceMonitor keeps them: ``honorLabels``), the names the
  runtime pods' series carry too, so a rule joins the two:

  - ``kubeinfer_inferenceservice_condition{type, status, reason}`` gauge, 1 per condition as stored
    (``status.conditions``);
  - ``kubeinfer_inferenceservice_replicas``, ``kubeinfer_inferenceservice_ready_replicas`` gauges: the
    pods of every version and the ready ones (``status.replicas``, ``status.readyReplicas``);
  - with ``spec.autoscaling.enabled``: ``kubeinfer_inferenceservice_target_p99_seconds``,
    ``kubeinfer_inferenceservice_min_replicas`` and ``kubeinfer_inferenceservice_max_replicas`` gauges
    (the spec's targetP99, minReplicas, maxReplicas), and ``kubeinfer_autoscaler_decisions_total{change}``
    counter: the autoscaler's decisions that changed something, by ``change`` (``scale_up``,
    ``scale_down``, ``max_queue_delay``: a decision that changes both counts once per change).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pydantic
from kubeinfer.operator import api
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RECONCILES = Counter(
    "kubeinfer_operator_reconciles_total",
    "InferenceService reconciles, by result (ok|retry|error|gone).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "kubeinfer_operator_reconcile_duration_seconds",
    "Duration of one InferenceService reconcile, seconds.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
RECONCILE_ERRORS = Counter(
    "kubeinfer_operator_reconcile_errors_total", "Failed reconciles, by kind (transient|permanent).", ["kind"]
)

API_WRITES = Counter(
    "kubeinfer_operator_api_writes_total",
    "Write requests sent by the operator's own client (not kopf's), by verb and resource.",
    ["verb", "resource"],
)

#: The labels that name an InferenceService on every per-service series.
SERVICE_LABELS = ("namespace", "inferenceservice")

#: What an autoscaler decision changed (the ``change`` label of ``kubeinfer_autoscaler_decisions_total``).
SCALE_UP, SCALE_DOWN, MAX_QUEUE_DELAY = "scale_up", "scale_down", "max_queue_delay"

AUTOSCALER_DECISIONS = Counter(
    "kubeinfer_autoscaler_decisions_total",
    "Autoscaler decisions that changed something, by what they changed "
    "(scale_up|scale_down|max_queue_delay).",
    [*SERVICE_LABELS, "change"],
)


def count_decision(
    namespace: str, name: str, *, replicas_before: int, replicas_after: int, max_queue_delay_changed: bool
) -> None:
    """Count one autoscaler decision of the InferenceService ``namespace/name``: ``scale_up`` or
    ``scale_down`` when ``replicas_after`` differs from ``replicas_before``, ``max_queue_delay`` when
    ``max_queue_delay_changed``; nothing for a decision that changed neither."""
    if replicas_after > replicas_before:
        AUTOSCALER_DECISIONS.labels(namespace, name, SCALE_UP).inc()
    elif replicas_after < replicas_before:
        AUTOSCALER_DECISIONS.labels(namespace, name, SCALE_DOWN).inc()
    if max_queue_delay_changed:
        AUTOSCALER_DECISIONS.labels(namespace, name, MAX_QUEUE_DELAY).inc()


@dataclass(frozen=True)
class ServiceState:
    """What the state metrics say of one InferenceService (from its body as stored).

    ``conditions``: ``(type, status, reason)`` per condition; replica counts are pods (``None``:
    not reported yet); ``target_p99_seconds``, ``min_replicas`` and ``max_replicas`` are set only
    with autoscaling on and a valid spec.
    """

    namespace: str
    name: str
    conditions: tuple[tuple[str, str, str], ...]
    replicas: int | None
    ready_replicas: int | None
    target_p99_seconds: float | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None


def service_state(body: Mapping[str, Any]) -> ServiceState:
    """The :class:`ServiceState` of an InferenceService ``body`` (a watch event's object). Never
    raises on a bad spec or status: what cannot be read is left out (an invalid spec still has its
    conditions, which say why)."""
    meta = body.get("metadata") or {}
    raw_status = body.get("status") or {}
    conditions = tuple(
        (str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason", "")))
        for c in raw_status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type")
    )

    def count(field: str) -> int | None:
        value = raw_status.get(field)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    state = ServiceState(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        conditions=conditions,
        replicas=count("replicas"),
        ready_replicas=count("readyReplicas"),
    )
    try:
        spec = api.InferenceServiceSpec.from_k8s(body.get("spec"))
    except pydantic.ValidationError:
        return state
    scaling = spec.autoscaling
    if not scaling.enabled:
        return state
    return replace(
        state,
        target_p99_seconds=float(scaling.target_p99),
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
    )


#: The per-InferenceService gauges: ``ServiceState`` field (the metric is
#: ``kubeinfer_inferenceservice_<field>``) and its help text.
_STATE_GAUGES = {
    "replicas": "Pods of every version, surge and old ones included (status.replicas).",
    "ready_replicas": "Ready pods of any version (status.readyReplicas).",
    "target_p99_seconds": "The autoscaler's P99 latency target (spec.autoscaling.targetP99), seconds.",
    "min_replicas": "The autoscaler's lower bound (spec.autoscaling.minReplicas).",
    "max_replicas": "The autoscaler's upper bound (spec.autoscaling.maxReplicas).",
}


class InferenceServiceCollector(Collector):
    """The per-InferenceService state gauges, from the latest body of each (:meth:`observe`) until it
    is deleted (:meth:`forget`); read at scrape time, so a scrape sees the status as last stored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the scrape runs in prometheus-client's server thread
        self._states: dict[tuple[str, str], ServiceState] = {}

    def observe(self, body: Mapping[str, Any]) -> None:
        """Keep the state of the InferenceService ``body`` (replacing what was kept of it)."""
        state = service_state(body)
        with self._lock:
            self._states[(state.namespace, state.name)] = state

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted InferenceService: its gauges and its decision counters disappear."""
        with self._lock:
            self._states.pop((namespace, name), None)
        for change in (SCALE_UP, SCALE_DOWN, MAX_QUEUE_DELAY):
            with contextlib.suppress(KeyError):  # never counted
                AUTOSCALER_DECISIONS.remove(namespace, name, change)

    def collect(self) -> Iterator[Metric]:
        """The gauge families, one sample per InferenceService (per condition for the condition)."""
        with self._lock:
            states = sorted(self._states.values(), key=lambda s: (s.namespace, s.name))
        condition = GaugeMetricFamily(
            "kubeinfer_inferenceservice_condition",
            "The InferenceService's conditions as stored: 1 per (type, status, reason).",
            labels=[*SERVICE_LABELS, "type", "status", "reason"],
        )
        gauges = {
            field: GaugeMetricFamily(f"kubeinfer_inferenceservice_{field}", doc, labels=list(SERVICE_LABELS))
            for field, doc in _STATE_GAUGES.items()
        }
        for s in states:
            key = [s.namespace, s.name]
            for ctype, cstatus, reason in s.conditions:
                condition.add_metric([*key, ctype, cstatus, reason], 1.0)
            for field, family in gauges.items():
                value = getattr(s, field)
                if value is not None:
                    family.add_metric(key, float(value))
        yield condition
        yield from gauges.values()


#: The operator process's collector, registered with the default registry that :func:`serve` serves.
INFERENCE_SERVICES = InferenceServiceCollector()


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Register :data:`INFERENCE_SERVICES` with ``registry`` (once: a second call is a no-op)."""
    with contextlib.suppress(ValueError):  # already registered
        registry.register(INFERENCE_SERVICES)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Register the state collector and serve ``/metrics`` on ``addr:port`` from a daemon thread (no-op
    when ``port`` is 0)."""
    if port:
        register()
        start_http_server(port, addr=addr)
