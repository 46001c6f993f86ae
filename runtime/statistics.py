"""Per-model statistics with the meaning of Triton's statistics extension.

What ``GET /v2/models[/{name}[/versions/{v}]]/stats`` and gRPC ``ModelStatistics`` answer, as Triton's
``docs/protocol/extension_statistics.md`` defines it, so that ``perf_analyzer``, ``model-analyzer`` and
``tritonclient``'s ``get_inference_statistics`` read them right:

- ``inference_count``: rows (inferences) of the batches run successfully; ``execution_count``: those
  batches (model executions). ``last_inference``: milliseconds since the epoch of the last answered
  request.
- ``inference_stats`` (count and total nanoseconds): ``success`` / ``fail``, each answered request by
  its outcome, receipt to answer; ``queue``, each request from enqueue to its batch's start on an
  executor, less its batch's preprocessing when that ran ahead while it waited (counted once, as
  compute input); ``compute_input`` (``preprocess``: tokenizing, stacking, the copy to the device),
  ``compute_infer`` (``execute``) and ``compute_output`` (splitting the batch's outputs back to its
  requests), each counted once per request with its batch's duration.
- ``batch_stats``: per batch size (rows), the same three durations counted once per execution.
- ``cache_hit`` / ``cache_miss``: the response cache's look-ups (``kubeinfer.runtime.cache``); a hit
  is a success that counts no inference and no execution.

The counters are fed by ``kubeinfer.runtime.metrics.RuntimeMetrics`` in the same calls that feed the
Prometheus metrics (``count_request``, ``observe_queue``, ``observe_batch``), so ``/stats`` and
``/metrics`` always agree. Pure: no clock of its own (callers pass durations and the time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    """A count and a total duration (Triton's ``StatisticDuration``)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, times: int = 1) -> None:
        """Count ``times`` occurrences of ``seconds`` each."""
        self.count += times
        self.ns += times * max(0, round(seconds * 1e9))

    def doc(self) -> dict[str, int]:
        """``{"count": n, "ns": total}``."""
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    """One batch size's executions: preprocess, execute and output durations."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


#: The ``inference_stats`` entries, in Triton's order.
INFERENCE_STATS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


class ModelStatistics:
    """The statistics of one model version since the process started (see the module docstring)."""

    def __init__(self) -> None:
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.inference: dict[str, Duration] = {name: Duration() for name in INFERENCE_STATS}
        self.batches: dict[int, BatchStats] = {}

    def request(self, status: int, seconds: float, now_ms: int) -> None:
        """An answered request: ``status`` 200 counts as a success, any other as a failure;
        ``seconds`` from its receipt; ``now_ms`` the wall clock in milliseconds since the epoch."""
        self.inference["success" if status == 200 else "fail"].add(seconds)
        self.last_inference_ms = now_ms

    def queued(self, seconds: float) -> None:
        """One request's wait from enqueue to its batch's start on an executor."""
        self.inference["queue"].add(seconds)

    def batch(self, rows: int, requests: int, input_s: float, infer_s: float, output_s: float) -> None:
        """A batch of ``rows`` rows from ``requests`` requests ran successfully, with these preprocess,
        execute and output seconds."""
        self.inference_count += rows
        self.execution_count += 1
        stats = self.batches.setdefault(rows, BatchStats())
        for name, seconds in (
            ("compute_input", input_s),
            ("compute_infer", infer_s),
            ("compute_output", output_s),
        ):
            self.inference[name].add(seconds, requests)
            getattr(stats, name).add(seconds)

    def cache(self, hit: bool, seconds: float) -> None:
        """A response-cache look-up: a hit (look-up and copy out) or a miss (look-up and, once the model
        answered, insertion), with its seconds."""
        self.inference["cache_hit" if hit else "cache_miss"].add(seconds)

    def doc(self, name: str, version: str) -> dict[str, Any]:
        """The ``$model_stat`` JSON object of the statistics extension for model ``name`` ``version``."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {key: d.doc() for key, d in self.inference.items()},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.doc(),
                    "compute_infer": b.compute_infer.doc(),
                    "compute_output": b.compute_output.doc(),
                }
                for size, b in sorted(self.batches.items())
            ],
        }
