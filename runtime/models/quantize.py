"""Post-training quantization of a loaded torch model, and its comparison with the unquantized one.

Modes (``QuantizationConfig.mode``):

- ``none``: the fp32 model as loaded.
- ``fp16``: weights and activations in float16. CUDA only: CPU kernels for fp16 matmul are slow or
  missing, so on a CPU this raises ``ValueError`` suggesting ``bf16`` or ``int8-dynamic``.
- ``bf16``: weights and activations in bfloat16 (CPU and CUDA).
- ``int8-dynamic``: ``nn.Linear`` weights int8 with one scale per output channel, activations
  quantized per batch at run time. On CPU this uses ``torch.ao.quantization.quantize_dynamic`` with
  ``per_channel_dynamic_qconfig`` (fbgemm/x86 int8 kernels). torch marks ``torch.ao.quantization``
  deprecated in favour of torchao, but torchao's ``Int8DynamicActivationInt8WeightConfig`` has no
  fast CPU kernel without ``torch.compile``: measured on MiniLM, 2 CPU cores, batch 64, it ran 1.4x
  SLOWER than fp32, while ``quantize_dynamic`` ran 1.6x faster. On CUDA, where ``torch.ao`` has no
  int8 kernels, torchao's ``Int8DynamicActivationInt8WeightConfig`` (per-channel weights) is used.
- ``int8-static``: CPU only. Each ``nn.Linear`` is wrapped in ``torch.ao.quantization.QuantWrapper``
  (eager-mode static quantization: quantize the input, int8 Linear, dequantize the output) with the
  x86 default qconfig (per-channel weight scales, histogram activation observer); the observers
  are calibrated by running the model on 100–200 samples, then converted.

``skip_modules`` (int8 modes only) keeps every module whose qualified name equals or starts with
one of the given prefixes (``encoder.layer.5`` covers ``encoder.layer.5.output.dense``) in fp32.

Measured on the bundled MiniLM (CPU, 349 held-out sentences; mean cosine to fp32 / retrieval
agreement with paraphrase queries): bf16 1.0000 / 1.000; int8-dynamic 0.977 / 1.000; int8-dynamic
skipping the six FFN output layers (``encoder.layer.N.output.dense``) 0.987 / 1.000; int8-static
0.863 / 0.995 (per-tensor static activations suffer from BERT's activation outliers); int8-static
skipping those six layers 0.984 / 1.000.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from kubeinfer.runtime.config import GateConfig, Quantization
from kubeinfer.runtime.models.base import QuantizationError
from torch import nn

log = logging.getLogger(__name__)

#: Modes that change floating-point precision only (``skip_modules`` does not apply).
FLOAT_MODES = ("fp16", "bf16")
#: Modes that quantize ``nn.Linear`` layers to int8.
INT8_MODES = ("int8-dynamic", "int8-static")


#: The texts the deviation from fp32 is measured on, as the gate's message and the ``measured_on`` label
#: of ``kubeinfer_quantization_compared_texts`` name them: the user's (``quantization.gate.texts_path``),
#: the bundled held-out sentences, or (a reranker, always) the bundled held-out pairs.
GATE_TEXTS = "gate texts"
HELDOUT_SENTENCES = "held-out sentences"
HELDOUT_PAIRS = "held-out pairs"
MEASURED_ON = (GATE_TEXTS, HELDOUT_SENTENCES, HELDOUT_PAIRS)


class QuantizationBelowGate(ValueError):
    """The model's deviation from fp32, measured at load, is under the quality gate's bar; the message
    gives every figure against its bar (the operator reads the type's name in the termination
    message: ``QuantizationBelowGate``)."""


def check_gate(
    gate: GateConfig | None, figures: Mapping[str, float], texts: int, where: str, *, embedder: bool
) -> None:
    """Hold the measured ``figures`` to ``gate``'s bars.

    Args:
        gate: the bars (``min_cosine``, ``min_agreement``); None: nothing to check.
        figures: ``cosine`` (embedders) and ``agreement``, ratios in [0, 1], as measured against fp32.
        texts: how many texts (or pairs) they were measured on; where: which (words for the message).
        embedder: the model is an embedder (only an embedder has a cosine).

    Raises:
        ValueError: ``min_cosine`` set on a model that is not an embedder.
        QuantizationBelowGate: a figure under its bar; the message names each figure and bar.
    """
    if gate is None:
        return
    if gate.min_cosine is not None and not embedder:
        raise ValueError("quantization.gate.min_cosine applies to text-embedding models; use min_agreement")
    bars = (
        ("mean cosine", "cosine", "min_cosine", gate.min_cosine),
        ("agreement", "agreement", "min_agreement", gate.min_agreement),
    )
    below = [
        f"{words} {figures[key]:.6g} < {bar} {value:g}"
        for words, key, bar, value in bars
        if value is not None and figures[key] < value
    ]
    if below:
        raise QuantizationBelowGate(
            f"quantization below the gate: {', '.join(below)} against fp32 on {texts} {where}"
        )


def is_skipped(name: str, skip_modules: Iterable[str]) -> bool:
    """True if module ``name`` equals one of the prefixes or lies below one (dot-separated)."""
    return any(name == p or name.startswith(p + ".") for p in skip_modules)


def float_dtype(mode: Quantization) -> torch.dtype:
    """The floating dtype of activations for ``mode``: float16, bfloat16, else float32."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mode, torch.float32)


def check_supported(mode: Quantization, device: torch.device, skip_modules: Sequence[str]) -> None:
    """Reject combinations this runtime cannot serve, before any weights are touched.

    Raises:
        QuantizationError: fp16 on a CPU; int8-static on CUDA; ``skip_modules`` with a float mode.
    """
    if mode == "fp16" and device.type != "cuda":
        raise QuantizationError(
            "quantization 'fp16' needs a CUDA device (this runtime has none: device "
            f"'{device}'); on a CPU use 'bf16' (same memory, accurate) or 'int8-dynamic' (fastest)"
        )
    if mode == "int8-static" and device.type != "cpu":
        raise QuantizationError(
            f"quantization 'int8-static' runs on the CPU only (device is '{device}'); on CUDA use "
            "'int8-dynamic', 'fp16' or 'bf16'"
        )
    if skip_modules and mode not in INT8_MODES:
        raise QuantizationError(
            f"quantization.skip_modules applies to int8-dynamic and int8-static only, not '{mode}'"
        )


def unmatched_skips(module: nn.Module, skip_modules: Sequence[str]) -> list[str]:
    """The ``skip_modules`` prefixes that name no module in ``module`` (likely typos)."""
    names = [n for n, _ in module.named_modules()]
    return [p for p in skip_modules if not any(is_skipped(n, [p]) for n in names)]


def quantize_module(
    module: nn.Module,
    mode: Quantization,
    *,
    device: torch.device,
    skip_modules: Sequence[str] = (),
    calibrate: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Return ``module`` quantized for ``mode`` on ``device`` (may be a new object; may modify it).

    Args:
        module: an eager fp32 ``nn.Module`` already on ``device``, in eval mode.
        mode: see the module docstring.
        device: where the model runs.
        skip_modules: qualified-name prefixes kept in fp32 (int8 modes).
        calibrate: int8-static: runs representative inputs through the prepared model.

    Raises:
        QuantizationError: unsupported combination, an unknown ``skip_modules`` entry, or
            int8-static without ``calibrate``.
    """
    check_supported(mode, device, skip_modules)
    missing = unmatched_skips(module, skip_modules)
    if missing:
        raise QuantizationError(f"quantization.skip_modules: no module named {missing} in the model")
    if mode == "none":
        return module
    if mode in FLOAT_MODES:
        return module.to(float_dtype(mode))
    targets = [
        name
        for name, child in module.named_modules()
        if isinstance(child, nn.Linear) and not is_skipped(name, skip_modules)
    ]
    if not targets:
        raise QuantizationError(f"quantization '{mode}': the model has no nn.Linear layer left to quantize")
    if mode == "int8-dynamic":
        if device.type == "cuda":
            return _int8_dynamic_torchao(module, set(targets))
        return _int8_dynamic_cpu(module, targets)
    if calibrate is None:
        raise QuantizationError("quantization 'int8-static' needs calibration samples (calibration_path)")
    return _int8_static_cpu(module, targets, calibrate)


def _quiet_filters() -> None:
    """Silence torch.ao's deprecation warnings (the module docstring says why we use it)."""
    warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
    warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*deprecated.*")
    warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated.*")


def _int8_dynamic_cpu(module: nn.Module, targets: Sequence[str]) -> nn.Module:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        _quiet_filters()
        spec = dict.fromkeys(targets, per_channel_dynamic_qconfig)
        quantized: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            module, qconfig_spec=spec, dtype=torch.qint8, inplace=True
        )
        return quantized


def _int8_dynamic_torchao(module: nn.Module, targets: set[str]) -> nn.Module:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    def wanted(_child: nn.Module, fqn: str) -> bool:
        return fqn in targets

    quantize_(module, Int8DynamicActivationInt8WeightConfig(), filter_fn=wanted)
    return module


def _int8_static_cpu(
    module: nn.Module, targets: Sequence[str], calibrate: Callable[[nn.Module], None]
) -> nn.Module:
    from torch.ao.quantization import (
        HistogramObserver,
        QConfig,
        QuantWrapper,
        convert,
        default_per_channel_weight_observer,
        prepare,
    )

    with warnings.catch_warnings():
        _quiet_filters()
        # torch's x86 default (get_default_qconfig("x86")), with the activation range given as
        # quant_min/quant_max instead of the deprecated reduce_range=True: uint8 limited to 0..127
        # (7 bits) so that u8*s8 products cannot saturate on CPUs without VNNI.
        qconfig = QConfig(  # type: ignore[no-untyped-call]
            activation=HistogramObserver.with_args(dtype=torch.quint8, quant_min=0, quant_max=127),
            weight=default_per_channel_weight_observer,
        )
        for name in targets:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            wrapper = QuantWrapper(getattr(parent, attr))
            wrapper.qconfig = qconfig  # type: ignore[assignment]  # torch.ao's eager-mode attribute
            setattr(parent, attr, wrapper)
        prepare(module, inplace=True)  # type: ignore[no-untyped-call]
        calibrate(module)
        convert(module, inplace=True)  # type: ignore[no-untyped-call]
    return module


def compare_embeddings(
    reference: np.ndarray, served: np.ndarray, queries: Sequence[int] | None = None
) -> tuple[float, float]:
    """Deviation of ``served`` embeddings from the unquantized ``reference`` ones.

    Args:
        reference, served: float arrays [n, d], one row per held-out item, same order.
        queries: rows used as retrieval queries (default: all rows).

    Returns:
        (mean cosine similarity of each row to its reference row, ratio in -1..1, over all rows;
         nearest-neighbour retrieval agreement, ratio in 0..1: the fraction of queries whose most
         similar OTHER row (cosine, among all n rows) is the same under ``served`` as under
         ``reference``.)
    """
    if reference.shape != served.shape or reference.ndim != 2 or reference.shape[0] < 2:
        raise ValueError(
            f"need two [n>=2, d] arrays of equal shape, got {reference.shape} and {served.shape}"
        )
    rows = np.arange(reference.shape[0]) if queries is None else np.asarray(queries, dtype=np.int64)
    ref = _unit(reference.astype(np.float64))
    got = _unit(served.astype(np.float64))
    cosine_mean = float(np.mean(np.sum(ref * got, axis=1)))
    agreement = float(np.mean(_nearest(ref, rows) == _nearest(got, rows)))
    return cosine_mean, agreement


def compare_scores(reference: np.ndarray, served: np.ndarray) -> tuple[float, float, float]:
    """Deviation of ``served`` scores from the unquantized ``reference`` ones (classifiers, rerankers).

    Args:
        reference, served: float arrays [n, k] of equal shape: a classifier's label probabilities (one
            row per held-out text, one column per label), or a reranker's scores (one row per held-out
            query, one column per candidate).

    Returns:
        (label agreement, ratio in 0..1: the fraction of rows whose argmax is the same;
         mean absolute difference over every entry; largest absolute difference), the differences in
         the scores' own units.

    Raises:
        ValueError: the arrays differ in shape or are not [n >= 1, k >= 1].
    """
    if reference.shape != served.shape or reference.ndim != 2 or reference.size == 0:
        raise ValueError(f"need two [n, k] arrays of equal shape, got {reference.shape} and {served.shape}")
    ref = reference.astype(np.float64)
    got = served.astype(np.float64)
    agreement = float(np.mean(np.argmax(ref, axis=1) == np.argmax(got, axis=1)))
    diff = np.abs(ref - got)
    return agreement, float(diff.mean()), float(diff.max())


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x / np.maximum(norms, 1e-12))


def _nearest(unit_rows: np.ndarray, queries: np.ndarray) -> np.ndarray:
    sims = unit_rows[queries] @ unit_rows.T
    sims[np.arange(len(queries)), queries] = -np.inf
    return np.asarray(np.argmax(sims, axis=1))
