"""MiniLM as an MLServer model: the runtime class ``make bench-peers`` serves the peer with.

MLServer has no sentence-embedding runtime of its own (``mlserver-huggingface`` returns per-token
hidden states for ``feature-extraction``), so a user serving MiniLM on MLServer writes this class: a
``MLModel`` whose ``predict`` takes a BYTES tensor ``text`` [N] and returns FP32 ``embedding``
[N, 384], computed as kubeinfer's torch engine and sentence-transformers compute it: the tokenizer
(padding to the longest row, truncation at 256 tokens, the model's ``max_seq_length``), the encoder,
the mean of the non-padding tokens' last hidden states, L2-normalized.

MLServer's adaptive batching (``max_batch_size`` and ``max_batch_time`` in model-settings.json)
concatenates the ``text`` rows of concurrent requests into one ``predict`` call and splits the
``embedding`` rows back; this class sees only the batch. It runs in MLServer's own venv
(``.cache/peer-mlserver``), never imported by kubeinfer. ``parameters.uri`` of model-settings.json is
the model directory (bench/peers_bench.py writes it).
"""

from __future__ import annotations

from typing import Any

import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from transformers import AutoModel, AutoTokenizer

#: Tokens per text at most (all-MiniLM-L6-v2's sentence_bert_config.json ``max_seq_length``).
MAX_SEQUENCE_LENGTH = 256


class MiniLM(MLModel):  # type: ignore[misc]
    """all-MiniLM-L6-v2 sentence embeddings: ``text`` BYTES [N] -> ``embedding`` FP32 [N, 384]."""

    async def load(self) -> bool:
        """Load the tokenizer and the encoder from ``parameters.uri`` (a local directory), eval mode."""
        path = self.settings.parameters.uri
        self._tokenizer: Any = AutoTokenizer.from_pretrained(path)
        self._model: Any = AutoModel.from_pretrained(path).eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Embed each row of the request's one input (``text``, BYTES [N]); raises ``ValueError``
        when the request has no input named ``text``."""
        named = {i.name: i for i in payload.inputs}
        if "text" not in named:
            raise ValueError(f"input 'text' is required (got {sorted(named)})")
        texts = [
            t.decode() if isinstance(t, bytes) else str(t) for t in StringCodec.decode_input(named["text"])
        ]
        batch = self._tokenizer(
            texts, padding="longest", truncation=True, max_length=MAX_SEQUENCE_LENGTH, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            embedding = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("embedding", embedding.numpy())],
        )
