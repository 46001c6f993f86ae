"""Hugging Face tasks beyond embeddings: a text classifier and a cross-encoder reranker (torch engine).

``model.task`` says what a Hugging Face directory does; unset, ``detect_task`` reads its
``config.json``:

- ``architectures`` with a ``*ForSequenceClassification`` class: ``reranking`` when the head has one
  label (a single logit is a relevance score, not a class: sentence-transformers' CrossEncoder
  rerankers, ``cross-encoder/ms-marco-*``, ``BAAI/bge-reranker-*``), else ``text-classification``;
- anything else: ``text-embedding`` (``huggingface.TextEmbeddingModel``).

Tensors (the v2 model metadata states them):

- ``text-classification`` (``TextClassifierModel``): ``text`` BYTES [-1] -> ``label`` BYTES [-1] (the
  argmax's name in ``config.id2label``), ``score`` FP32 [-1] (its probability: softmax over the labels;
  the sigmoid of each logit for ``problem_type: multi_label_classification`` or a one-label head, as the
  transformers pipeline does) and ``logits`` FP32 [-1, num_labels] (ask for the outputs you want).
- ``reranking`` (``CrossEncoderModel``): ``query`` BYTES [-1] and ``text`` BYTES [-1], one pair per row,
  tokenized as a pair (``[CLS] query [SEP] text [SEP]``, truncated longest-first at
  ``max_sequence_length``) -> ``score`` FP32 [-1]: the head's logit through the activation the
  sentence-transformers config names (``config.json`` ``sentence_transformers.activation_fn``, or the
  older ``sbert_ce_default_activation_function``): ``Sigmoid`` (relevance in 0..1) or ``Identity`` (the
  raw logit); none named: ``Sigmoid``, sentence-transformers' default for a one-label CrossEncoder.

Both are ``huggingface.TextModel``: the embedder's tokenizer path, validation (UTF-8, tokens per text),
batching across requests (rows of every request in one padded batch), warmup over the batch and
sequence buckets, token counts, and quantization (every torch mode; int8 modes quantize the
``nn.Linear`` layers, the head's included). The deviation from fp32 is measured at load on the
held-out sentences (``compare_scores``): a classifier's label agreement and probability deviation over
the 349 held-out sentences; a reranker's top-1 agreement and score deviation over 32 held-out queries
with 8 candidates each (its paraphrase and 7 others).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kubeinfer.runtime.config import RuntimeConfig, Task, TensorConfig
from kubeinfer.runtime.models.base import (
    REPORT_COMPARE_SECONDS,
    REPORT_LABEL_AGREEMENT,
    REPORT_LOAD_SECONDS,
    REPORT_SCORE_DEVIATION_MAX,
    REPORT_SCORE_DEVIATION_MEAN,
    TOKEN_COUNTS,
)
from kubeinfer.runtime.models.device import configure_torch, resolve_device
from kubeinfer.runtime.models.huggingface import (
    OFFLINE_BATCH,
    TextModel,
    TokenizedBatch,
    _quantized,
    heldout_pairs,
    heldout_sentences,
    model_dir,
)
from kubeinfer.runtime.models.quantize import check_supported, compare_scores
from torch import nn

log = logging.getLogger(__name__)

#: The reranker's comparison set: held-out queries, candidates per query.
RERANK_QUERIES = 32
RERANK_CANDIDATES = 8
#: Activations a CrossEncoder config may name (the class name's last part) and whether it is the sigmoid.
ACTIVATIONS = {"Sigmoid": True, "Identity": False}


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """The model directory's ``config.json`` as a dict.

    Raises:
        FileNotFoundError: no ``config.json``.
        ValueError: it is not a JSON object.
    """
    doc = json.loads((model_dir / "config.json").read_text("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{model_dir / 'config.json'}: not a JSON object")
    return doc


def _num_labels(config: dict[str, Any]) -> int:
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return int(config.get("num_labels", 2))


def detect_task(model_dir: Path) -> Task:
    """The task of a Hugging Face directory from its ``config.json`` (see the module docstring).

    Raises:
        FileNotFoundError: no ``config.json``.
    """
    config = read_model_config(model_dir)
    architectures = config.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "reranking" if _num_labels(config) == 1 else "text-classification"
    return "text-embedding"


def model_task(cfg: RuntimeConfig) -> Task:
    """The task of the Hugging Face model ``cfg.model`` names: ``model.task``, else ``detect_task`` of
    its directory (the bundled MiniLM: text-embedding).

    Raises:
        FileNotFoundError: the directory has no ``config.json``.
    """
    if cfg.model.task is not None:
        return cfg.model.task
    return detect_task(model_dir(cfg.model.source))


def reranker_sigmoid(config: dict[str, Any]) -> bool:
    """Whether a reranker's score is the sigmoid of its logit (True) or the raw logit (False), from the
    sentence-transformers activation its ``config.json`` names (default: the sigmoid).

    Raises:
        ValueError: an activation other than Sigmoid or Identity (named in the message).
    """
    st = config.get("sentence_transformers")
    named = st.get("activation_fn") if isinstance(st, dict) else None
    named = named or config.get("sbert_ce_default_activation_function")
    if not named:
        return True
    short = str(named).rsplit(".", 1)[-1]
    if short not in ACTIVATIONS:
        raise ValueError(
            f"the reranker's activation {named!r} is not supported; this runtime serves Sigmoid or Identity"
        )
    return ACTIVATIONS[short]


class TextClassifierModel(TextModel):
    """A sequence classifier: ``text`` -> ``label``, ``score``, ``logits`` (see the module docstring).

    Args:
        labels: the label names, by class index (``config.id2label``).
        multi_label: scores are per-label sigmoids (else a softmax over the labels).
    """

    def __init__(
        self,
        *,
        name: str,
        module: nn.Module,
        tokenizer: Any,
        device: torch.device,
        cfg: RuntimeConfig,
        labels: Sequence[str],
        multi_label: bool,
    ) -> None:
        super().__init__(name=name, module=module, tokenizer=tokenizer, device=device, cfg=cfg)
        self.labels = list(labels)
        self.multi_label = multi_label
        self._label_bytes = np.empty(len(self.labels), dtype=object)
        self._label_bytes[:] = [label.encode("utf-8") for label in self.labels]
        self.outputs = [
            _tensor("label", "BYTES", [-1]),
            _tensor("score", "FP32", [-1]),
            _tensor("logits", "FP32", [-1, len(self.labels)]),
        ]

    def logits(self, prepared: TokenizedBatch) -> torch.Tensor:
        """The head's logits: float32 [rows, num_labels], on the CPU."""
        with torch.inference_mode():
            out: torch.Tensor = self.module(**self._inputs_on_device(prepared)).logits
            return out.to("cpu", dtype=torch.float32)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-label scores of ``logits`` [rows, num_labels]: sigmoid (multi-label), else softmax."""
        return torch.sigmoid(logits) if self.multi_label else torch.softmax(logits, dim=-1)

    def execute(self, prepared: TokenizedBatch) -> dict[str, np.ndarray]:
        """``label`` object [rows] (UTF-8 bytes), ``score`` float32 [rows] (the label's probability),
        ``logits`` float32 [rows, num_labels], and ``TOKEN_COUNTS`` int64 [rows]."""
        logits = self.logits(prepared)
        probs = self.probabilities(logits)
        top = torch.argmax(logits, dim=-1)
        score = probs.gather(1, top.unsqueeze(1)).squeeze(1)
        return {
            "label": self._label_bytes[top.numpy()],
            "score": score.numpy().astype(np.float32),
            "logits": logits.numpy(),
            TOKEN_COUNTS: self.token_counts(prepared),
        }

    def probabilities_of(self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH) -> np.ndarray:
        """Every label's probability for many texts: float32 [len(texts), num_labels], in input order."""
        rows = []
        for start in range(0, len(texts), batch_size):
            rows.append(self.probabilities(self.logits(self.tokenize(texts[start : start + batch_size]))))
        return torch.cat(rows).numpy()

    def comparison(self) -> np.ndarray:
        """The scores the quantization is judged on: ``probabilities_of`` the held-out sentences."""
        return self.probabilities_of(heldout_sentences())


class CrossEncoderModel(TextModel):
    """A cross-encoder reranker: ``query``, ``text`` pairs -> ``score`` (see the module docstring).

    Args:
        sigmoid: the score is the sigmoid of the logit (else the raw logit).
    """

    def __init__(
        self,
        *,
        name: str,
        module: nn.Module,
        tokenizer: Any,
        device: torch.device,
        cfg: RuntimeConfig,
        sigmoid: bool,
    ) -> None:
        super().__init__(
            name=name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            text_inputs=("query", "text"),
        )
        self.sigmoid = sigmoid
        self.outputs = [_tensor("score", "FP32", [-1])]

    def scores(self, prepared: TokenizedBatch) -> torch.Tensor:
        """One relevance score per pair: float32 [rows], on the CPU."""
        with torch.inference_mode():
            logit = self.module(**self._inputs_on_device(prepared)).logits[:, 0]
            logit = logit.to("cpu", dtype=torch.float32)
        return torch.sigmoid(logit) if self.sigmoid else logit

    def execute(self, prepared: TokenizedBatch) -> dict[str, np.ndarray]:
        """``score`` float32 [rows] and ``TOKEN_COUNTS`` int64 [rows]."""
        return {"score": self.scores(prepared).numpy(), TOKEN_COUNTS: self.token_counts(prepared)}

    def score_pairs(
        self, queries: Sequence[str], texts: Sequence[str], batch_size: int = OFFLINE_BATCH
    ) -> np.ndarray:
        """Scores of many pairs ``(queries[i], texts[i])``: float32 [len(queries)], in input order."""
        out = []
        for start in range(0, len(queries), batch_size):
            end = start + batch_size
            out.append(self.scores(self.tokenize(queries[start:end], texts[start:end])))
        return torch.cat(out).numpy()

    def comparison(self) -> np.ndarray:
        """The scores the quantization is judged on: float32 [queries, candidates], held-out queries
        (a sentence with a paraphrase) against their paraphrase and 7 other held-out sentences."""
        queries, texts = rerank_heldout()
        return self.score_pairs(queries, texts).reshape(-1, RERANK_CANDIDATES)


def rerank_heldout() -> tuple[list[str], list[str]]:
    """The reranker's comparison pairs, query-major: ``RERANK_QUERIES`` held-out queries, each with
    ``RERANK_CANDIDATES`` candidates (its paraphrase first, then the paraphrases of the next queries)."""
    para = [(a, b) for a, b, is_para in heldout_pairs() if is_para]
    n = min(RERANK_QUERIES, len(para))
    queries: list[str] = []
    texts: list[str] = []
    for i in range(n):
        for k in range(RERANK_CANDIDATES):
            queries.append(para[i][0])
            texts.append(para[(i + k) % len(para)][1])
    return queries, texts


def _tensor(name: str, datatype: str, shape: list[int]) -> TensorConfig:
    return TensorConfig.model_validate({"name": name, "datatype": datatype, "shape": shape})


def load_task_model(cfg: RuntimeConfig, task: Task) -> TextModel:
    """Load the classifier or reranker ``cfg.model`` names (``task``), quantize it, compare it with fp32.

    Args:
        cfg: the runtime configuration (``model``, ``quantization``, ``limits``, ``device``).
        task: ``text-classification`` or ``reranking``.

    Raises:
        FileNotFoundError: no model directory / calibration file.
        ValueError: a task the directory's model cannot serve (no sequence-classification head, a
            reranker with more than one label, an unsupported activation), engine onnxruntime,
            ``device: cuda`` without CUDA.
        QuantizationError (a ValueError): the quantization cannot be applied.
    """
    import os

    import transformers

    started = time.perf_counter()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if (cfg.model.engine or "torch") != "torch":
        raise ValueError(
            f"model.task {task}: engine onnxruntime serves text-embedding only for now; use torch"
        )
    device = resolve_device(cfg.device)
    check_supported(cfg.quantization.mode, device, cfg.quantization.skip_modules)
    configure_torch(device)
    path = model_dir(cfg.model.source)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    config = read_model_config(path)
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        # transformers would put a randomly initialised head on it and serve noise
        raise ValueError(
            f"model.task {task}: {path} has no sequence-classification head (config.json architectures: "
            f"{architectures or 'none'}); a classifier or a reranker is a *ForSequenceClassification model"
        )
    module = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(path), local_files_only=True, dtype=torch.float32
    )
    module = module.eval().to(device)
    model: TextClassifierModel | CrossEncoderModel
    if task == "reranking":
        if int(module.config.num_labels) != 1:
            raise ValueError(
                f"model.task reranking: {path} has {module.config.num_labels} labels; a cross-encoder "
                "reranker has one (serve it as text-classification)"
            )
        model = CrossEncoderModel(
            name=cfg.model.name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            sigmoid=reranker_sigmoid(config),
        )
    else:
        id2label = {int(k): str(v) for k, v in module.config.id2label.items()}
        labels = [id2label.get(i, f"LABEL_{i}") for i in range(int(module.config.num_labels))]
        multi = module.config.problem_type == "multi_label_classification" or len(labels) == 1
        model = TextClassifierModel(
            name=cfg.model.name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            labels=labels,
            multi_label=multi,
        )
    qcfg = cfg.quantization
    compare_seconds = 0.0
    reference = None
    if qcfg.mode != "none":
        t0 = time.perf_counter()
        reference = model.comparison()
        compare_seconds += time.perf_counter() - t0
    model.module = _quantized(model, qcfg, device)
    agreement, deviation_mean, deviation_max = 1.0, 0.0, 0.0
    if reference is not None:
        t0 = time.perf_counter()
        agreement, deviation_mean, deviation_max = compare_scores(reference, model.comparison())
        compare_seconds += time.perf_counter() - t0
    model._report.update(
        {
            REPORT_LABEL_AGREEMENT: agreement,
            REPORT_SCORE_DEVIATION_MEAN: deviation_mean,
            REPORT_SCORE_DEVIATION_MAX: deviation_max,
            REPORT_COMPARE_SECONDS: compare_seconds,
            REPORT_LOAD_SECONDS: time.perf_counter() - started,
        }
    )
    log.info(
        "loaded %s (%s, %s) from %s on %s, quantization %s: %s agreement %.4f, score deviation mean %.4f "
        "max %.4f (comparison %.2f s), load %.2f s",
        cfg.model.name, task, type(model).__name__, path, device, qcfg.mode,
        "top-1" if task == "reranking" else "label", agreement, deviation_mean, deviation_max,
        compare_seconds, model._report[REPORT_LOAD_SECONDS],
    )  # fmt: skip
    return model
