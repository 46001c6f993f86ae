"""Prometheus → ``Observation``: the autoscaler's signals for one InferenceService.

Default PromQL (``<sel>`` is ``namespace="<ns>",inferenceservice="<name>"``, ``<w>`` the window):

- P99 seconds: ``histogram_quantile(0.99, sum by (le) (rate(
  kubeinfer_request_duration_seconds_bucket{<sel>}[<w>])))``
- GPU utilization ratio: ``avg(DCGM_FI_DEV_GPU_UTIL{<sel>}) / 100`` when the DCGM exporter's series
  exist, else ``avg(kubeinfer_device_utilization_ratio{<sel>})`` (the runtime's gauge)
- request rate, requests/s: ``sum(rate(kubeinfer_requests_total{<sel>}[<w>]))``
- queue size, requests: ``sum(kubeinfer_queue_size{<sel>})``
- requests in flight (queued + executing): ``sum(kubeinfer_inflight_requests{<sel>})``; the policy's
  drained-backlog rule reads it (Little's law), not the queue size, which leaves out requests executing
- sample age, seconds: ``time() - max(timestamp(kubeinfer_queue_size{<sel>}))``
- arrival rate, requests/s (optional, for the SLO-capacity rule):
  ``sum(irate(kubeinfer_requests_total{<sel>}[30s])) + sum(deriv(kubeinfer_inflight_requests{<sel>}[30s]))``
  (completions over the last two samples plus the growth of the requests in flight: the runtime counts
  responses, not arrivals; the window is two autoscaler intervals)
- s(b) = a + c*b and B (optional, for the SLO-capacity rule):
  ``avg(kubeinfer_service_time_intercept_seconds{<sel>} >= 0)``,
  ``avg(kubeinfer_service_time_slope_seconds{<sel>} > 0)`` (the runtime's fit, ``runtime/service_time.py``;
  the comparison drops a pod still exporting NaN, i.e. no fit yet; without them the rule is off and the
  reactive law decides) and
  ``min(kubeinfer_max_batch_size{<sel>})``
- instance concurrency (optional, for the SLO-capacity rule): ``avg(kubeinfer_instance_concurrency{<sel>})``,
  the mean number of model instances running a batch at once while any is (1 with one instance); a
  replica's SLO capacity is this times b / s(b)

Beside the signals, the runtime's deviation from fp32 measured at load (``status.quantization``, not a
signal: the policy never reads it): ``quantization_query`` selects the gauges of :data:`QUANTIZATION_FIGURES`
and ``kubeinfer_quantization_compared_texts`` of the service's pods, ``parse_quantization`` keeps the
least value of each over the pods.

Each signal can be overridden per InferenceService (``spec.autoscaling.queries``); an override may use the
placeholders ``{namespace}``, ``{name}`` and ``{window}`` (replaced textually, so PromQL braces need
no escaping).

Pure: no I/O here (an import-linter contract). ``read_signals`` takes the query function; the HTTP
client that answers it, ``PrometheusSignals``, and its ``PrometheusConfig`` are in ``prometheus.py``.

Nothing is ever read as zero when it is not there: a query error or Prometheus down
(``PrometheusUnavailable``, ``QueryError``, decided here) and an empty result, NaN, +Inf, a negative
value or samples older than ``stale_after_seconds`` (``MetricsMissing``, ``InvalidMetrics``,
``StaleMetrics``, ``UnusableSignals``, decided by ``policy.check_observation``, the one place that
judges values) give an ``Observation`` whose ``unknown_reason`` says why and a
``Reading.condition_reason`` for the ``AutoscalingActive`` condition. One case is not unknown: with a
measured request rate of exactly 0 the P99 is undefined (NaN from ``histogram_quantile``) and the
service is idle (see ``policy.Observation.idle``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kubeinfer.operator import conditions
from kubeinfer.operator.autoscale.policy import (
    READER_REQUIRES,
    Observation,
    Problem,
    check_observation,
)

logger = logging.getLogger(__name__)

__all__ = [
    "QuantizationReading",
    "Queries",
    "Reading",
    "SignalError",
    "default_queries",
    "parse_history",
    "parse_quantization",
    "pool_queries",
    "quantization_query",
    "read_signals",
]


class SignalError(Exception):
    """A signal could not be read; ``reason`` is the condition reason, the message says which query."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Queries:
    """The PromQL of each signal. ``gpu_utilization`` is tried in order until one returns data."""

    p99: str
    gpu_utilization: tuple[str, ...]
    request_rate: str
    queue_size: str
    sample_age: str
    inflight: str = ""
    """Requests in flight (queued + executing); ``""`` = not queried (``Observation.inflight_requests``
    is then ``None``)."""
    arrival_rate: str = ""
    """Requests/s arriving over a short window; ``""`` = not queried."""
    service_time_a: str = ""
    """s(b)'s fixed part a, seconds; ``""`` = not queried."""
    service_time_c: str = ""
    """s(b)'s slope c, seconds per row; ``""`` = not queried."""
    max_batch_size: str = ""
    """The runtime's max batch size in force, rows; ``""`` = not queried."""
    instance_concurrency: str = ""
    """Mean model instances running a batch at once while any is; ``""`` = not queried."""


#: The target label of a ModelPool's pods' series (the chart's PodMonitor relabels the pods' label
#: ``kubeinfer.io/pool``, which the pool's Deployment sets, to it), as ``inferenceservice`` is an
#: InferenceService's.
POOL_TARGET_LABEL = "pool"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _selector(namespace: str, name: str, label: str = "inferenceservice") -> str:
    return f'namespace="{_esc(namespace)}",{label}="{_esc(name)}"'


def default_queries(
    namespace: str,
    name: str,
    window: str,
    overrides: Mapping[str, str] | None = None,
    *,
    arrival_window: str = "30s",
) -> Queries:
    """The default queries for one InferenceService, with non-empty ``overrides`` substituted.

    Args:
        namespace, name: the InferenceService.
        window: a PromQL range duration such as ``"60s"``.
        overrides: keys ``p99``, ``gpu_utilization``, ``request_rate``, ``queue_size`` (snake_case, as
            ``api.PromQueries``' fields); ``""`` keeps the default. Placeholders ``{namespace}``,
            ``{name}`` and ``{window}`` are replaced.
    """
    return _queries(_selector(namespace, name), namespace, name, window, overrides, arrival_window)


def pool_queries(
    namespace: str,
    pool: str,
    window: str,
    overrides: Mapping[str, str] | None = None,
    *,
    arrival_window: str = "30s",
) -> Queries:
    """The queries of one ModelPool: :func:`default_queries`' over the series of the pool's pods
    (``namespace="<ns>",pool="<pool>"``, :data:`POOL_TARGET_LABEL`), so over every model the pool serves:
    the P99 of all its models' requests, their queues, the pods' utilization, the arrival rate. Without
    s(b), the max batch size and the instance concurrency (each model has its own fit, its own batches and
    its own instances; an average over models is no one's), so the SLO-capacity rule is off and the
    reactive law decides. ``{name}`` in an override is the pool's name."""
    full = _queries(
        _selector(namespace, pool, POOL_TARGET_LABEL), namespace, pool, window, overrides, arrival_window
    )
    return replace(full, service_time_a="", service_time_c="", max_batch_size="", instance_concurrency="")


def _queries(
    sel: str,
    namespace: str,
    name: str,
    window: str,
    overrides: Mapping[str, str] | None,
    arrival_window: str,
) -> Queries:
    """:func:`default_queries` over the series that ``sel`` selects."""

    def fill(q: str) -> str:
        return q.replace("{namespace}", namespace).replace("{name}", name).replace("{window}", window)

    o = {k: v for k, v in (overrides or {}).items() if v}
    gpu = (
        (fill(o["gpu_utilization"]),)
        if "gpu_utilization" in o
        else (
            f"avg(DCGM_FI_DEV_GPU_UTIL{{{sel}}}) / 100",
            f"avg(kubeinfer_device_utilization_ratio{{{sel}}})",
        )
    )
    bucket = f"kubeinfer_request_duration_seconds_bucket{{{sel}}}"
    return Queries(
        p99=fill(o["p99"])
        if "p99" in o
        else f"histogram_quantile(0.99, sum by (le) (rate({bucket}[{window}])))",
        gpu_utilization=gpu,
        request_rate=fill(o["request_rate"])
        if "request_rate" in o
        else f"sum(rate(kubeinfer_requests_total{{{sel}}}[{window}]))",
        queue_size=fill(o["queue_size"]) if "queue_size" in o else f"sum(kubeinfer_queue_size{{{sel}}})",
        sample_age=f"time() - max(timestamp(kubeinfer_queue_size{{{sel}}}))",
        inflight=f"sum(kubeinfer_inflight_requests{{{sel}}})",
        # Arrivals = completions + growth of the requests in flight (the runtime counts responses).
        arrival_rate=(
            f"sum(irate(kubeinfer_requests_total{{{sel}}}[{arrival_window}])) + "
            f"sum(deriv(kubeinfer_inflight_requests{{{sel}}}[{arrival_window}]))"
        ),
        # ">= 0" / "> 0" drop a pod that has no fit yet (NaN) instead of turning the average into NaN.
        service_time_a=f"avg(kubeinfer_service_time_intercept_seconds{{{sel}}} >= 0)",
        service_time_c=f"avg(kubeinfer_service_time_slope_seconds{{{sel}}} > 0)",
        max_batch_size=f"min(kubeinfer_max_batch_size{{{sel}}})",
        instance_concurrency=f"avg(kubeinfer_instance_concurrency{{{sel}}})",
    )


@dataclass(frozen=True)
class Reading:
    """An observation and, when it is unknown, the condition reason (``None`` when known)."""

    observation: Observation
    condition_reason: str | None


class QueryFn(Protocol):
    """Runs one PromQL instant query; returns the ``data.result`` list or raises ``SignalError``."""

    def __call__(self, promql: str) -> list[dict[str, Any]]: ...


def _scalar(result: Sequence[Mapping[str, Any]], what: str, promql: str) -> float | None:
    """The single value of an instant-vector result; ``None`` when empty. Raises ``SignalError``."""
    if not result:
        return None
    if len(result) > 1:
        logger.debug("%s: %d series from %s", what, len(result), promql)
        raise SignalError(conditions.QUERY_ERROR, f"{what}: query returned {len(result)} series, expected 1")
    try:
        return float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        logger.debug("%s: unexpected result %r from %s", what, result[0], promql)
        raise SignalError(
            conditions.QUERY_ERROR, f"{what}: unexpected result {str(result[0])[:100]}"
        ) from exc


def parse_history(result: Sequence[Mapping[str, Any]], what: str) -> list[tuple[float, float]]:
    """The samples of a range query's matrix result: ``(unix seconds, value)``, oldest first.

    Samples that are NaN, infinite or negative are left out (never read as zero); an empty result is
    no samples. Raises ``SignalError`` (QueryError) naming ``what`` when the result holds more than one
    series or a sample does not parse.
    """
    if not result:
        return []
    if len(result) > 1:
        raise SignalError(conditions.QUERY_ERROR, f"{what}: query returned {len(result)} series, expected 1")
    try:
        samples = [(float(ts), float(value)) for ts, value in result[0]["values"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SignalError(
            conditions.QUERY_ERROR, f"{what}: unexpected result {str(result[0])[:100]}"
        ) from exc
    return [(ts, v) for ts, v in samples if math.isfinite(v) and v >= 0]


def _ask(query: QueryFn, promql: str, what: str) -> float | None:
    """``_scalar(query(promql))``; a failed query's message is prefixed with the signal's name
    (``what``), not its PromQL (the full text is logged at DEBUG by ``PrometheusSignals.query``)."""
    try:
        result = query(promql)
    except SignalError as exc:
        raise SignalError(exc.reason, f"{what}: {exc}") from exc
    return _scalar(result, what, promql)


def read_signals(query: QueryFn, queries: Queries, stale_after_seconds: float) -> Reading:
    """Run the queries and turn the answers into an ``Observation``.

    Required (``policy.READER_REQUIRES``): request rate, a sample age no older than
    ``stale_after_seconds``, GPU utilization and P99 (NaN allowed when the rate is a measured 0).
    Queue size and requests in flight are optional (``None`` when absent, NaN, infinite or negative).
    Values are judged by ``policy.check_observation`` only.

    Args:
        query: runs one instant query (``PrometheusSignals.query``); raises ``SignalError``.
        queries: the PromQL of each signal.
        stale_after_seconds: the largest acceptable sample age, seconds (``Policy.stale_after_seconds``).
    """
    try:
        util: float | None = None
        for q in queries.gpu_utilization:
            util = _ask(query, q, "GPU utilization")
            if util is not None:
                break
        raw = Observation(
            request_rate=_ask(query, queries.request_rate, "request rate"),
            sample_age_seconds=_ask(query, queries.sample_age, "sample age"),
            gpu_utilization=util,
            p99_seconds=_ask(query, queries.p99, "P99"),
            queue_size=_ask(query, queries.queue_size, "queue size"),
            inflight_requests=_ask(query, queries.inflight, "in flight") if queries.inflight else None,
            arrival_rate=_ask(query, queries.arrival_rate, "arrival rate") if queries.arrival_rate else None,
            service_time_a_seconds=(
                _ask(query, queries.service_time_a, "s(b) intercept") if queries.service_time_a else None
            ),
            service_time_c_seconds=(
                _ask(query, queries.service_time_c, "s(b) slope") if queries.service_time_c else None
            ),
            max_batch_size=(
                _ask(query, queries.max_batch_size, "max batch size") if queries.max_batch_size else None
            ),
            instance_concurrency=(
                _ask(query, queries.instance_concurrency, "instance concurrency")
                if queries.instance_concurrency
                else None
            ),
        )
    except SignalError as exc:
        return Reading(Observation.unknown(str(exc)), exc.reason)
    checked = check_observation(raw, stale_after_seconds, READER_REQUIRES)
    if isinstance(checked, Problem):
        return Reading(Observation.unknown(checked.message), checked.reason)
    return Reading(checked, None)


#: The runtime's gauges of its deviation from fp32 measured at load (runtime/metrics.py), by the field of
#: ``status.quantization`` each fills.
QUANTIZATION_FIGURES = {
    "kubeinfer_quantization_cosine_mean_ratio": "cosineMean",
    "kubeinfer_quantization_retrieval_agreement_ratio": "retrievalAgreement",
    "kubeinfer_quantization_label_agreement_ratio": "labelAgreement",
}
#: The runtime's gauge of how many texts those were measured on, labelled ``measured_on`` with which;
#: absent when nothing was measured (quantization none on engine torch: the figures are 1 by definition).
QUANTIZATION_TEXTS = "kubeinfer_quantization_compared_texts"


@dataclass(frozen=True)
class QuantizationReading:
    """The deviation from fp32 the pods of a service measured at load.

    Attributes:
        figures: ``status.quantization`` field (:data:`QUANTIZATION_FIGURES`) -> the least value over the
            pods (the worst replica), a ratio in [0, 1].
        measured_on: the texts they were measured on (``gate texts``, ``held-out sentences``,
            ``held-out pairs``).
        texts: how many (the least over the pods).
    """

    figures: Mapping[str, float]
    measured_on: str
    texts: int


def quantization_query(namespace: str, name: str) -> str:
    """One instant query selecting every series of :data:`QUANTIZATION_FIGURES` and
    :data:`QUANTIZATION_TEXTS` of an InferenceService's pods."""
    names = "|".join(
        n.removeprefix("kubeinfer_quantization_") for n in (*QUANTIZATION_FIGURES, QUANTIZATION_TEXTS)
    )
    return f'{{__name__=~"kubeinfer_quantization_({names})",{_selector(namespace, name)}}}'


def parse_quantization(result: Sequence[Mapping[str, Any]]) -> QuantizationReading | None:
    """The reading in the answer to :func:`quantization_query`: per figure the least finite value in
    [-1, 1] over the series (one per pod), the texts from :data:`QUANTIZATION_TEXTS` (the least count;
    of several ``measured_on`` during a rollout, the first in sort order). ``None`` when no pod measured
    anything (no :data:`QUANTIZATION_TEXTS` series) or no figure is usable. A series that does not parse
    is left out."""
    figures: dict[str, float] = {}
    counts: dict[str, float] = {}
    for row in result:
        metric = row.get("metric") or {}
        try:
            value = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        series = str(metric.get("__name__", ""))
        if series == QUANTIZATION_TEXTS and metric.get("measured_on") and value >= 0:
            on = str(metric["measured_on"])
            counts[on] = min(value, counts.get(on, value))
        elif series in QUANTIZATION_FIGURES and -1 <= value <= 1:  # a mean cosine may be negative
            field = QUANTIZATION_FIGURES[series]
            figures[field] = min(value, figures.get(field, value))
    if not counts or not figures:
        return None
    measured_on = sorted(counts)[0]
    return QuantizationReading(figures=figures, measured_on=measured_on, texts=int(counts[measured_on]))
