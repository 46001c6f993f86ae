"""Model loaders: ``load_model(cfg) -> ServableModel`` (Hugging Face directory, TorchScript file, ONNX,
torch.export).

torch and transformers are imported lazily, inside ``load_model``, so that importing the interface
(``base``) stays cheap for the batcher's unit tests.
"""

from __future__ import annotations

from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.models.base import (
    REPORT_COMPARE_SECONDS,
    REPORT_COSINE_MEAN,
    REPORT_LABEL_AGREEMENT,
    REPORT_LOAD_SECONDS,
    REPORT_RETRIEVAL_AGREEMENT,
    REPORT_RETRIEVAL_AGREEMENT_ALL,
    REPORT_SCORE_DEVIATION_MAX,
    REPORT_SCORE_DEVIATION_MEAN,
    REPORT_WARMUP_SECONDS,
    ServableModel,
    batch_buckets,
)

__all__ = [
    "REPORT_COMPARE_SECONDS",
    "REPORT_COSINE_MEAN",
    "REPORT_LABEL_AGREEMENT",
    "REPORT_LOAD_SECONDS",
    "REPORT_RETRIEVAL_AGREEMENT",
    "REPORT_RETRIEVAL_AGREEMENT_ALL",
    "REPORT_SCORE_DEVIATION_MAX",
    "REPORT_SCORE_DEVIATION_MEAN",
    "REPORT_WARMUP_SECONDS",
    "InputError",
    "ServableModel",
    "batch_buckets",
    "load_model",
]


def load_model(cfg: RuntimeConfig) -> ServableModel:
    """Load, quantize and compare the model ``cfg.model`` describes, once per process.

    ``cfg.model.format`` picks the loader: ``huggingface`` (a directory, or ``default`` for the
    bundled all-MiniLM-L6-v2; ``cfg.model.task``, else its ``config.json``, picks the task: an
    embedder, or a classifier or reranker from ``hf_tasks``), ``torchscript`` (a file with declared
    inputs/outputs; deprecated), ``onnx`` (a ``.onnx`` file or its directory, tensors read from the
    model, on ONNX Runtime) or ``pt2`` (a ``torch.export`` program or AOTInductor package, tensors read
    from the program, on torch). The model
    is not warmed up; call ``warmup`` before reporting ready.

    Raises:
        FileNotFoundError: the model source does not exist.
        ValueError: the configuration cannot be served (e.g. fp16 on a CPU, a bad calibration file).
    """
    if cfg.model.format in ("torchscript", "onnx", "pt2"):
        from kubeinfer.runtime.models.tensors import TensorModel

        model: TensorModel
        if cfg.model.format == "torchscript":
            from kubeinfer.runtime.models.torchscript import load_torchscript

            model = load_torchscript(cfg)
        elif cfg.model.format == "onnx":
            from kubeinfer.runtime.models.onnx import load_onnx

            model = load_onnx(cfg)
        else:
            from kubeinfer.runtime.models.pt2 import load_pt2

            model = load_pt2(cfg)
        if cfg.warmup.dims is not None:
            model.warmup_dims = tuple(cfg.warmup.dims)
        return model
    from kubeinfer.runtime.models.hf_tasks import load_task_model, model_task

    task = model_task(cfg)
    if task != "text-embedding":
        return load_task_model(cfg, task)
    from kubeinfer.runtime.models.huggingface import load_huggingface

    return load_huggingface(cfg)
