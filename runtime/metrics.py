"""Prometheus metrics of the runtime (``/metrics``), prometheus-client, all prefixed ``kubeinfer_``.

Every metric carries the label ``model``. Names (the cross-team contract; the autoscaler queries them):

- ``kubeinfer_request_duration_seconds`` histogram: receipt of an infer request to its response, every
  status code included.
- ``kubeinfer_queue_duration_seconds`` histogram: per request, enqueue to the moment an executor starts its
  batch, less the batch's preprocessing when it was preprocessed ahead while waiting (that is compute
  input time; the wait for the executor after it is queue time): queue and compute never overlap.
- ``kubeinfer_compute_duration_seconds`` histogram: per batch, preprocess + execute wall time.
- ``kubeinfer_batch_size`` histogram: rows per executed batch.
- ``kubeinfer_requests_total{code}`` counter: infer responses by HTTP status code (``code="200"`` from the
  start, at 0).
- ``kubeinfer_queue_size`` gauge (requests waiting), ``kubeinfer_inflight_requests`` gauge (infer requests
  received and not yet answered).
- ``kubeinfer_max_queue_delay_seconds``, ``kubeinfer_max_batch_size``, ``kubeinfer_max_queue_size`` gauges:
  the values in force (``kubeinfer_queue_size`` over ``kubeinfer_max_queue_size`` is how full the queue is).
- ``kubeinfer_device_utilization_ratio`` gauge 0..1: on CUDA, NVML's GPU utilization (the fraction of the
  last sample period a kernel ran, ``nvmlDeviceGetUtilizationRates().gpu / 100``); on CPU, the fraction of
  wall time the executor threads were busy running batches over the last ``UTILIZATION_WINDOW_SECONDS``
  (busy seconds / (window * executors)).
- ``kubeinfer_instance_concurrency`` gauge, 1 to the instance count: the mean number of model instances
  running a batch while at least one is, over the same window (busy executor-seconds / seconds with any
  busy; 1 when idle). A replica serves this times b / s(b); the autoscaler's SLO-capacity rule reads it.
- ``kubeinfer_accelerator_memory_bytes`` gauge: on CUDA, bytes the process's torch allocator reserved on
  the device (``torch.cuda.memory_reserved``); absent on CPU (there is no accelerator).
- ``kubeinfer_model_fetch_seconds``, ``kubeinfer_model_fetch_bytes`` gauges: what the fetch init container
  (``kubeinfer-runtime fetch``) took and downloaded, from ``<model.source>/.kubeinfer-fetch.json``; absent
  when the model was not fetched.
- ``kubeinfer_model_load_seconds``, ``kubeinfer_warmup_seconds`` gauges; the quantization gauges
  ``kubeinfer_quantization_cosine_mean_ratio`` and ``kubeinfer_quantization_retrieval_agreement_ratio``
  (an embedder's), ``kubeinfer_quantization_label_agreement_ratio``,
  ``kubeinfer_quantization_score_deviation_mean`` and ``kubeinfer_quantization_score_deviation_max`` (a
  classifier's or a reranker's), each set when the model reports it; and
  ``kubeinfer_quantization_compared_texts{measured_on}``, how many texts (or pairs) they were measured
  on and which (``gate texts``, ``held-out sentences``, ``held-out pairs``), only when they were
  measured (the operator copies these into ``status.quantization``).
- ``kubeinfer_service_time_intercept_seconds`` and ``kubeinfer_service_time_slope_seconds`` gauges: the
  batch service time s(b) = a + c*b fitted from the batches run (``service_time.ServiceTimeFit``, seeded
  at warmup), a in seconds and c in seconds per row; NaN until fitted. The autoscaler's SLO-capacity rule
  reads them.
- ``kubeinfer_cold_start_stage_seconds{stage, graph_cache}`` histogram: each stage of this process's start
  (``fetched``, ``loaded``, ``warmed``, ``first_answer``) observed once, in seconds since the process
  started; ``graph_cache`` is ``hit``, ``miss`` or ``none`` (``kubeinfer.runtime.startup``).
- ``kubeinfer_config_reload_errors_total`` counter: config-file changes rejected by the watcher.
- ``kubeinfer_cache_hits_total``, ``kubeinfer_cache_misses_total``, ``kubeinfer_cache_evictions_total``
  counters and ``kubeinfer_cache_bytes``, ``kubeinfer_cache_entries`` gauges: the response cache
  (``kubeinfer.runtime.cache``; Triton's ``nv_cache_num_hits_per_model`` and friends), 0 when it is off.
- ``kubeinfer_truncated_rows_total`` counter: text rows longer than the model's window that were cut
  to it (``model.overflow: truncate``; with refuse they get 413 instead); ``kubeinfer_chunked_rows_total``:
  those split into windows whose embeddings are pooled or whose entities are merged (``chunk``).
- ``kubeinfer_shed_requests_total{priority, reason}`` counter: requests answered 429 because the queue
  was full, by priority level (1 highest): ``refused`` at arrival, or ``displaced`` from the queue by an
  arrival of a higher priority.

The same calls (``count_request``, ``observe_queue``, ``observe_batch``) feed ``statistics``, the
model's statistics of Triton's statistics extension (``kubeinfer.runtime.statistics``), so the two
never disagree.

:func:`merge_expositions` makes one exposition of several processes' (the model repository mode's
``/metrics``: the repository's series and each loaded model's process's, each of those labelled with its
``model``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kubeinfer.runtime.service_time import ServiceTimeFit
from kubeinfer.runtime.startup import COLD_START_BUCKETS, ColdStart
from kubeinfer.runtime.statistics import ModelStatistics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

#: Width of the sliding window of the CPU utilization figure, seconds.
UTILIZATION_WINDOW_SECONDS = 30.0

#: Ratio between consecutive duration bucket bounds. Prometheus' ``histogram_quantile`` interpolates
#: linearly inside the bucket that holds the rank; the estimate and the true quantile both lie in
#: ``[l, r*l]`` so the relative error is at most ``r - 1`` (true value at ``l``, estimate at ``r*l``).
#: With r = 1.09 the error bound is 9 % < 10 % (the autoscaler's requirement) across the covered range.
DURATION_BUCKET_RATIO = 1.09


class _Families:
    """A collector of metric families already collected (:func:`merge_expositions`)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_expositions(texts: Iterable[bytes]) -> bytes:
    """One Prometheus text exposition of several (UTF-8 bytes each, as ``generate_latest`` writes them):
    a family that several carry (each model process's ``kubeinfer_request_duration_seconds``, say) is
    written once with the samples of all, in the order of ``texts``. The series must differ (each model
    process labels its own with ``model``): a series twice would be refused by Prometheus's scrape.

    Raises:
        ValueError: a text is not an exposition.
    """
    families: dict[str, Metric] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            have = families.get(family.name)
            if have is None:
                families[family.name] = family
            else:
                have.samples.extend(family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    merged: bytes = generate_latest(registry)
    return merged


def geometric_buckets(low: float, high: float, ratio: float) -> tuple[float, ...]:
    """Bucket upper bounds ``low * ratio**k`` for k = 0.. until one reaches ``high`` (seconds).

    Values are rounded to 6 significant digits (stable label values). Raises ``ValueError`` if
    ``low <= 0``, ``high <= low`` or ``ratio <= 1``.
    """
    if low <= 0 or high <= low or ratio <= 1:
        raise ValueError(f"need 0 < low < high and ratio > 1, got {low}, {high}, {ratio}")
    n = math.ceil(math.log(high / low) / math.log(ratio))
    return tuple(float(f"{low * ratio**k:.6g}") for k in range(n + 1))


#: Request/queue/compute duration buckets: 0.1 ms, 0.2 ms, 0.5 ms, then geometric 1 ms .. >= 10 s.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.0002,
    0.0005,
    *geometric_buckets(0.001, 10.0, DURATION_BUCKET_RATIO),
)
#: Batch-size buckets, rows.
BATCH_SIZE_BUCKETS: tuple[float, ...] = (
    1,
    2,
    3,
    4,
    6,
    8,
    12,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    192,
    256,
    512,
    1024,
    4096,
)


class BusyTracker:
    """Fraction of wall time ``executors`` threads were busy over a sliding window (CPU utilization).

    Thread-safe: ``begin``/``end`` are called from the event loop, ``ratio`` from the scrape thread.
    Times are ``time.monotonic()`` seconds unless a clock is injected.
    """

    def __init__(
        self,
        executors: int,
        window: float = UTILIZATION_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._executors = max(1, executors)
        self._window = window
        self._clock = clock
        self._start = clock()
        self._done: deque[tuple[float, float]] = deque()
        self._running: dict[int, float] = {}
        self._next = 0
        self._lock = threading.Lock()

    def begin(self) -> int:
        """Mark one executor busy from now; returns a token for ``end``."""
        with self._lock:
            token = self._next
            self._next += 1
            self._running[token] = self._clock()
            return token

    def end(self, token: int) -> None:
        """Mark the busy interval of ``token`` finished."""
        with self._lock:
            started = self._running.pop(token, None)
            if started is not None:
                now = self._clock()
                self._done.append((started, now))
                while self._done and self._done[0][1] <= now - self._window:  # bounded without scrapes
                    self._done.popleft()

    def ratio(self) -> float:
        """Busy seconds in the window / (window seconds x executors), 0..1. The window is shorter
        while the process is younger than it."""
        with self._lock:
            now = self._clock()
            lo = now - self._window
            while self._done and self._done[0][1] <= lo:
                self._done.popleft()
            busy = sum(min(e, now) - max(s, lo) for s, e in self._done if e > lo)
            busy += sum(now - max(s, lo) for s in self._running.values())
            span = min(self._window, now - self._start)
        if span <= 0:
            return 0.0
        return max(0.0, min(1.0, busy / (span * self._executors)))

    def concurrency(self) -> float:
        """Mean executors busy while at least one is, over the window: busy executor-seconds / seconds
        with any executor busy, 1.0 .. executors. 1.0 when none was busy in the window (one executor's
        worth, the reading of a single instance).

        With several instances it says how many batches really ran at once: the throughput of a replica
        is this times b / s(b), where s(b) is measured on batches that overlapped (on a shared GPU they
        take longer each, on separate CPU cores they do not)."""
        with self._lock:
            now = self._clock()
            lo = now - self._window
            while self._done and self._done[0][1] <= lo:
                self._done.popleft()
            spans = [(max(s, lo), min(e, now)) for s, e in self._done if e > lo]
            spans += [(max(s, lo), now) for s in self._running.values()]
        busy = sum(e - s for s, e in spans)
        covered, reach = 0.0, -math.inf
        for s, e in sorted(spans):  # the union of the busy intervals
            if e > reach:
                covered += e - max(s, reach)
                reach = e
        if covered <= 0:
            return 1.0
        return max(1.0, min(float(self._executors), busy / covered))


class RuntimeMetrics:
    """The runtime's metrics in their own ``CollectorRegistry`` (one per server; tests make many)."""

    def __init__(self, model: str, executors: int = 1, registry: CollectorRegistry | None = None) -> None:
        self.model = model
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        labels = ["model"]
        self.request_duration = Histogram(
            "kubeinfer_request_duration_seconds",
            "Infer request receipt to response, seconds, all status codes.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=r,
        ).labels(model)
        self.queue_duration = Histogram(
            "kubeinfer_queue_duration_seconds",
            "Per request: enqueue to the start of its batch on an executor, seconds.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=r,
        ).labels(model)
        self.compute_duration = Histogram(
            "kubeinfer_compute_duration_seconds",
            "Per batch: preprocess + execute wall time, seconds.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=r,
        ).labels(model)
        self.batch_size = Histogram(
            "kubeinfer_batch_size", "Rows per executed batch.", labels, buckets=BATCH_SIZE_BUCKETS, registry=r
        ).labels(model)
        self._requests = Counter(
            "kubeinfer_requests", "Infer responses by HTTP status code.", ["model", "code"], registry=r
        )
        # the 200 series exists from the start, at 0: a replica that has answered nothing yet shows a
        # measured request rate of 0 (idle, so scale to zero can take it), not an absent one (unknown)
        self._requests_by_code: dict[int, Any] = {200: self._requests.labels(model, "200")}
        self.queue_size = Gauge(
            "kubeinfer_queue_size", "Requests waiting in the queue.", labels, registry=r
        ).labels(model)
        self.inflight = Gauge(
            "kubeinfer_inflight_requests", "Infer requests received and not yet answered.", labels, registry=r
        ).labels(model)
        self.max_queue_delay = Gauge(
            "kubeinfer_max_queue_delay_seconds", "Max queue delay in force, seconds.", labels, registry=r
        ).labels(model)
        self.max_batch_size = Gauge(
            "kubeinfer_max_batch_size", "Max batch size in force, rows.", labels, registry=r
        ).labels(model)
        self.max_queue_size = Gauge(
            "kubeinfer_max_queue_size",
            "Queued requests beyond which an arrival gets 429 (batching.max_queue_size in force).",
            labels,
            registry=r,
        ).labels(model)
        self.device_utilization = Gauge(
            "kubeinfer_device_utilization_ratio",
            "GPU: NVML utilization; CPU: fraction of wall time the executors were busy (sliding window).",
            labels,
            registry=r,
        ).labels(model)
        self._accelerator_memory = Gauge(
            "kubeinfer_accelerator_memory_bytes",
            "Device memory reserved by torch, bytes.",
            labels,
            registry=r,
        )
        self.model_load_seconds = Gauge(
            "kubeinfer_model_load_seconds", "Seconds spent loading the model.", labels, registry=r
        ).labels(model)
        self.warmup_seconds = Gauge(
            "kubeinfer_warmup_seconds", "Seconds spent in warmup.", labels, registry=r
        ).labels(model)
        self._fetch_seconds = Gauge(
            "kubeinfer_model_fetch_seconds",
            "Seconds the fetch init container took to download the model.",
            labels,
            registry=r,
        )
        self._fetch_bytes = Gauge(
            "kubeinfer_model_fetch_bytes", "Bytes the fetch init container downloaded.", labels, registry=r
        )
        self.cosine_mean = Gauge(
            "kubeinfer_quantization_cosine_mean_ratio",
            "Mean cosine of quantized to unquantized outputs on the held-out set.",
            labels,
            registry=r,
        )
        self.retrieval_agreement = Gauge(
            "kubeinfer_quantization_retrieval_agreement_ratio",
            "Nearest-neighbour agreement of quantized with unquantized outputs on the held-out set.",
            labels,
            registry=r,
        )
        self.label_agreement = Gauge(
            "kubeinfer_quantization_label_agreement_ratio",
            "Classifiers: label agreement, rerankers: top-1 agreement of quantized with unquantized outputs "
            "on the held-out set.",
            labels,
            registry=r,
        )
        self.score_deviation_mean = Gauge(
            "kubeinfer_quantization_score_deviation_mean",
            "Mean absolute difference of quantized to unquantized scores on the held-out set (score units).",
            labels,
            registry=r,
        )
        self.score_deviation_max = Gauge(
            "kubeinfer_quantization_score_deviation_max",
            "Largest absolute difference of quantized to unquantized scores on the held-out set "
            "(score units).",
            labels,
            registry=r,
        )
        self.compared_texts = Gauge(
            "kubeinfer_quantization_compared_texts",
            "Texts (or text pairs) the quantization figures were measured on against fp32 at load, by which "
            "(measured_on: gate texts, held-out sentences, held-out pairs); absent when not measured.",
            [*labels, "measured_on"],
            registry=r,
        )
        self.config_reload_errors = Counter(
            "kubeinfer_config_reload_errors",
            "Config-file changes rejected (old settings kept).",
            labels,
            registry=r,
        ).labels(model)
        self.shed_requests = Counter(
            "kubeinfer_shed_requests",
            "Requests answered 429 because the queue was full, by priority level and reason "
            "(refused at arrival, displaced by a higher priority).",
            ["model", "priority", "reason"],
            registry=r,
        )
        self.cache_hits = Counter(
            "kubeinfer_cache_hits", "Requests answered from the response cache.", labels, registry=r
        ).labels(model)
        self.cache_misses = Counter(
            "kubeinfer_cache_misses", "Response-cache look-ups that found nothing.", labels, registry=r
        ).labels(model)
        self.cache_evictions = Counter(
            "kubeinfer_cache_evictions", "Responses evicted from the cache to make room.", labels, registry=r
        ).labels(model)
        self.cache_bytes = Gauge(
            "kubeinfer_cache_bytes", "Bytes held by the response cache.", labels, registry=r
        ).labels(model)
        self.cache_entries = Gauge(
            "kubeinfer_cache_entries", "Responses held by the response cache.", labels, registry=r
        ).labels(model)
        self.truncated_rows = Counter(
            "kubeinfer_truncated_rows",
            "Text rows longer than the model's window cut to it (model.overflow truncate).",
            labels,
            registry=r,
        ).labels(model)
        self.chunked_rows = Counter(
            "kubeinfer_chunked_rows",
            "Text rows longer than the model's window split into windows whose embeddings are pooled "
            "or whose entities are merged (model.overflow chunk).",
            labels,
            registry=r,
        ).labels(model)
        self.frontend_restarts = Counter(
            "kubeinfer_frontend_restarts",
            "HTTP front-end processes started again after they exited (server.httpWorkers > 1).",
            ["model", "frontend"],
            registry=r,
        )
        cold_start = Histogram(
            "kubeinfer_cold_start_stage_seconds",
            "Each stage of this process's start (fetched, loaded, warmed, first_answer), seconds since the "
            "process started; graph_cache: hit, miss or none.",
            ["model", "stage", "graph_cache"],
            buckets=COLD_START_BUCKETS,
            registry=r,
        )
        #: The stages of this process's start (``kubeinfer.runtime.startup``), observed into the histogram.
        self.cold_start = ColdStart(
            lambda stage, cache, seconds: cold_start.labels(model, stage, cache).observe(seconds)
        )
        #: Triton's statistics extension, fed by the same calls (``kubeinfer.runtime.statistics``).
        self.statistics = ModelStatistics()
        self.busy = BusyTracker(executors)
        self.device_utilization.set_function(self.busy.ratio)
        Gauge(
            "kubeinfer_instance_concurrency",
            "Mean model instances running a batch while at least one is (sliding window), 1 to instances.",
            labels,
            registry=r,
        ).labels(model).set_function(self.busy.concurrency)
        self.service_time = ServiceTimeFit()
        for part, words, read in (
            ("intercept", "a, seconds", self.service_time.intercept),
            ("slope", "c, seconds per row", self.service_time.slope),
        ):
            Gauge(
                f"kubeinfer_service_time_{part}_seconds",
                f"Batch service time s(b) = a + c*b fitted from the batches run: {words} (NaN until fitted).",
                labels,
                registry=r,
            ).labels(model).set_function(read)

    def count_request(self, code: int, seconds: float) -> None:
        """Record one answered infer request: its status code and receipt-to-response seconds (the first
        200 of the process is the cold start's ``first_answer``)."""
        child = self._requests_by_code.get(code)
        if child is None:  # a code's child once: ``labels`` costs a lock and a tuple per call
            child = self._requests_by_code[code] = self._requests.labels(self.model, str(code))
        child.inc()
        self.request_duration.observe(seconds)
        self.statistics.request(code, seconds, time.time_ns() // 1_000_000)
        if code == 200 and self.cold_start.awaiting_first_answer:
            self.cold_start.first_answer()

    def observe_queue(self, seconds: float) -> None:
        """Record one request's queue time: enqueue to its batch's start on an executor, seconds."""
        self.queue_duration.observe(seconds)
        self.statistics.queued(seconds)

    def observe_batch(
        self, rows: int, requests: int, input_s: float, infer_s: float, output_s: float
    ) -> None:
        """Record a batch run successfully: ``rows`` rows of ``requests`` requests, its preprocess,
        execute and output-splitting seconds (compute = preprocess + execute; the service-time fit)."""
        compute = input_s + infer_s
        self.compute_duration.observe(compute)
        self.batch_size.observe(rows)
        self.service_time.observe(rows, compute)
        self.statistics.batch(rows, requests, input_s, infer_s, output_s)

    def observe_cache(self, hit: bool, seconds: float, evicted: int, held_bytes: int, entries: int) -> None:
        """Record a response-cache look-up (a hit, or a miss and its insertion), its seconds, the
        entries it evicted and what the cache holds now."""
        (self.cache_hits if hit else self.cache_misses).inc()
        if evicted:
            self.cache_evictions.inc(evicted)
        self.cache_bytes.set(held_bytes)
        self.cache_entries.set(entries)
        self.statistics.cache(hit, seconds)

    def use_device(self, device: str) -> None:
        """Switch utilization/memory to NVML and torch for a CUDA ``device`` (e.g. ``cuda:0``).

        On failure to initialise NVML the CPU busy-time figure stays (logged by the caller)."""
        if not device.startswith("cuda"):
            return
        import pynvml
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)

        def util() -> float:
            return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0

        self.device_utilization.set_function(util)
        self._accelerator_memory.labels(self.model).set_function(
            lambda: float(torch.cuda.memory_reserved(index))
        )

    def set_report(self, report: Mapping[str, float], measured_on: str | None = None) -> None:
        """Export a model's ``report()`` figures (keys as in ``kubeinfer.runtime.models.base``);
        ``measured_on``: the texts its quantization figures were measured on (``ServableModel.measured_on``),
        the label of ``kubeinfer_quantization_compared_texts``."""
        if "model_load_seconds" in report:
            self.model_load_seconds.set(report["model_load_seconds"])
        if "warmup_seconds" in report:
            self.warmup_seconds.set(report["warmup_seconds"])
        if "quantization_cosine_mean_ratio" in report:
            self.cosine_mean.labels(self.model).set(report["quantization_cosine_mean_ratio"])
        if "quantization_retrieval_agreement_ratio" in report:
            self.retrieval_agreement.labels(self.model).set(report["quantization_retrieval_agreement_ratio"])
        for key, gauge in (
            ("quantization_label_agreement_ratio", self.label_agreement),
            ("quantization_score_deviation_mean", self.score_deviation_mean),
            ("quantization_score_deviation_max", self.score_deviation_max),
        ):
            if key in report:
                gauge.labels(self.model).set(report[key])
        if measured_on is not None and "quantization_compared_texts" in report:
            self.compared_texts.labels(self.model, measured_on).set(report["quantization_compared_texts"])

    def set_fetch(self, seconds: float, nbytes: int) -> None:
        """Export the fetch step's figures (``kubeinfer.runtime.fetch.FetchReport``): seconds taken,
        bytes downloaded. Until called, neither gauge has a series."""
        self._fetch_seconds.labels(self.model).set(seconds)
        self._fetch_bytes.labels(self.model).set(nbytes)

    def exposition(self) -> bytes:
        """The text exposition format of every metric (the body of ``GET /metrics``)."""
        return generate_latest(self.registry)
