"""The model interface the batching server codes against: ``ServableModel``.

Life cycle, as the server drives it:

1. ``load_model(cfg)`` (``kubeinfer.runtime.models``) builds a model once per process: weights
   loaded, quantized, compared with the unquantized model (see ``report()``).
2. ``warmup(max_batch_size, steps)`` runs every batch-size bucket (1, 2, 4, ..., max) times the
   model's sequence-length buckets; returns the seconds it took. The server splits it
   (``warmup_passes``, ``first_request_passes``): the passes of one row before readiness (what a first
   request needs), the others after, in the background, while no request is in flight.
3. Per request, on the event loop: ``validate(inputs)`` checks names, datatypes, shapes and limits
   and returns the request's row count, or raises ``InputError`` (``kubeinfer.runtime.errors``: HTTP 400
   or 413).
4. Per batch, on executor threads: ``preprocess(batch)`` (tokenization, padding to the longest
   row *in this batch*), then ``execute(prepared)`` which returns every output with the rows of the
   batch's requests concatenated in order; the server splits them back by the row counts.
   ``preprocess`` of the next batch may run on another thread while ``execute`` runs; both are
   thread-safe. ``execute`` enters ``torch.inference_mode()`` itself (the mode is thread-local).

Tensors are numpy arrays. BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``.
BF16 tensors are ``ml_dtypes.bfloat16`` arrays (numpy has no native bfloat16); a float32 array is
also accepted for a BF16 input and converted by the model.
"""

from __future__ import annotations

import functools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.runtime.config import LimitsConfig, TensorConfig
from kubeinfer.runtime.dtypes import DATATYPES, NUMPY_TO_DATATYPE
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.startup import GRAPH_CACHE_NONE

# Keys of ``ServableModel.report()``; the server exports them as Prometheus gauges.
#: Mean cosine similarity (ratio, -1..1) of the served model's embeddings to the unquantized ones.
REPORT_COSINE_MEAN = "quantization_cosine_mean_ratio"
#: Fraction (0..1) of held-out queries whose nearest neighbour agrees with the unquantized model's.
REPORT_RETRIEVAL_AGREEMENT = "quantization_retrieval_agreement_ratio"
#: Like REPORT_RETRIEVAL_AGREEMENT with every held-out sentence as a query (near-ties included).
REPORT_RETRIEVAL_AGREEMENT_ALL = "quantization_retrieval_agreement_all_ratio"
#: Classifiers: fraction (0..1) of held-out texts whose label (argmax) agrees with the unquantized
#: model's; rerankers: fraction of held-out queries whose top-ranked candidate agrees.
REPORT_LABEL_AGREEMENT = "quantization_label_agreement_ratio"
#: Classifiers and rerankers: mean absolute difference of the served scores to the unquantized ones
#: (every label's probability; every pair's score), in the scores' own units.
REPORT_SCORE_DEVIATION_MEAN = "quantization_score_deviation_mean"
#: Like REPORT_SCORE_DEVIATION_MEAN, the largest absolute difference.
REPORT_SCORE_DEVIATION_MAX = "quantization_score_deviation_max"
#: How many texts (or text pairs) the deviation figures above were measured on; absent when they were
#: not measured (quantization none on engine torch: 1 and 0 by definition). Which texts:
#: ``ServableModel.measured_on``.
REPORT_COMPARED_TEXTS = "quantization_compared_texts"
#: Seconds spent in ``load_model`` (weights, quantization, comparison).
REPORT_LOAD_SECONDS = "model_load_seconds"
#: Seconds spent in the comparison with the unquantized model (part of the load time).
REPORT_COMPARE_SECONDS = "quantization_compare_seconds"
#: Seconds the last ``warmup`` took.
REPORT_WARMUP_SECONDS = "warmup_seconds"


#: The per-row token counts (INT64 [rows], special tokens included) that a text model's ``execute``
#: returns beside its declared outputs: what a request cost in tokens (the ``usage`` of the
#: OpenAI-compatible routes). Not in the model's metadata; the data plane passes it on only to a call
#: that asks for it (``dataplane.InferCall.usage``).
TOKEN_COUNTS = "token_count"


#: The one input of a part of a request run as windows (``ServableModel.window_parts``): object [windows],
#: each element one window's token ids (int64 [its tokens], special tokens included). Only the batcher
#: queues it (a client's tensor of that name is refused by ``validate`` as any undeclared name).
WINDOWS_INPUT = "__windows__"


@dataclass(frozen=True)
class WindowParts:
    """A request whose rows run as windows, queued part by part (``ServableModel.window_parts``).

    Attributes:
        parts: each part's inputs for ``preprocess`` (``{WINDOWS_INPUT: ...}``), in order.
        rows: each part's rows: its windows (what ``execute`` answers a row of output for).
        tokens: each part's longest window, tokens (the batcher's token budget counts it padded).
        merge: the request's outputs (its rows, as ``execute`` answers a whole request) from every
            part's outputs in order; raises what the model raises.
    """

    parts: Sequence[Mapping[str, np.ndarray]]
    rows: Sequence[int]
    tokens: Sequence[int]
    merge: Callable[[Sequence[Mapping[str, np.ndarray]]], dict[str, np.ndarray]]


def pack_windows(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[range]:
    """Consecutive windows grouped into parts (pure): each part as many windows as fit, in order, while
    its rows times its longest window stay within ``max_tokens`` (padded, as a batch costs) and its
    rows within ``max_rows``; a window alone over ``max_tokens`` is a part of its own.

    Args:
        lengths: each window's tokens, in order. max_tokens: a part's padded cost bound, tokens.
        max_rows: a part's windows bound (>= 1).

    Returns the parts as ranges of window positions, covering ``0..len(lengths)`` in order.
    """
    parts: list[range] = []
    start = 0
    longest = 0
    for i, length in enumerate(lengths):
        wider = max(longest, length)
        count = i - start + 1
        if i > start and (count > max_rows or count * wider > max_tokens):
            parts.append(range(start, i))
            start, wider = i, length
        longest = wider
    if lengths:
        parts.append(range(start, len(lengths)))
    return parts


def tensor_nbytes(array: np.ndarray) -> int:
    """Payload size of a tensor in bytes; for BYTES tensors the sum of the element lengths."""
    if array.dtype == object:
        return sum(len(x) if isinstance(x, (bytes, bytearray, str)) else 0 for x in array.reshape(-1))
    return int(array.nbytes)


def shape_matches(declared: Sequence[int], actual: Sequence[int]) -> bool:
    """True if ``actual`` has the declared rank and matches every dimension that is not -1."""
    return len(declared) == len(actual) and all(
        d == -1 or d == a for d, a in zip(declared, actual, strict=True)
    )


def batch_buckets(max_batch_size: int) -> list[int]:
    """Warmup batch sizes: 1, 2, 4, ... below ``max_batch_size``, then ``max_batch_size`` itself.

    Raises:
        ValueError: ``max_batch_size`` < 1.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    buckets = []
    size = 1
    while size < max_batch_size:
        buckets.append(size)
        size *= 2
    buckets.append(max_batch_size)
    return buckets


class QuantizationError(ValueError):
    """The requested quantization cannot be applied (mode, device or calibration); says why. Raised by
    any format's loader (here, not in ``quantize``, so that a loader that quantizes nothing imports no
    torch)."""


@dataclass(frozen=True)
class WarmupPass:
    """One batch of a model's warmup: ``rows`` rows of ``size`` (a text model's sequence length in tokens,
    a tensor model's variable dimensions; ``None``: it has none), and ``run``, which runs it once (raising
    what the model raises, or a ``ValueError`` that names the setting to change)."""

    rows: int
    size: int | None
    run: Callable[[], object]


def first_request_passes(passes: Sequence[WarmupPass]) -> tuple[list[WarmupPass], list[WarmupPass]]:
    """Split a warmup into what a first request needs and the rest: the passes of one row (every size:
    a first request may be of any length, and every size of ``warmup.dims`` is checked before
    readiness), then the others, cheapest (rows x size) first. Returns ``(first, rest)``."""
    first = [p for p in passes if p.rows == 1]
    rest = sorted((p for p in passes if p.rows != 1), key=lambda p: (p.rows * (p.size or 1), p.rows))
    return first, rest


def run_warmup(
    passes: Sequence[WarmupPass], steps: int, before_each: Callable[[], None] | None = None
) -> float:
    """Run each pass ``steps`` times, in order, calling ``before_each()`` before each pass (the
    background warmup waits there for the model to be idle; it may raise to stop). Returns the seconds
    it took (the waits included)."""
    started = time.perf_counter()
    for warm in passes:
        if before_each is not None:
            before_each()
        for _ in range(steps):
            warm.run()
    return time.perf_counter() - started


class ServableModel(ABC):
    """A loaded model the runtime serves.

    Attributes (set by the loader):
        name: model name in the protocol's URLs, e.g. ``minilm``.
        inputs / outputs: declared tensors; the first dimension of every shape is the batch (-1).
        device: torch device string, ``"cpu"`` or ``"cuda:0"``.
        max_batch_size: the largest batch (rows) ``warmup`` covered; 0 before warmup.
        limits: per-request input limits (413 beyond them).
    """

    name: str
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    #: The v2 model metadata's ``platform`` (Triton's names: ``pytorch``, ``onnxruntime_onnx``).
    platform: str = "pytorch"
    device: str
    max_batch_size: int
    limits: LimitsConfig
    #: Inputs a request may leave out that hold one value for the whole request (declared shape [1],
    #: not batched: e.g. a token classifier's ``aggregation_strategy``); ``_validate_tensor`` judges
    #: the value. Being inputs, they are part of the response cache's key.
    request_inputs: frozenset[str] = frozenset()
    #: The texts the deviation from fp32 in ``report()`` was measured on (``quantize.MEASURED_ON``: gate
    #: texts, held-out sentences or held-out pairs); None when it was not measured.
    measured_on: str | None = None
    #: Rows ``validate`` let through to be cut to the model's window (a text model's ``overflow:
    #: truncate``), counted since load; the batcher reports them (kubeinfer_truncated_rows_total).
    truncated_rows: int = 0
    #: Rows ``validate`` let through to be split into windows (``overflow: chunk``: an embedder, a tagger),
    #: counted since load (kubeinfer_chunked_rows_total).
    chunked_rows: int = 0
    #: Whether the engine's compiled graphs came from the graph cache at load: ``hit``, ``miss`` or
    #: ``none`` (``kubeinfer.runtime.startup``: the cold-start metric's ``graph_cache`` label).
    graph_cache: str = GRAPH_CACHE_NONE

    @functools.cached_property
    def column_inputs(self) -> frozenset[str]:
        """The inputs declared with the batch dimension only (shape [-1], e.g. a text model's text;
        not a ``request_inputs``), which the model metadata lists as [-1, 1], one element per row (as
        Triton lists a tensor of ``dims: [1]``): clients that build their tensors from the metadata
        (perf_analyzer) send [rows, 1], others [rows]; ``with_config_shapes`` takes both."""
        return frozenset(
            s.name for s in self.inputs if list(s.shape) == [-1] and s.name not in self.request_inputs
        )

    def with_config_shapes(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """``inputs`` with every ``column_inputs`` tensor sent as [rows, 1] taken as [rows] (the
        shape the model metadata lists; the runtime accepts it as Triton does). Any other tensor is
        left as it came, for ``validate`` to judge."""
        batch_only = self.column_inputs
        if not batch_only:
            return inputs

        def column(name: str, array: np.ndarray) -> bool:
            return name in batch_only and array.ndim == 2 and array.shape[1] == 1

        if not any(column(name, array) for name, array in inputs.items()):
            return inputs
        return {
            name: array.reshape(array.shape[0]) if column(name, array) else array
            for name, array in inputs.items()
        }

    def narrow_overflow(self, requested: Any) -> str | None:
        """The overflow policy of a request whose ``overflow`` parameter is ``requested`` (None: not
        sent): None when it is the service's own. A model without an overflow policy (the default: no
        text to overflow) accepts no such parameter.

        Raises:
            InputError: 400 naming the parameter, when ``requested`` is not None.
        """
        if requested is None:
            return None
        raise InputError(
            f"parameter 'overflow' applies to text models (huggingface); model '{self.name}' has no "
            "overflow policy"
        )

    def validate(self, inputs: Mapping[str, np.ndarray], overflow: str | None = None) -> int:
        """Check a request's decoded inputs; return its row count (size of the batch dimension).

        Checks, in order: exactly the declared input names (``request_inputs`` may be left out); each
        tensor's datatype and shape (-1 matches any size); the same row count >= 1 on every input but
        the ``request_inputs``; element and byte limits (413);
        then ``_validate_tensor`` for model-specific checks (UTF-8 text, token counts), with
        ``overflow``: the request's policy where it narrows the service's (``narrow_overflow``).

        Raises:
            InputError: naming the tensor and what was expected.
        """
        self._check_names(inputs)
        rows: int | None = None
        total_elements = 0
        total_bytes = 0
        for spec in self.inputs:
            if spec.name not in inputs:  # a request input left out
                continue
            array = inputs[spec.name]
            if array.dtype.name not in DATATYPES[spec.datatype].accepted:
                got = NUMPY_TO_DATATYPE.get(array.dtype.name, array.dtype.name)
                raise InputError(
                    f"input tensor '{spec.name}': expected datatype {spec.datatype}, got {got}",
                    tensor=spec.name,
                )
            if not shape_matches(spec.shape, array.shape):
                raise InputError(
                    f"input tensor '{spec.name}': expected shape {spec.shape} (-1 = any), "
                    f"got {list(array.shape)}",
                    tensor=spec.name,
                )
            if spec.name in self.request_inputs:  # one value for the request, not a row per row
                self._validate_tensor(spec, array, overflow)
                continue
            n = int(array.shape[0])
            if n < 1:
                raise InputError(
                    f"input tensor '{spec.name}': batch dimension is 0; send at least one row",
                    tensor=spec.name,
                )
            if rows is not None and n != rows:
                raise InputError(
                    f"input tensor '{spec.name}' has {n} rows but another input has {rows}; "
                    "all inputs must have the same batch dimension",
                    tensor=spec.name,
                )
            rows = n
            total_elements += int(math.prod(array.shape))
            total_bytes += tensor_nbytes(array)
            for total, limit, what in (
                (total_elements, self.limits.max_request_elements, "has {} elements"),
                (total_bytes, self.limits.max_request_bytes, "carries {} bytes"),
            ):
                if total > limit:
                    raise InputError(
                        f"input tensor '{spec.name}': request {what.format(total)}, "
                        f"over the limit of {limit}",
                        tensor=spec.name,
                        status=413,
                    )
            self._validate_tensor(spec, array, overflow)
        assert rows is not None  # the model declares at least one input
        return rows

    def _check_names(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Every declared input is there (``request_inputs`` may be left out), and no other one."""
        declared = {spec.name: spec for spec in self.inputs}
        missing = [n for n in declared if n not in inputs and n not in self.request_inputs]
        if missing:
            expected = ", ".join(f"{s.name} ({s.datatype} {s.shape})" for s in self.inputs)
            raise InputError(
                f"input tensor '{missing[0]}' is missing; model '{self.name}' expects: {expected}",
                tensor=missing[0],
            )
        extra = [n for n in inputs if n not in declared]
        if extra:
            raise InputError(
                f"unexpected input tensor '{extra[0]}'; model '{self.name}' expects only: "
                + ", ".join(f"'{n}'" for n in declared),
                tensor=extra[0],
            )

    def tokens(self, inputs: Mapping[str, np.ndarray]) -> int:
        """At least the tokens of the longest row of a request (its padded length in a batch), for the
        batcher's token budget; 0 for a model without tokens (the default)."""
        return 0

    def window_parts(
        self, inputs: Mapping[str, np.ndarray], max_rows: int, overflow: str | None = None
    ) -> WindowParts | None:
        """A validated request that runs as windows (a text model's ``overflow: chunk`` with a row longer
        than its window, or its first windows where the request narrowed the policy to ``truncate``)
        as parts of at most ``max_rows`` windows each and about one window's padded tokens, for the
        batcher to queue one after another so that other requests' batches run between them; None
        (the default) when the request runs whole."""
        return None

    def parameters(self) -> dict[str, str]:
        """The model's own settings a client may want to know, name -> value as text (the model
        configuration's ``parameters``); none by default."""
        return {}

    def _validate_tensor(  # noqa: B027
        self, spec: TensorConfig, array: np.ndarray, overflow: str | None = None
    ) -> None:
        """Model-specific checks of one input tensor (after datatype/shape), ``overflow`` the request's
        narrowed policy (None: the service's); raise ``InputError``."""

    @abstractmethod
    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> Any:
        """Turn validated requests into one model batch (rows concatenated in request order).

        Text is tokenized and padded to the longest row in THIS batch. Runs on an executor thread.
        """

    @abstractmethod
    def execute(self, prepared: Any) -> dict[str, np.ndarray]:
        """Run the model on a prepared batch; outputs by name, rows in the order of ``preprocess``.

        Raises any exception the model raises; the server isolates the failing request.
        """

    @abstractmethod
    def warmup(self, max_batch_size: int, steps: int) -> float:
        """Run batch sizes 1, 2, 4, ..., ``max_batch_size`` (always included) times the sequence
        length buckets, ``steps`` times each; set ``self.max_batch_size``; return seconds taken."""

    def warmup_passes(self, max_batch_size: int) -> list[WarmupPass]:
        """The batches ``warmup`` runs (every batch-size bucket up to ``max_batch_size`` at each size), one
        ``WarmupPass`` each, for the server to split (``first_request_passes``). A model that does not
        list them raises ``NotImplementedError``: the server then runs ``warmup`` whole before readiness."""
        raise NotImplementedError(f"model '{self.name}' does not list its warmup passes")

    @abstractmethod
    def report(self) -> dict[str, float]:
        """Figures for metrics: the ``REPORT_*`` keys that apply (quantization deviation, seconds)."""

    def batch_key(self, inputs: Mapping[str, np.ndarray]) -> Hashable:
        """Requests may share a batch only if their keys are equal (default: any two may).

        TorchScript models key on the non-batch dimensions of their inputs; text models pad, so
        any requests batch together.
        """
        return None

    def example_inputs(self, rows: int) -> dict[str, np.ndarray]:
        """A valid request of ``rows`` rows (for warmup, smoke tests and benchmarks)."""
        raise NotImplementedError(f"model '{self.name}' has no example inputs")
