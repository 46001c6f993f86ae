"""Hugging Face tasks beyond embeddings: a text classifier, a token classifier (NER) and a cross-encoder
reranker, on engine torch or onnxruntime.

``model.task`` says what a Hugging Face directory does; unset, ``detect_task`` reads its
``config.json``:

- ``architectures`` with a ``*ForSequenceClassification`` class: ``reranking`` when the head has one
  label (a single logit is a relevance score, not a class: sentence-transformers' CrossEncoder
  rerankers, ``cross-encoder/ms-marco-*``, ``BAAI/bge-reranker-*``), else ``text-classification``;
- a ``*ForTokenClassification`` class: ``token-classification``;
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
- ``token-classification`` (``TokenClassifierModel``): ``text`` BYTES [-1] and an optional
  ``aggregation_strategy`` BYTES [1] -> ``entities`` BYTES [-1], one JSON array per row: the entities
  transformers' ``TokenClassificationPipeline`` gives for the text (its own post-processing, fed this
  batch's logits and character offsets).

All are ``huggingface.TextModel``: the embedder's tokenizer path, validation (UTF-8, tokens per text),
batching across requests (rows of every request in one padded batch), warmup over the batch and
sequence buckets, token counts, and quantization (every torch mode; int8 modes quantize the
``nn.Linear`` layers, the head's included).

Engines: ``torch`` runs the head model (``module``); ``onnxruntime`` (CPU, quantization ``none``,
``int8-dynamic`` or ``int8-static``) runs its graph exported at load by ``hf_onnx`` (``SEQUENCE_LOGITS``
for a classifier or reranker, ``TOKEN_LOGITS`` for a token classifier; cached; the int8 modes by ONNX
Runtime's recipes, ``hf_onnx.INT8_RECIPE`` and ``hf_onnx.INT8_STATIC_RECIPE``). Only the forward
pass differs (``head_logits``): labels, scores, the
reranker's activation, the pipeline's entity post-processing and the v2 tensors are the same on both;
the metadata's ``platform`` names the engine (``pytorch``, ``onnxruntime_onnx``) as for the embedder.
An fp32 export whose held-out scores deviate from the torch model's is refused
(``hf_onnx.check_scores_export``).

The deviation from fp32 (the torch fp32 model, whatever the engine) is measured at load on the
held-out sentences (``compare_scores``): a classifier's label agreement and probability deviation over
the 349 held-out sentences; a token classifier's the same per token of those sentences; a reranker's
top-1 agreement and score deviation over 32 held-out queries
with 8 candidates each (its paraphrase and 7 others).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, get_args

import numpy as np
import torch
from kubeinfer.runtime.config import AggregationStrategy, RuntimeConfig, Task, TensorConfig
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.models.base import (
    REPORT_COMPARE_SECONDS,
    REPORT_LABEL_AGREEMENT,
    REPORT_LOAD_SECONDS,
    REPORT_SCORE_DEVIATION_MAX,
    REPORT_SCORE_DEVIATION_MEAN,
    TOKEN_COUNTS,
    WINDOWS_INPUT,
    WindowParts,
    pack_windows,
)
from kubeinfer.runtime.models.device import configure_torch, resolve_device
from kubeinfer.runtime.models.huggingface import (
    OFFLINE_BATCH,
    TextModel,
    TokenizedBatch,
    _check_onnxruntime,
    _decode_rows,
    _quantized,
    calibration_texts,
    chunk_overlap,
    gate_texts,
    heldout_pairs,
    heldout_sentences,
    judge,
    model_dir,
)
from kubeinfer.runtime.models.quantize import (
    GATE_TEXTS,
    HELDOUT_PAIRS,
    HELDOUT_SENTENCES,
    check_supported,
    compare_scores,
)
from torch import nn

log = logging.getLogger(__name__)

#: The reranker's comparison set: held-out queries, candidates per query.
RERANK_QUERIES = 32
RERANK_CANDIDATES = 8
#: Activations a CrossEncoder config may name (the class name's last part) and whether it is the sigmoid.
ACTIVATIONS = {"Sigmoid": True, "Identity": False}
#: A token classifier's request input naming its aggregation strategy (BYTES [1], optional).
AGGREGATION_INPUT = "aggregation_strategy"
#: The strategy a token classifier uses when neither the request nor ``model.aggregation_strategy``
#: names one: the transformers ``TokenClassificationPipeline``'s default.
DEFAULT_AGGREGATION: AggregationStrategy = "none"
AGGREGATION_STRATEGIES: tuple[str, ...] = get_args(AggregationStrategy)
#: What the label agreement of a task's deviation report counts (the load's log line).
AGREEMENT_OF = {"reranking": "top-1", "token-classification": "token-label"}


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
    if any(str(a).endswith("ForTokenClassification") for a in architectures):
        return "token-classification"
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


def head_logits(model: TextModel, prepared: TokenizedBatch) -> torch.Tensor:
    """The forward pass of a task model's head on one tokenized batch: its ``logits``, float32 on the
    CPU, [rows, num_labels] (a sequence classifier or reranker) or [rows, longest, num_labels] (a token
    classifier). On engine torch ``model.module`` runs (quantized or not); on engine onnxruntime its
    exported graph (``model.session``, ``hf_onnx.run_graph``). Post-processing is the caller's, the
    same on both engines."""
    if model.session is not None:
        from kubeinfer.runtime.models.hf_onnx import LOGITS, run_graph

        return run_graph(model.session, LOGITS, prepared.tensors)
    assert model.module is not None  # engine torch keeps its module
    with torch.inference_mode():
        out: torch.Tensor = model.module(**model._inputs_on_device(prepared)).logits
        return out.to("cpu", dtype=torch.float32)


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
        """The head's logits: float32 [rows, num_labels], on the CPU (``head_logits``)."""
        return head_logits(self, prepared)

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

    def comparison(self, texts: Sequence[str] | None = None) -> np.ndarray:
        """The scores the quantization is judged on: ``probabilities_of`` ``texts`` (None: the held-out
        sentences)."""
        return self.probabilities_of(heldout_sentences() if texts is None else list(texts))


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
        logit = head_logits(self, prepared)[:, 0]
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

    def comparison(self, texts: Sequence[str] | None = None) -> np.ndarray:
        """The scores the quantization is judged on: float32 [queries, candidates], held-out queries
        (a sentence with a paraphrase) against their paraphrase and 7 other held-out sentences (a pair
        model is always judged on these: ``texts`` is not used)."""
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


@dataclass(frozen=True)
class TaggedBatch(TokenizedBatch):
    """A token classifier's batch: the token tensors [tensor rows, longest] and, per tensor row, what the
    transformers pipeline's post-processing reads beside the logits. A tensor row is a row, or with
    ``overflow: chunk`` one window of a row (``windows``: the row of each).

    Attributes:
        texts: each row's text (offsets index its characters).
        positions: each tensor row's token positions in the padded tensors (int64 [its tokens]).
        offsets: each tensor row's character offsets into its row's text, int64 [its tokens, 2]
            (``start``, ``end``).
        special: each tensor row's special-tokens mask, int64 [its tokens] (1 for [CLS], [SEP]).
        strategies: each row's aggregation strategy (its request's).
        parts: a batch of window parts (``TokenClassifierModel.window_parts``): each tensor row one
            window of its own, no texts; ``execute`` answers each window's logits (``WINDOW_LOGITS``).
    """

    texts: list[str]
    positions: list[np.ndarray]
    offsets: list[np.ndarray]
    special: list[np.ndarray]
    strategies: list[str]
    parts: bool = field(default=False, kw_only=True)


#: The output of a batch of a chunked token classifier's window parts (``TokenClassifierModel.window_parts``):
#: object [windows], each window's logits at its tokens (float32 [tokens, num_labels]), from which its
#: request's ``merge`` tags the texts. Only the batcher sees it: a request's answer is ``entities``.
WINDOW_LOGITS = "__window_logits__"


class TokenWindow(NamedTuple):
    """One window of a token classifier's row (the row itself when it is not chunked), padding left out.

    Attributes:
        input_ids: int64 [tokens].
        logits: float32 [tokens, num_labels].
        offsets: int64 [tokens, 2], character offsets into the row's text.
        special: int64 [tokens], 1 for special tokens.
    """

    input_ids: torch.Tensor
    logits: torch.Tensor
    offsets: np.ndarray
    special: np.ndarray


class TokenClassifierModel(TextModel):
    """A token classifier (an NER tagger): ``text`` -> ``entities``, one JSON array per row.

    Each row's entities are what ``transformers.TokenClassificationPipeline`` returns for that text
    with the row's aggregation strategy: the pipeline object's own ``postprocess`` (softmax per token,
    special tokens dropped, ``O`` dropped, subwords merged and B-/I- tags grouped as the strategy
    says) is fed the logits and character offsets of this batch; the pipeline never runs the model.

    Tensors: ``text`` BYTES [-1], optional ``aggregation_strategy`` BYTES [1] (one of ``none``,
    ``simple``, ``first``, ``average``, ``max`` for the whole request; absent: ``default_strategy``)
    -> ``entities`` BYTES [-1], each a UTF-8 JSON array of objects ``{"entity", "score", "index",
    "word", "start", "end"}`` (strategy ``none``: one per token, ``index`` its position with special
    tokens counted) or ``{"entity_group", "score", "word", "start", "end"}`` (the others); ``start`` and
    ``end`` are character offsets into the row's text (Python string indices: code points).

    With ``overflow: chunk`` a text longer than the window (``max_sequence_length``) runs as the
    windows transformers' pipeline makes with ``stride`` (the tokenizer's overflowing tokens: windows
    of the window's length, special tokens included, each repeating the last ``chunk_overlap`` content
    tokens of the one before); each window's entities are found as for a text of its own, with offsets
    into the whole text, and merged as the pipeline merges them (``aggregate_overlapping_entities``:
    of entities that overlap, the longer one, or on a tie the higher score). As with the pipeline's
    ``stride``, strategy ``none`` (one entity per token of a window) cannot be merged: a chunked
    service needs another default (``ValueError`` at load) and a request naming ``none`` for a text
    longer than the window gets 400. A request with such a text is queued as parts of its windows
    (``window_parts``, as an embedder's), below short requests; a request whose texts each fit one
    window runs whole.

    Args:
        module: a ``*ForTokenClassification`` model.
        tokenizer: its fast tokenizer (offsets need one).
        labels: the label names, by class index (``config.id2label``).
        default_strategy: the strategy of a request that names none.

    Raises:
        ValueError: a tokenizer without offsets (not a fast tokenizer); ``overflow: chunk`` with
            ``default_strategy`` none.
    """

    request_inputs = frozenset({AGGREGATION_INPUT})
    chunks = True

    def __init__(
        self,
        *,
        name: str,
        module: nn.Module,
        tokenizer: Any,
        device: torch.device,
        cfg: RuntimeConfig,
        labels: Sequence[str],
        default_strategy: AggregationStrategy,
    ) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                "model.task token-classification needs a fast (Rust) tokenizer for character offsets; "
                f"{type(tokenizer).__name__} is not one (save the model with its tokenizer.json)"
            )
        super().__init__(name=name, module=module, tokenizer=tokenizer, device=device, cfg=cfg)
        if self.overflow == "chunk" and default_strategy == "none":
            raise ValueError(
                "model.overflow chunk on a token classifier needs model.aggregation_strategy simple, first, "
                "average or max: the entities of overlapping windows are merged by their character "
                "offsets, which strategy none (one entity per token of a window) does not allow, as "
                "transformers' stride does not"
            )
        from transformers import TokenClassificationPipeline

        self.labels = list(labels)
        self.default_strategy: str = default_strategy
        self.inputs.append(_tensor(AGGREGATION_INPUT, "BYTES", [1]))
        self.outputs = [_tensor("entities", "BYTES", [-1])]
        # The pipeline's post-processing reads its tokenizer (token strings, words) and
        # model.config.id2label only: a private tokenizer copy (only read, so safe on any thread) and
        # the config, not the weights (which quantization replaces).
        pipeline_class: Any = TokenClassificationPipeline  # untyped in transformers
        self._pipeline = pipeline_class(model=module, tokenizer=copy.deepcopy(tokenizer))
        self._pipeline.model = SimpleNamespace(config=module.config)

    # --- validation --------------------------------------------------------------------------

    def narrow_overflow(self, requested: Any) -> str | None:
        """As every text model (``TextModel.narrow_overflow``), but a chunked token classifier narrows
        to refuse only: its windows are tagged together in one batch, which has no place for a row cut
        to its first window (400 naming the parameter)."""
        narrowed = super().narrow_overflow(requested)
        if narrowed == "truncate":
            raise InputError(
                "parameter 'overflow': a token classifier whose service chunks takes refuse (or chunk) per "
                "request, not truncate"
            )
        return narrowed

    def validate(self, inputs: Mapping[str, np.ndarray], overflow: str | None = None) -> int:
        """As every model (``ServableModel.validate``); with ``overflow: chunk``, a request naming
        strategy ``none`` whose text is longer than the window (and within ``max_text_tokens``) is
        refused first (400 naming ``aggregation_strategy``), before its rows are counted as chunked."""
        if (overflow or self.overflow) == "chunk":
            self._check_unmerged_strategy(inputs)
        return super().validate(inputs, overflow)

    def _check_unmerged_strategy(self, inputs: Mapping[str, np.ndarray]) -> None:
        try:
            if self.strategy_of(inputs.get(AGGREGATION_INPUT)) != "none":
                return
            rows = _decode_rows("text", inputs["text"])
        except (InputError, KeyError):
            return  # the request is wrong otherwise: ServableModel.validate says how
        window = self.max_sequence_length
        long_rows = [i for i, t in enumerate(rows) if len(t.encode("utf-8")) + self._special_tokens > window]
        if not long_rows:
            return
        with self._tokenizer_lock:
            ids = self.tokenizer([rows[i] for i in long_rows], add_special_tokens=True)["input_ids"]
        for i, row_ids in zip(long_rows, ids, strict=True):
            if window < len(row_ids) <= self.token_limit:  # over the limit: the 413 is the answer
                raise InputError(
                    f"input tensor '{AGGREGATION_INPUT}': 'none' gives one entity per token and cannot "
                    f"merge overlapping windows; with overflow chunk, row {i} of 'text' ({len(row_ids)} "
                    f"tokens) spans windows of {window} tokens: send simple, first, average or max",
                    tensor=AGGREGATION_INPUT,
                )

    def _validate_tensor(self, spec: TensorConfig, array: np.ndarray, overflow: str | None = None) -> None:
        """``aggregation_strategy``: one known strategy (400); ``text``: as every text model."""
        if spec.name == AGGREGATION_INPUT:
            self.strategy_of(array)
            return
        super()._validate_tensor(spec, array, overflow)

    def strategy_of(self, array: np.ndarray | None) -> str:
        """The strategy an ``aggregation_strategy`` tensor (BYTES [1]) names, lower-cased as the
        pipeline reads it; None: ``default_strategy``.

        Raises:
            InputError: not one UTF-8 value among ``AGGREGATION_STRATEGIES`` (400, naming the tensor).
        """
        if array is None:
            return self.default_strategy
        values = _decode_rows(AGGREGATION_INPUT, array)
        strategy = values[0].strip().lower() if len(values) == 1 else ""
        if strategy not in AGGREGATION_STRATEGIES:
            got = values[0] if len(values) == 1 else f"{len(values)} values"
            raise InputError(
                f"input tensor '{AGGREGATION_INPUT}': {got!r} is not an aggregation strategy; expected one "
                f"of {', '.join(AGGREGATION_STRATEGIES)}",
                tensor=AGGREGATION_INPUT,
            )
        return strategy

    # --- serving -----------------------------------------------------------------------------

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> TaggedBatch:
        """Tokenize the rows of all requests in order, padded to the longest row in this batch, each
        row with its request's strategy; with ``overflow: chunk``, as windows (``tokenize_windows``).
        A batch of window parts (``window_parts``: ``WINDOWS_INPUT``, tokenized at submission; parts
        batch with parts only) is its windows padded, one tensor row each."""
        if batch and WINDOWS_INPUT in batch[0]:
            return self._parts_batch([w for request in batch for w in request[WINDOWS_INPUT]])
        texts: list[str] = []
        strategies: list[str] = []
        for request in batch:
            rows = _decode_rows("text", request["text"])
            texts.extend(rows)
            strategies.extend([self.strategy_of(request.get(AGGREGATION_INPUT))] * len(rows))
        if self.overflow == "chunk":
            return self.tokenize_windows(texts, strategies)
        return self.tokenize(texts, strategies=strategies)

    def tokenize(
        self,
        texts: Sequence[str],
        second: Sequence[str] | None = None,
        *,
        strategies: Sequence[str] | None = None,
    ) -> TaggedBatch:
        """Tokenize ``texts`` padded to the longest row, truncated at ``truncate_at``, with
        offsets and special-tokens masks (see ``TaggedBatch``); ``strategies`` per row (None: the
        default for every row).

        Raises:
            ValueError: ``second`` is given (a token classifier reads single texts), or ``strategies``
                has another length than ``texts``.
        """
        if second is not None:
            raise ValueError("a token classifier tokenizes single texts, not pairs")
        rows = len(texts)
        chosen = list(strategies) if strategies is not None else [self.default_strategy] * rows
        if len(chosen) != rows:
            raise ValueError(f"{rows} texts but {len(chosen)} strategies")
        if self._batch_encoder is not None:
            encodings = self._batch_encoder.encode_batch(list(texts), add_special_tokens=True)
            columns: dict[str, Any] = {
                "input_ids": [e.ids for e in encodings],
                "attention_mask": [e.attention_mask for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings],
            }
            offsets = [e.offsets for e in encodings]
            special = [e.special_tokens_mask for e in encodings]
        else:
            columns, offsets, special = self._encode_unpadded(texts)
        mask = np.array(columns["attention_mask"], dtype=np.int64).reshape(rows, -1)
        positions = [np.flatnonzero(row) for row in mask]
        tensors = {
            k: torch.from_numpy(np.array(v, dtype=np.int64).reshape(rows, -1))
            for k, v in columns.items()
            if k in self._forward_args
        }
        return TaggedBatch(
            tensors=tensors,
            rows=rows,
            texts=list(texts),
            positions=positions,
            offsets=[
                np.array(o, dtype=np.int64).reshape(-1, 2)[p] for o, p in zip(offsets, positions, strict=True)
            ],
            special=[np.array(m, dtype=np.int64)[p] for m, p in zip(special, positions, strict=True)],
            strategies=chosen,
        )

    def tokenize_windows(self, texts: Sequence[str], strategies: Sequence[str] | None = None) -> TaggedBatch:
        """``overflow: chunk``: ``texts`` as the windows transformers' token-classification pipeline makes
        with ``stride`` (``tokenizer(text, truncation=True, max_length=window, stride=...,
        return_overflowing_tokens=True)``): windows of at most ``max_sequence_length`` tokens (special
        tokens included), each repeating the last ``chunk_overlap`` content tokens of the one before,
        offsets into the whole text; a text that fits is one window. Returns a ``TaggedBatch`` of int64
        tensors [windows, longest window], padded on the right, with ``windows`` (the row of each) and
        ``row_tokens`` (each text's tokens, special tokens once); ``strategies`` per row (None: the
        default for every row).

        Raises:
            ValueError: ``strategies`` has another length than ``texts``.
        """
        rows = len(texts)
        chosen = list(strategies) if strategies is not None else [self.default_strategy] * rows
        if len(chosen) != rows:
            raise ValueError(f"{rows} texts but {len(chosen)} strategies")
        window = self.max_sequence_length
        stride = chunk_overlap(window - self._special_tokens)
        with self._tokenizer_lock:
            enc = self.tokenizer(
                list(texts),
                truncation=True,
                max_length=window,
                stride=stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                return_special_tokens_mask=True,
            )
        owners = [int(o) for o in enc["overflow_to_sample_mapping"]]
        columns, offsets, special = self._padded(enc)
        count = len(owners)
        mask = np.array(columns["attention_mask"], dtype=np.int64).reshape(count, -1)
        positions = [np.flatnonzero(row) for row in mask]
        # consecutive windows of a text share exactly ``stride`` content tokens (the tokenizer's rule)
        content = [0] * rows
        windows = [0] * rows
        for owner, row_special in zip(owners, enc["special_tokens_mask"], strict=True):
            content[owner] += len(row_special) - sum(row_special)
            windows[owner] += 1
        return TaggedBatch(
            tensors={
                k: torch.from_numpy(np.array(v, dtype=np.int64).reshape(count, -1))
                for k, v in columns.items()
                if k in self._forward_args
            },
            rows=rows,
            windows=tuple(owners),
            row_tokens=tuple(
                c - stride * (w - 1) + self._special_tokens for c, w in zip(content, windows, strict=True)
            ),
            texts=list(texts),
            positions=positions,
            offsets=[
                np.array(o, dtype=np.int64).reshape(-1, 2)[p] for o, p in zip(offsets, positions, strict=True)
            ],
            special=[np.array(m, dtype=np.int64)[p] for m, p in zip(special, positions, strict=True)],
            strategies=chosen,
        )

    def _parts_batch(self, windows: Sequence[np.ndarray]) -> TaggedBatch:
        """Windows (int64 token ids each, special tokens included) padded on the right into int64
        tensors [windows, longest window], each window a row of its own (``TaggedBatch.parts``)."""
        longest = max((len(w) for w in windows), default=0)
        ids = np.full((len(windows), longest), int(self.tokenizer.pad_token_id or 0), dtype=np.int64)
        mask = np.zeros((len(windows), longest), dtype=np.int64)
        for i, w in enumerate(windows):
            ids[i, : len(w)] = w
            mask[i, : len(w)] = 1
        columns = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}
        return TaggedBatch(
            tensors={k: torch.from_numpy(v) for k, v in columns.items() if k in self._forward_args},
            rows=len(windows),
            windows=tuple(range(len(windows))),
            texts=[],
            positions=[np.arange(len(w), dtype=np.int64) for w in windows],
            offsets=[],
            special=[],
            strategies=[],
            parts=True,
        )

    def window_parts(
        self, inputs: Mapping[str, np.ndarray], max_rows: int, overflow: str | None = None
    ) -> WindowParts | None:
        """With ``overflow: chunk``, a validated request with a text longer than the window as its
        windows (``tokenize_windows``'s, tokenized here once), in parts of at most ``max_rows`` windows
        and one window's padded tokens (``pack_windows``), for the batcher to queue one after another
        below short requests. A part's ``execute`` answers its windows' logits (``WINDOW_LOGITS``); the
        ``merge`` finds each text's entities from its windows' (``entities``: merged as the pipeline
        merges its ``stride`` chunks) with the request's strategy, and answers ``entities`` and
        ``TOKEN_COUNTS`` as ``execute`` answers the whole request. None when every text fits one
        window, or the request narrowed the policy to refuse: the request runs whole."""
        if self.overflow != "chunk" or overflow == "refuse":
            return None
        texts = _decode_rows("text", inputs["text"])
        window = self.max_sequence_length
        if all(len(t.encode("utf-8")) + self._special_tokens <= window for t in texts):
            return None  # a token covers at least a byte: every text fits
        strategy = self.strategy_of(inputs.get(AGGREGATION_INPUT))
        tagged = self.tokenize_windows(texts, [strategy] * len(texts))
        owners = tagged.windows or ()
        if len(owners) == len(texts):
            return None  # each text is one window
        ids = tagged.tensors["input_ids"].numpy()
        windows = [ids[i, positions] for i, positions in enumerate(tagged.positions)]
        lengths = [len(w) for w in windows]
        ranges = pack_windows(lengths, window, max_rows)
        parts: list[dict[str, np.ndarray]] = []
        for span in ranges:
            column = np.empty(len(span), dtype=object)
            for i, w in enumerate(span):
                column[i] = windows[w]
            parts.append({WINDOWS_INPUT: column})

        def merge(outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
            logits = [row for out in outputs for row in out[WINDOW_LOGITS]]
            if len(logits) != len(windows):
                raise ValueError(f"{len(logits)} windows' logits for {len(windows)} windows")
            grouped: list[list[TokenWindow]] = [[] for _ in texts]
            for i, (owner, row_logits) in enumerate(zip(owners, logits, strict=True)):
                grouped[owner].append(
                    TokenWindow(
                        torch.from_numpy(windows[i]),
                        torch.from_numpy(row_logits),
                        tagged.offsets[i],
                        tagged.special[i],
                    )
                )
            out = np.empty(len(texts), dtype=object)
            for row, row_windows in enumerate(grouped):
                found = self.entities(texts[row], row_windows, strategy)
                out[row] = json.dumps(found, ensure_ascii=False).encode("utf-8")
            return {"entities": out, TOKEN_COUNTS: self.token_counts(tagged)}

        return WindowParts(
            parts=parts,
            rows=[len(span) for span in ranges],
            tokens=[max(lengths[span.start : span.stop]) for span in ranges],
            merge=merge,
        )

    def _encode_unpadded(self, texts: Sequence[str]) -> tuple[dict[str, Any], list[Any], list[Any]]:
        """The tokenizer call's token columns, offsets and special-tokens masks, padded here on the right
        (``_padded``)."""
        with self._tokenizer_lock:
            enc = self.tokenizer(
                list(texts),
                truncation=True,
                max_length=self.truncate_at,
                return_offsets_mapping=True,
                return_special_tokens_mask=True,
            )
        return self._padded(enc)

    def _padded(self, enc: Any) -> tuple[dict[str, Any], list[Any], list[Any]]:
        """A tokenizer call's (unpadded) token columns padded on the right to the longest row, whatever
        the tokenizer's padding side (BERT-like models number positions from the left, so a left-padded
        row would be tagged differently than the pipeline tags it alone), with its offsets and
        special-tokens masks as they are."""
        longest = max((len(ids) for ids in enc["input_ids"]), default=0)
        fill = {
            "input_ids": int(self.tokenizer.pad_token_id or 0),
            "attention_mask": 0,
            "token_type_ids": int(getattr(self.tokenizer, "pad_token_type_id", 0) or 0),
        }
        columns = {
            key: [list(row) + [value] * (longest - len(row)) for row in enc[key]]
            for key, value in fill.items()
            if key in enc
        }
        return columns, list(enc["offset_mapping"]), list(enc["special_tokens_mask"])

    def logits(self, prepared: TokenizedBatch) -> torch.Tensor:
        """Every token's logits: float32 [rows, longest, num_labels], on the CPU (``head_logits``)."""
        return head_logits(self, prepared)

    def entities(self, text: str, windows: Sequence[TokenWindow], strategy: str) -> list[dict[str, Any]]:
        """One row's entities as ``TokenClassificationPipeline.postprocess`` gives them (numbers as
        Python ``float``/``int``): each window's entities found as for a text of its own, and, with
        more than one window (``overflow: chunk``), merged as the pipeline merges its ``stride``
        chunks.

        Args:
            text: the row's text.
            windows: the row's windows in order (one when it is not chunked), offsets into ``text``.
            strategy: one of ``AGGREGATION_STRATEGIES``.
        """
        from transformers.pipelines.token_classification import AggregationStrategy as PipelineStrategy

        found = self._pipeline.postprocess(
            [
                {
                    "logits": w.logits.unsqueeze(0),
                    "sentence": text,
                    "input_ids": w.input_ids.unsqueeze(0),
                    "offset_mapping": torch.from_numpy(w.offsets).unsqueeze(0),
                    "special_tokens_mask": torch.from_numpy(w.special).unsqueeze(0),
                }
                for w in windows
            ],
            aggregation_strategy=PipelineStrategy(strategy),
        )
        return [{k: v.item() if isinstance(v, np.generic) else v for k, v in e.items()} for e in found]

    def tensor_row_logits(self, prepared: TaggedBatch) -> list[torch.Tensor]:
        """Each tensor row's logits at its tokens, padding left out: float32 [its tokens, num_labels]
        per tensor row. Windows (``overflow: chunk``) run at most ``max_batch_size`` at a time, each
        run padded to its own longest window."""
        count = len(prepared.positions)
        step = count if prepared.windows is None else max(1, self.max_batch_size or count)
        out: list[torch.Tensor] = []
        for start in range(0, count, step):
            end = min(count, start + step)
            part: TokenizedBatch = prepared
            if (start, end) != (0, count):
                longest = max(int(p[-1]) + 1 if len(p) else 0 for p in prepared.positions[start:end])
                part = TokenizedBatch(
                    tensors={k: v[start:end, :longest].contiguous() for k, v in prepared.tensors.items()},
                    rows=end - start,
                )
            logits = self.logits(part)
            out.extend(logits[j, torch.from_numpy(prepared.positions[start + j])] for j in range(end - start))
        return out

    def execute(self, prepared: TokenizedBatch) -> dict[str, np.ndarray]:
        """``entities`` object [rows] (UTF-8 JSON arrays, see the class docstring) and ``TOKEN_COUNTS``
        int64 [rows]; for a batch of window parts (``TaggedBatch.parts``) ``WINDOW_LOGITS`` object
        [windows] instead."""
        assert isinstance(prepared, TaggedBatch)
        if prepared.parts:  # window parts: each window's logits, tagged by its request's merge
            by_window = np.empty(prepared.rows, dtype=object)
            for i, row_logits in enumerate(self.tensor_row_logits(prepared)):
                by_window[i] = row_logits.to(torch.float32).numpy()
            return {WINDOW_LOGITS: by_window}
        ids = prepared.tensors["input_ids"]
        owners = range(prepared.rows) if prepared.windows is None else prepared.windows
        grouped: list[list[TokenWindow]] = [[] for _ in range(prepared.rows)]
        for i, (owner, logits) in enumerate(zip(owners, self.tensor_row_logits(prepared), strict=True)):
            keep = torch.from_numpy(prepared.positions[i])
            grouped[owner].append(TokenWindow(ids[i, keep], logits, prepared.offsets[i], prepared.special[i]))
        out = np.empty(prepared.rows, dtype=object)
        for row, windows in enumerate(grouped):
            found = self.entities(prepared.texts[row], windows, prepared.strategies[row])
            out[row] = json.dumps(found, ensure_ascii=False).encode("utf-8")
        return {"entities": out, TOKEN_COUNTS: self.token_counts(prepared)}

    def token_probabilities_of(self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH) -> np.ndarray:
        """Every label's probability (softmax) for each token of many texts, special tokens left out:
        float32 [tokens of all texts, num_labels], texts in input order."""
        rows = []
        for start in range(0, len(texts), batch_size):
            prepared = self.tokenize(texts[start : start + batch_size])
            probs = torch.softmax(self.logits(prepared), dim=-1)
            for i, keep in enumerate(prepared.positions):
                tokens = keep[prepared.special[i] == 0]
                rows.append(probs[i, torch.from_numpy(tokens)])
        return torch.cat(rows).numpy()

    def comparison(self, texts: Sequence[str] | None = None) -> np.ndarray:
        """The scores the quantization is judged on: ``token_probabilities_of`` ``texts`` (None: the
        held-out sentences; label agreement: per token)."""
        return self.token_probabilities_of(heldout_sentences() if texts is None else list(texts))


def _tensor(name: str, datatype: str, shape: list[int]) -> TensorConfig:
    return TensorConfig.model_validate({"name": name, "datatype": datatype, "shape": shape})


def _task_model(
    cfg: RuntimeConfig,
    task: Task,
    path: Path,
    module: Any,
    tokenizer: Any,
    device: torch.device,
    config: dict[str, Any],
) -> TextClassifierModel | TokenClassifierModel | CrossEncoderModel:
    """The served model of ``task`` around a loaded head ``module`` (a transformers ``PreTrainedModel``).
    Raises ``ValueError`` (see ``load_task_model``)."""
    name = cfg.model.name
    if task == "token-classification":
        id2label = {int(k): str(v) for k, v in module.config.id2label.items()}
        return TokenClassifierModel(
            name=name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            labels=[id2label.get(i, f"LABEL_{i}") for i in range(int(module.config.num_labels))],
            default_strategy=cfg.model.aggregation_strategy or DEFAULT_AGGREGATION,
        )
    if task == "reranking":
        if int(module.config.num_labels) != 1:
            raise ValueError(
                f"model.task reranking: {path} has {module.config.num_labels} labels; a cross-encoder "
                "reranker has one (serve it as text-classification)"
            )
        return CrossEncoderModel(
            name=name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            sigmoid=reranker_sigmoid(config),
        )
    id2label = {int(k): str(v) for k, v in module.config.id2label.items()}
    labels = [id2label.get(i, f"LABEL_{i}") for i in range(int(module.config.num_labels))]
    multi = module.config.problem_type == "multi_label_classification" or len(labels) == 1
    return TextClassifierModel(
        name=name,
        module=module,
        tokenizer=tokenizer,
        device=device,
        cfg=cfg,
        labels=labels,
        multi_label=multi,
    )


def _compared(task: Task, texts: Sequence[str] | None) -> tuple[int, str]:
    """How many texts a task model's deviation is measured on, and which: a reranker's held-out pairs
    (queries x candidates, whatever ``texts``), else ``texts`` or the held-out sentences (a tagger's
    figures count tokens, but it is texts that were sent)."""
    if task == "reranking":
        return len(rerank_heldout()[0]), HELDOUT_PAIRS
    return (len(texts), GATE_TEXTS) if texts else (len(heldout_sentences()), HELDOUT_SENTENCES)


def load_task_model(cfg: RuntimeConfig, task: Task) -> TextModel:
    """Load the classifier, token classifier or reranker ``cfg.model`` names (``task``), quantize it,
    compare it with fp32.

    Args:
        cfg: the runtime configuration (``model``, ``quantization``, ``limits``, ``device``).
        task: ``text-classification``, ``token-classification`` or ``reranking``.

    Raises:
        FileNotFoundError: no model directory / calibration file.
        ValueError: a task the directory's model cannot serve (no sequence- or token-classification
            head, a reranker with more than one label, an unsupported activation, a token classifier
            without a fast tokenizer), ``model.aggregation_strategy`` for another task, engine
            onnxruntime off the CPU or with an fp32 export that deviates from the torch model
            (``hf_onnx.check_scores_export``), ``device: cuda`` without CUDA.
        QuantizationError (a ValueError): the quantization cannot be applied.
    """
    import os

    import transformers

    started = time.perf_counter()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if cfg.model.aggregation_strategy is not None and task != "token-classification":
        raise ValueError(f"model.aggregation_strategy applies to token-classification, not {task}")
    device = resolve_device(cfg.device)
    check_supported(cfg.quantization.mode, device, cfg.quantization.skip_modules)
    engine = cfg.model.engine or "torch"
    if engine == "onnxruntime":
        _check_onnxruntime(cfg.quantization, device)
    configure_torch(device)
    path = model_dir(cfg.model.source)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    config = read_model_config(path)
    architectures = [str(a) for a in config.get("architectures") or []]
    head, kind, auto = (
        ("TokenClassification", "a token classifier", transformers.AutoModelForTokenClassification)
        if task == "token-classification"
        else (
            "SequenceClassification",
            "a classifier or a reranker",
            transformers.AutoModelForSequenceClassification,
        )
    )
    if not any(a.endswith(f"For{head}") for a in architectures):
        # transformers would put a randomly initialised head on it and serve noise
        what = "token" if task == "token-classification" else "sequence"
        raise ValueError(
            f"model.task {task}: {path} has no {what}-classification head (config.json architectures: "
            f"{architectures or 'none'}); {kind} is a *For{head} model"
        )
    module = auto.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    module = module.eval().to(device)
    model = _task_model(cfg, task, path, module, tokenizer, device, config)
    qcfg = cfg.quantization
    compare_seconds = 0.0
    reference = None
    texts = gate_texts(qcfg)  # the user's texts, or None: the held-out sentences
    if qcfg.mode != "none" or engine == "onnxruntime":  # compared with the torch fp32 model
        t0 = time.perf_counter()
        reference = model.comparison(texts)
        compare_seconds += time.perf_counter() - t0
    if engine == "onnxruntime":  # the fp32 head is exported; the engine quantizes its graph
        from kubeinfer.runtime.models.hf_onnx import (
            SEQUENCE_LOGITS,
            TOKEN_LOGITS,
            check_scores_export,
            use_onnxruntime,
        )

        graph = TOKEN_LOGITS if task == "token-classification" else SEQUENCE_LOGITS
        use_onnxruntime(model, path, qcfg.mode, graph, calibration_texts(qcfg))
    else:
        model.module = _quantized(model, qcfg, device)
    agreement, deviation_mean, deviation_max = 1.0, 0.0, 0.0
    if reference is not None:
        t0 = time.perf_counter()
        agreement, deviation_mean, deviation_max = compare_scores(reference, model.comparison(texts))
        compare_seconds += time.perf_counter() - t0
    judge(model, qcfg, {"agreement": agreement}, *_compared(task, texts), measured=reference is not None)
    if engine == "onnxruntime" and qcfg.mode == "none":
        check_scores_export(path, task, agreement, deviation_max)
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
        "loaded %s (%s, %s) from %s on %s (engine %s), quantization %s: %s agreement %.4f, score deviation "
        "mean %.4f max %.4f (comparison %.2f s), load %.2f s",
        cfg.model.name, task, type(model).__name__, path, device, engine, qcfg.mode,
        AGREEMENT_OF.get(task, "label"), agreement, deviation_mean, deviation_max,
        compare_seconds, model._report[REPORT_LOAD_SECONDS],
    )  # fmt: skip
    return model
