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

Each can be overridden per InferenceService (``spec.autoscaling.queries``); an override may use the
placeholders ``{namespace}``, ``{name}`` and ``{window}`` (replaced textually, so PromQL braces need
no escaping).

Nothing is ever read as zero when it is not there: an empty result, NaN, +Inf, a query error,
Prometheus down, or samples older than the window give an ``Observation`` whose ``unknown_reason``
says why, and a ``Reading.condition_reason`` (``PrometheusUnavailable``, ``QueryError``,
``MetricsMissing``, ``InvalidMetrics``, ``StaleMetrics``) for the ``AutoscalingActive`` condition.
One case is not unknown: with a measured request rate of exactly 0 the P99 is undefined (NaN from
``histogram_quantile``) and the service is idle (see ``policy.Observation.idle``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests
from kubeinfer.operator.autoscale.policy import Observation
from kubeinfer.operator.settings import Settings
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

__all__ = [
    "PrometheusConfig",
    "PrometheusSignals",
    "Queries",
    "Reading",
    "SignalError",
    "default_queries",
    "read_signals",
]

#: ``AutoscalingActive=False`` reasons.
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
QUERY_ERROR = "QueryError"
METRICS_MISSING = "MetricsMissing"
INVALID_METRICS = "InvalidMetrics"
STALE_METRICS = "StaleMetrics"


class SignalError(Exception):
    """A signal could not be read; ``reason`` is the condition reason, the message says which query."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PrometheusConfig:
    """How to reach Prometheus.

    Attributes:
        url: base URL, e.g. ``http://prometheus.monitoring:9090``.
        bearer_token_file: a file whose content is sent as ``Authorization: Bearer <token>`` (re-read on
            every client creation, so a rotated service-account token is picked up).
        ca_file: PEM bundle to verify the server's certificate; ``None`` = the system's.
        insecure_skip_verify: do not verify TLS certificates (testing only).
        timeout_seconds: per-query HTTP timeout, seconds.
    """

    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_seconds: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusConfig:
        """Build from the operator settings (env ``KUBEINFER_PROMETHEUS_*``, flags ``--prometheus-*``).

        Raises ``ValueError`` when ``prometheus_url`` is empty.
        """
        if not settings.prometheus_url:
            raise ValueError("operator settings: prometheus_url (KUBEINFER_PROMETHEUS_URL) is empty")
        return cls(
            url=settings.prometheus_url.rstrip("/"),
            bearer_token_file=settings.prometheus_bearer_token_file or None,
            ca_file=settings.prometheus_ca_file or None,
            insecure_skip_verify=settings.prometheus_insecure_skip_verify,
            timeout_seconds=settings.prometheus_timeout_seconds,
        )


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


def _selector(namespace: str, name: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')

    return f'namespace="{esc(namespace)}",inferenceservice="{esc(name)}"'


def default_queries(
    namespace: str, name: str, window: str, overrides: Mapping[str, str] | None = None
) -> Queries:
    """The default queries for one InferenceService, with non-empty ``overrides`` substituted.

    Args:
        namespace, name: the InferenceService.
        window: a PromQL range duration such as ``"60s"``.
        overrides: keys ``p99``, ``gpu_utilization``, ``request_rate``, ``queue_size`` (snake_case, as
            ``api.PromQueries``' fields); ``""`` keeps the default. Placeholders ``{namespace}``,
            ``{name}`` and ``{window}`` are replaced.
    """
    sel = _selector(namespace, name)

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
        raise SignalError(QUERY_ERROR, f"{what}: query returned {len(result)} series, expected 1: {promql}")
    try:
        return float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SignalError(QUERY_ERROR, f"{what}: unexpected result {result[0]!r}: {promql}") from exc


def _bad(x: float) -> bool:
    return math.isnan(x) or math.isinf(x)


def read_signals(query: QueryFn, queries: Queries, window_seconds: float) -> Reading:
    """Run the queries and turn the answers into an ``Observation``.

    Required: request rate, GPU utilization, P99 (unless the rate is a measured 0) and a sample age
    no older than ``window_seconds``. Queue size and requests in flight are optional (``None`` when
    absent, NaN, infinite or negative).
    """

    def unknown(reason: str, message: str) -> Reading:
        return Reading(Observation.unknown(message), reason)

    try:
        rate = _scalar(query(queries.request_rate), "request rate", queries.request_rate)
        if rate is None:
            return unknown(METRICS_MISSING, "no request-rate data for this service")
        if _bad(rate) or rate < 0:
            return unknown(INVALID_METRICS, f"request rate is {rate}")
        age = _scalar(query(queries.sample_age), "sample age", queries.sample_age)
        if age is None:
            return unknown(METRICS_MISSING, "no runtime samples for this service")
        if _bad(age) or age > window_seconds:
            return unknown(
                STALE_METRICS, f"stale metrics: newest sample {age:.0f} s old (window {window_seconds:.0f} s)"
            )
        util: float | None = None
        for q in queries.gpu_utilization:
            util = _scalar(query(q), "GPU utilization", q)
            if util is not None:
                break
        if util is None:
            return unknown(METRICS_MISSING, "no GPU utilization data for this service")
        if _bad(util) or util < 0:
            return unknown(INVALID_METRICS, f"GPU utilization is {util}")
        p99 = _scalar(query(queries.p99), "P99", queries.p99)
        if p99 is None:
            return unknown(METRICS_MISSING, "no request-duration data for this service")
        if _bad(p99):
            if not (math.isnan(p99) and rate == 0.0):
                return unknown(INVALID_METRICS, f"P99 latency is {p99}")
            p99_value: float | None = None  # idle: no requests, no latency
        else:
            p99_value = p99
        queue = _scalar(query(queries.queue_size), "queue size", queries.queue_size)
        if queue is not None and (_bad(queue) or queue < 0):
            queue = None
        inflight = (
            _scalar(query(queries.inflight), "in flight", queries.inflight) if queries.inflight else None
        )
        if inflight is not None and (_bad(inflight) or inflight < 0):
            inflight = None
    except SignalError as exc:
        return unknown(exc.reason, str(exc))
    return Reading(
        Observation(
            p99_seconds=p99_value,
            gpu_utilization=min(util, 1.0),
            request_rate=rate,
            queue_size=queue,
            sample_age_seconds=max(age, 0.0),
            inflight_requests=inflight,
        ),
        None,
    )


class PrometheusSignals:
    """Reads signals from a real Prometheus through ``prometheus_api_client.PrometheusConnect``.

    Blocking (``requests``): call it from a worker thread in async code. One instance per
    ``PrometheusConfig``; it keeps an HTTP session.
    """

    def __init__(
        self, config: PrometheusConfig, session_factory: Callable[[], requests.Session] | None = None
    ):
        self.config = config
        session = (session_factory or requests.Session)()
        session.verify = False if config.insecure_skip_verify else (config.ca_file or True)
        headers: dict[str, str] = {}
        if config.bearer_token_file:
            token = Path(config.bearer_token_file).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        self._client = PrometheusConnect(
            url=config.url,
            headers=headers or None,
            retry=Retry(total=1, backoff_factor=0, status_forcelist=(502, 503, 504)),
            session=session,
            timeout=config.timeout_seconds,
        )

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """One instant query. Raises ``SignalError`` (PrometheusUnavailable or QueryError)."""
        try:
            result = self._client.custom_query(promql)
        except PrometheusApiClientException as exc:
            text = str(exc)
            reason = (
                QUERY_ERROR
                if "Status Code 4" in text and "Status Code 429" not in text
                else PROMETHEUS_UNAVAILABLE
            )
            raise SignalError(reason, f"Prometheus answered an error for {promql}: {text[:300]}") from exc
        except (requests.RequestException, ValueError) as exc:
            raise SignalError(
                PROMETHEUS_UNAVAILABLE, f"Prometheus unavailable at {self.config.url}: {exc}"
            ) from exc
        if not isinstance(result, list):
            raise SignalError(QUERY_ERROR, f"unexpected answer to {promql}: {result!r}"[:300])
        return result

    def read(self, queries: Queries, window_seconds: float) -> Reading:
        """``read_signals`` against this Prometheus."""
        return read_signals(self.query, queries, window_seconds)
