"""Hugging Face models on the ONNX Runtime engine (``engine: onnxruntime``): a text embedder, and the
heads of ``hf_tasks`` (a sequence classifier or cross-encoder reranker, a token classifier).

Tokenization, batching by the longest row, warmup over the sequence buckets, the token counts and every
task's post-processing are the torch model's (``huggingface.TextModel`` and its subclasses); only the
forward pass moves to ONNX Runtime. What is exported (``GraphKind``), once, with ``torch.onnx.export``
(TorchScript-based, opset 17, dynamic batch and sequence axes), as one graph with the inputs
``input_ids`` / ``attention_mask`` / ``token_type_ids`` (those the model takes):

- ``EMBEDDING``: the encoder with its mean pooling and L2 normalization -> ``embedding`` float32
  [batch, hidden];
- ``SEQUENCE_LOGITS``: a ``*ForSequenceClassification`` model -> ``logits`` float32 [batch, num_labels];
- ``TOKEN_LOGITS``: a ``*ForTokenClassification`` model -> ``logits`` float32
  [batch, sequence, num_labels].

The graph runs in an ``onnxruntime.InferenceSession`` with the session options of ONNX models
(``models.onnx.session_options``), on the CPU execution provider.

The export is cached: in ``$KUBEINFER_CACHE_DIR``, else a ``.kubeinfer-cache`` folder in the model
directory when it is writable, else the temporary directory (the pod's ``/tmp`` emptyDir), under a name
that hashes the model's ``config.json``, its weight files (names, sizes and contents: a copy of the same
model, fetched again by another pod, finds the graph; hashing MiniLM's 90 MB of weights takes 0.2 s on 2
busy cores), torch's and transformers' versions and the graph kind's export version: a changed model,
library or graph exports again. The operator points ``$KUBEINFER_CACHE_DIR`` at a volume the
InferenceService names (``spec.server.graphCache``), so that every pod of the model after the first
loads the graphs the first one made. The file is written under a temporary name and renamed, so a crash
mid-export leaves nothing half-written behind; a cached graph that does not load all the same (a copy
cut short, a full disk) is removed and made again (``_cached_session``).

At load, the exported graph is checked against the torch model on the held-out sentences: an
embedder's mean cosine (``check_export``), a head's label agreement and largest score deviation
(``check_scores_export``); an fp32 export that does not reproduce the model is refused.

Quantization on this engine: ``none``, or ``int8-dynamic``: ONNX Runtime's dynamic quantization of the
graph's MatMuls (``onnxruntime.quantization.quantize_dynamic``) with int8 weights quantized per output
channel and in 7 bits (``per_channel=True, reduce_range=True``: without VNNI, x86 int8 kernels
saturate on full-range weights). Activations are quantized per batch at run time. Measured on the
bundled MiniLM, 349 held-out sentences (``heldout_pairs.json``), against the fp32 export: mean cosine
0.9923, paraphrase-query retrieval agreement 1.0000 (0.9398 with every sentence as a query); full
range per tensor (the naive recipe) gives 0.9669, 7 bits per tensor 0.8907, per channel full range
0.9933. The quantized graph is cached beside the export. The heads' MatMuls (a classifier's pooler and
classifier layers) are quantized with the encoder's.

``int8-static`` (``INT8_STATIC_RECIPE``): ``onnxruntime.quantization.quantize_static`` in the QOperator
format (QLinearMatMul), weights int8 per output channel in 7 bits, activations uint8 with one
asymmetric scale per tensor from the MinMax of the calibration texts (``quantization.calibration``,
tokenized and batched as ``TextModel.calibration_batches`` does). Two kinds of MatMul stay in float
(``float_kept_matmuls``): those of two activations (attention's scores and context, which have no
weight) and the down-projections (a weight with more rows than columns: a feed-forward block's output
layer, whose input is the activation function's output, with the outliers one static scale per tensor
cannot hold). Measured on the bundled MiniLM against the fp32 export, calibrated on the bundled 150
texts: every MatMul quantized 0.9446 mean cosine (QDQ 0.9395; Percentile and Entropy calibration no
better, 0.942-0.945); attention's left float 0.9440; the down-projections left float too 0.9962.
As served (the runtime's load report, calibration in batches of 64, ``OFFLINE_BATCH``, each padded
to its longest text, against torch fp32): mean cosine
0.9943, paraphrase retrieval agreement 1.0000 (0.9513 with every sentence as a query). A third of the
encoder's weight FLOPs stay in float, so int8-static runs between fp32 and int8-dynamic here; its
use is a static scale a user calibrated on their own data. The quantized graph is cached beside the
export, under a name with a hash of the calibration texts and the truncation length.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from kubeinfer.runtime.models.onnx import PLATFORM, session_options
from kubeinfer.runtime.startup import GRAPH_CACHE_HIT, GRAPH_CACHE_MISS
from torch import nn

log = logging.getLogger(__name__)

#: Part of the embedder's cache key: a change to how its graph is exported exports again.
EXPORT_VERSION = "embed-mean-l2-opset17-v1"
#: The exported graph's inputs, in the encoder's order (those the model takes), and the embedder's output.
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "embedding"
#: A head's output (``SEQUENCE_LOGITS``, ``TOKEN_LOGITS``).
LOGITS = "logits"
#: Mean cosine to the torch model on the held-out sentences below which an fp32 export is refused.
MIN_EXPORT_COSINE = 0.9999
#: A head's fp32 export is refused below this label agreement with the torch model on the held-out
#: sentences (not 1: two labels within float rounding of each other may swap), or above this largest
#: score deviation (probabilities, or a reranker's scores, in their own units; fp32 exports measure
#: about 1e-6).
MIN_EXPORT_LABEL_AGREEMENT = 0.99
MAX_EXPORT_SCORE_DEVIATION = 1e-3
#: The int8-dynamic recipe (see the module docstring), part of the quantized file's name.
INT8_RECIPE = "int8dyn-matmul-perchannel-7bit"
#: The int8-static recipe (see the module docstring), part of the quantized file's name.
INT8_STATIC_RECIPE = "int8static-qop-minmax-perchannel-7bit-floatdown"


class _Embedder(nn.Module):
    """The encoder with the embedder's pooling (``TextEmbeddingModel._embed``), as one graph."""

    def __init__(self, encoder: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.encoder = encoder
        self.names = names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        inputs = dict(zip(self.names, tensors, strict=True))
        hidden = self.encoder(**inputs).last_hidden_state.float()
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)


class _Logits(nn.Module):
    """A transformers head model (``*ForSequenceClassification``, ``*ForTokenClassification``) returning
    its ``logits`` tensor in float32, as one graph."""

    def __init__(self, head: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.head = head
        self.names = names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(**dict(zip(self.names, tensors, strict=True))).logits
        return logits.float()


@dataclass(frozen=True)
class GraphKind:
    """What a model's exported graph computes.

    Attributes:
        version: part of the cache key (a change to the graph exports again).
        output: the graph's one output.
        output_axes: the output's dynamic axes (index -> name).
        wrap: builds the exported module from the loaded model's module and its input names.
    """

    version: str
    output: str
    output_axes: dict[int, str] = field(default_factory=lambda: {0: "batch"})
    wrap: Callable[[nn.Module, tuple[str, ...]], nn.Module] = _Logits


EMBEDDING = GraphKind(EXPORT_VERSION, OUTPUT, wrap=_Embedder)
SEQUENCE_LOGITS = GraphKind("sequence-logits-opset17-v1", LOGITS)
TOKEN_LOGITS = GraphKind("token-logits-opset17-v1", LOGITS, {0: "batch", 1: "sequence"})


def cache_dir(model_dir: Path) -> Path:
    """Where exports are kept (see the module docstring)."""
    configured = os.environ.get("KUBEINFER_CACHE_DIR")
    if configured:
        return Path(configured)
    if os.access(model_dir, os.W_OK):
        return model_dir / ".kubeinfer-cache"
    return Path(tempfile.gettempdir()) / "kubeinfer-cache"


def export_key(model_dir: Path, version: str = EXPORT_VERSION) -> str:
    """A hash of what the graph of kind ``version`` exported from ``model_dir`` depends on (see the
    module docstring): 16 hex digits."""
    import transformers

    digest = hashlib.sha256()
    digest.update((model_dir / "config.json").read_bytes())
    for weights in sorted(list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.bin"))):
        with weights.open("rb") as f:
            content = hashlib.file_digest(f, "sha256").hexdigest()
        digest.update(f"{weights.name}:{weights.stat().st_size}:{content}".encode())
    digest.update(f"{torch.__version__}:{transformers.__version__}:{version}".encode())
    return digest.hexdigest()[:16]


def export_graph(
    module: nn.Module,
    names: tuple[str, ...],
    example: dict[str, torch.Tensor],
    path: Path,
    kind: GraphKind = EMBEDDING,
) -> None:
    """Export ``module`` as the graph ``kind`` says to ``path`` (written under a temporary name, then
    renamed), with dynamic batch and sequence axes on every input.

    Args:
        module: the loaded fp32 model (an encoder for ``EMBEDDING``, else a head model), on the CPU.
        names: its input names, in ``INPUTS`` order.
        example: one tokenized batch, int64 [rows, seq], of every name in ``names``.
        path: the ``.onnx`` file to write.
        kind: what the graph computes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[kind.output] = dict(kind.output_axes)
    with torch.inference_mode():
        torch.onnx.export(
            kind.wrap(module, names).eval(),
            tuple(example[n] for n in names),
            str(partial),
            input_names=list(names),
            output_names=[kind.output],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    os.replace(partial, path)


def partial_path(path: Path) -> Path:
    """A name to write ``path`` under before it is renamed into place: unique to this write, also among
    pods sharing the cache volume (whose processes often have the same pid)."""
    return path.with_suffix(f".{uuid.uuid4().hex}.partial")


def _cpu_session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), sess_options=session_options(), providers=["CPUExecutionProvider"])


def _cached_session(path: Path, make: Callable[[], object]) -> tuple[ort.InferenceSession, bool]:
    """The session of the graph at ``path``, made by ``make`` first unless the cache has it; a cached
    file the engine cannot load (truncated or corrupt: a full disk, a copy cut short) is removed and
    made again, once. Returns the session and whether the graph was made now.

    Raises:
        ValueError: a cached file that does not load and cannot be removed, or a graph that cannot be
            written (a read-only or full cache directory), naming the file.
    """
    if not path.is_file():
        _make(path, make)
        return _cpu_session(path), True
    try:
        return _cpu_session(path), False
    except Exception as exc:
        log.warning("the cached graph %s does not load (%s); making it again", path, exc)
        try:
            path.unlink()
        except OSError as err:
            raise ValueError(
                f"the cached graph {path} does not load ({exc}) and cannot be removed ({err}); delete it, "
                "or set KUBEINFER_CACHE_DIR to a writable directory, so that it is made again"
            ) from exc
    _make(path, make)
    return _cpu_session(path), True


def _make(path: Path, make: Callable[[], object]) -> None:
    """``make()``, the graph at ``path``; an ``OSError`` writing it becomes a ``ValueError`` naming the
    file and ``KUBEINFER_CACHE_DIR``."""
    try:
        make()
    except OSError as exc:
        raise ValueError(
            f"engine onnxruntime cannot write its graph {path} ({exc}); set KUBEINFER_CACHE_DIR to a "
            "writable directory with room for the model's graphs"
        ) from exc


def export_path(model_dir: Path, kind: GraphKind = EMBEDDING) -> Path:
    """Where the fp32 graph of ``kind`` exported from ``model_dir`` is cached (``cache_dir``, named by
    ``export_key``)."""
    return cache_dir(model_dir) / f"{model_dir.name or 'model'}-{export_key(model_dir, kind.version)}.onnx"


def onnx_session(
    model: Any, model_dir: Path, kind: GraphKind = EMBEDDING
) -> tuple[ort.InferenceSession, Path, bool]:
    """The session of ``model``'s exported graph of ``kind`` (``model``: a ``huggingface.TextModel`` on
    the CPU, fp32), exporting it first unless the cache has it. Returns the session, the file and
    whether it was exported now."""
    names = tuple(n for n in INPUTS if n in model._forward_args)
    path = export_path(model_dir, kind)

    def export() -> None:
        texts = ["kubeinfer exports this sentence", "and this one"]
        prepared = model.tokenize(texts, texts[::-1]) if model.pairs else model.tokenize(texts)
        export_graph(model.module, names, dict(prepared.tensors), path, kind)

    session, exported = _cached_session(path, export)
    return session, path, exported


def int8_dynamic_path(path: Path) -> Path:
    """Where the int8-dynamic graph of the fp32 graph at ``path`` is cached."""
    return path.with_name(f"{path.stem}-{INT8_RECIPE}.onnx")


def int8_static_path(path: Path, key: str) -> Path:
    """Where the int8-static graph of the fp32 graph at ``path`` calibrated as ``key`` says
    (``calibration_key``) is cached."""
    return path.with_name(f"{path.stem}-{INT8_STATIC_RECIPE}-{key}.onnx")


def quantize_int8_dynamic(path: Path) -> Path:
    """The int8-dynamic graph of the fp32 graph at ``path`` (``INT8_RECIPE``), made now unless it is
    there already; written under a temporary name and renamed."""
    target = int8_dynamic_path(path)
    if not target.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        partial = partial_path(target)
        quantize_dynamic(
            str(path),
            str(partial),
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
        )
        os.replace(partial, target)
    return target


def float_kept_matmuls(graph: Any) -> list[str]:
    """The names of the MatMul nodes of ``graph`` (an ``onnx.GraphProto``) that int8-static keeps in
    float: those with no constant weight (two activations) and those whose 2-D weight initializer has
    more rows than columns (a down-projection, [in, out] with in > out)."""
    weights = {t.name: list(t.dims) for t in graph.initializer}
    kept = []
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        dims = weights.get(node.input[1])
        if dims is None or (len(dims) == 2 and dims[0] > dims[1]):
            kept.append(node.name)
    return kept


def calibration_key(texts: Sequence[str], max_length: int) -> str:
    """12 hex digits of a hash of the calibration texts and the length they are truncated at, in
    tokens (both change the activations' ranges; part of the int8-static graph's name)."""
    digest = hashlib.sha256(f"{max_length}\n".encode())
    digest.update("\n".join(texts).encode("utf-8"))
    return digest.hexdigest()[:12]


def quantize_int8_static(path: Path, batches: Iterable[dict[str, np.ndarray]], key: str) -> Path:
    """The int8-static graph of the fp32 graph at ``path`` (``INT8_STATIC_RECIPE``), calibrated on
    ``batches`` (feeds of the graph's inputs: int64 [rows, seq] arrays by input name), made now unless
    the file for ``key`` (``calibration_key`` of the texts) is there already; written under a
    temporary name and renamed.

    Raises:
        QuantizationError: no calibration batch.
    """
    target = int8_static_path(path, key)
    if target.is_file():
        return target
    import onnx
    from kubeinfer.runtime.models.base import QuantizationError
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    feeds = list(batches)
    if not feeds:
        raise QuantizationError("quantization int8-static: no calibration batch to calibrate on")

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    kept = float_kept_matmuls(onnx.load(str(path), load_external_data=False).graph)
    partial = partial_path(target)
    quantize_static(  # its calibration copy of the graph goes to a temporary directory of its own
        str(path),
        str(partial),
        _Reader(),
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        reduce_range=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        nodes_to_exclude=kept,
        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        calibration_providers=["CPUExecutionProvider"],
    )
    os.replace(partial, target)
    log.info(
        "int8-static: calibrated on %d batches, %d MatMuls kept in float, %s", len(feeds), len(kept), target
    )
    return target


def served_path(
    model: Any,
    model_dir: Path,
    quantization: str,
    kind: GraphKind = EMBEDDING,
    calibration: Sequence[str] = (),
) -> Path:
    """Where the graph ``use_onnxruntime`` serves for ``quantization`` is cached: the fp32 export
    (``export_path``), or its int8-dynamic or int8-static graph (calibrated on ``calibration``, truncated
    at ``model.truncate_at``)."""
    fp32 = export_path(model_dir, kind)
    if quantization == "int8-dynamic":
        return int8_dynamic_path(fp32)
    if quantization == "int8-static":
        return int8_static_path(fp32, calibration_key(calibration, model.truncate_at))
    return fp32


def use_onnxruntime(
    model: Any,
    model_dir: Path,
    quantization: str = "none",
    kind: GraphKind = EMBEDDING,
    calibration: Sequence[str] = (),
) -> Path:
    """Switch ``model`` (a ``huggingface.TextModel`` on the CPU, fp32) to the ONNX Runtime engine: its
    exported graph of ``kind`` (exported now unless the cache has it), quantized as ``quantization``
    says (``int8-dynamic``; ``int8-static`` calibrated on the texts ``calibration``). Afterwards
    ``model.session`` runs the forward pass (``run_graph``) and ``model.graph_cache`` says whether the
    served graph came from the cache (``hit``) or was made now (``miss``); the caller compares the
    switched model with the torch one. Returns the served graph's file.

    Raises:
        QuantizationError: int8-static without calibration texts.
    """
    t0 = time.perf_counter()
    session, path, made = onnx_session(model, model_dir, kind)
    quantized = False
    if quantization == "int8-dynamic":
        fp32, path = path, int8_dynamic_path(path)
        session, quantized = _cached_session(path, lambda: quantize_int8_dynamic(fp32))
    elif quantization == "int8-static":
        fp32, key = path, calibration_key(calibration, model.truncate_at)
        path = int8_static_path(fp32, key)

        def calibrated() -> Path:
            batches = (
                {k: v.numpy() for k, v in b.tensors.items()} for b in model.calibration_batches(calibration)
            )
            return quantize_int8_static(fp32, batches, key)

        session, quantized = _cached_session(path, calibrated)
    made = made or quantized
    model.session = session
    model.platform = PLATFORM
    model.engine = "onnxruntime"
    model.graph_cache = GRAPH_CACHE_MISS if made else GRAPH_CACHE_HIT
    log.info(
        "engine onnxruntime: %s %s in %.2f s",
        "made" if made else "the cached graph",
        path,
        time.perf_counter() - t0,
    )
    return path


#: Part of the key of a cached comparison: a change to what is compared, or how, compares again.
COMPARISON_VERSION = "heldout-cosine-retrieval-v1"


def cpu_flags(cpuinfo: str | None = None) -> str:
    """The CPU's instruction-set flags (the first ``flags`` line of ``/proc/cpuinfo``, or of the text
    ``cpuinfo``), sorted; ``""`` where there is none. ONNX Runtime picks its int8 kernels by them (AVX2,
    AVX-512 VNNI, AMX), and their results may differ in the last bits."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return " ".join(sorted(value.split()))
    return ""


def comparison_path(graph: Path, texts: Sequence[str], flags: str | None = None) -> Path:
    """Where the comparison of the graph at ``graph`` with the torch fp32 model on ``texts`` is kept:
    beside it, named by a hash of the texts, onnxruntime's version, the CPU's flags (``cpu_flags``, or
    ``flags``) and ``COMPARISON_VERSION``. The graph's own name already hashes the model, torch's and
    transformers' versions and the recipe."""
    digest = hashlib.sha256(f"{COMPARISON_VERSION}\n{ort.__version__}\n".encode())
    digest.update((cpu_flags() if flags is None else flags).encode())
    digest.update(("\n" + "\n".join(texts)).encode("utf-8"))
    return graph.with_name(f"{graph.stem}.compare-{digest.hexdigest()[:12]}.json")


def read_comparison(path: Path, keys: Sequence[str]) -> dict[str, float] | None:
    """The figures kept at ``path`` (``write_comparison``): every name of ``keys``, as floats; ``None``
    when the file is not there, or does not hold them all (one line logged)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: float(data[k]) for k in keys}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning(
            "the cached comparison %s does not read (%s: %s); comparing again", path, type(exc).__name__, exc
        )
        return None


def write_comparison(path: Path, figures: dict[str, float]) -> None:
    """Keep ``figures`` at ``path`` (under a temporary name, then renamed). Best effort: a cache that
    cannot be written costs the next pod the comparison, not this one its start (one line logged)."""
    partial = partial_path(path)
    try:
        partial.write_text(json.dumps(figures, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        log.warning("cannot keep the comparison in %s (%s); the next start compares again", path, exc)
        partial.unlink(missing_ok=True)


def use_cached_onnxruntime(
    model: Any, model_dir: Path, quantization: str, texts: Sequence[str], keys: Sequence[str]
) -> dict[str, float] | None:
    """Switch ``model`` (a ``huggingface.TextModel`` built without its torch module) to its served graph
    (``served_path``) when the cache holds both the graph and its comparison with the torch model on
    ``texts`` (``comparison_path``, figures ``keys``): then the torch model is neither loaded nor run.
    Sets what ``use_onnxruntime`` sets, and the model's inputs to the graph's. Returns the figures, or
    ``None`` when the cache lacks either (or the graph does not load): the caller loads the torch model
    and ``use_onnxruntime``. Not for int8-static (its graph's name needs the calibration texts)."""
    t0 = time.perf_counter()
    path = served_path(model, model_dir, quantization)
    if not path.is_file():
        return None
    figures = read_comparison(comparison_path(path, texts), keys)
    if figures is None:
        return None
    try:
        session = _cpu_session(path)
    except Exception as exc:
        log.warning(
            "the cached graph %s does not load (%s); loading the torch model to make it again", path, exc
        )
        return None
    model.session = session
    model.platform = PLATFORM
    model.engine = "onnxruntime"
    model.graph_cache = GRAPH_CACHE_HIT
    model._forward_args = {i.name for i in session.get_inputs()}
    log.info(
        "engine onnxruntime: the cached graph %s and its comparison with the torch model in %.2f s "
        "(the torch model not loaded)",
        path,
        time.perf_counter() - t0,
    )
    return figures


def run_graph(session: ort.InferenceSession, output: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run an exported graph on one tokenized batch.

    Args:
        session: the graph's session (``use_onnxruntime``).
        output: the output to return (``OUTPUT``, ``LOGITS``).
        tensors: int64 [rows, seq] CPU tensors, one per graph input.

    Returns:
        The output as a float32 CPU tensor (the graph's shape, e.g. [rows, num_labels]).
    """
    feeds = {k: v.numpy() for k, v in tensors.items()}
    return torch.from_numpy(session.run([output], feeds)[0])


def check_export(model_dir: Path, cosine: float) -> None:
    """Refuse an export whose embeddings deviate from the torch model's.

    Raises:
        ValueError: mean cosine to the torch model on the held-out sentences below ``MIN_EXPORT_COSINE``.
    """
    if cosine < MIN_EXPORT_COSINE:
        raise ValueError(
            f"the ONNX export of {model_dir} deviates from the torch model: mean cosine {cosine:.6f} on the "
            f"held-out sentences, below {MIN_EXPORT_COSINE}; serve it with engine torch"
        )


def check_scores_export(model_dir: Path, task: str, agreement: float, deviation_max: float) -> None:
    """Refuse a head's export whose scores deviate from the torch model's (``compare_scores`` of the
    task's held-out comparison: label agreement ratio, largest absolute score difference).

    Raises:
        ValueError: agreement below ``MIN_EXPORT_LABEL_AGREEMENT`` or deviation above
            ``MAX_EXPORT_SCORE_DEVIATION`` (both figures in the message).
    """
    if agreement < MIN_EXPORT_LABEL_AGREEMENT or not deviation_max <= MAX_EXPORT_SCORE_DEVIATION:
        raise ValueError(
            f"the ONNX export of {model_dir} ({task}) deviates from the torch model on the held-out "
            f"sentences: label agreement {agreement:.4f} (at least {MIN_EXPORT_LABEL_AGREEMENT}), largest "
            f"score difference {deviation_max:.6f} (at most {MAX_EXPORT_SCORE_DEVIATION}); serve it with "
            "engine torch"
        )
