"""MiniLM on ONNX Runtime as a peer server's user runs it: kubeinfer's own int8 graph, the same tokenizer.

The runtime classes of the peers that serve kubeinfer's graph (``mlserver_onnx.py`` for MLServer,
``litserve_onnx.py`` for LitServe) share this: what a user writes around an exported sentence embedder.
The graph is the file kubeinfer's ``onnxruntime`` engine serves (its graph cache: the encoder with mean
pooling and L2 normalization exported by ``torch.onnx.export``, MatMuls quantized int8-dynamic), with
the inputs ``input_ids``, ``attention_mask`` and ``token_type_ids`` (those it takes) and the output
``embedding`` float32 [rows, 384]. The tokenizer is the model directory's (transformers' fast tokenizer),
padding to the longest row, truncation at 256 tokens (the model's ``max_seq_length``), as kubeinfer's.
The session has kubeinfer's options (``runtime/models/onnx.py``' ``session_options``): every graph
optimization, sequential execution, ``threads`` intra-op threads and one inter-op thread.

It runs in a peer's venv (``.cache/peer-mlserver``, ``.cache/peer-litserve``), never imported by
kubeinfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer

#: Tokens per text at most (all-MiniLM-L6-v2's sentence_bert_config.json ``max_seq_length``).
MAX_SEQUENCE_LENGTH = 256
#: The graph's output.
OUTPUT = "embedding"


class OnnxMiniLM:
    """all-MiniLM-L6-v2 on an ONNX Runtime session: ``embed(texts)`` -> float32 [len(texts), 384]."""

    def __init__(self, graph: str, tokenizer_dir: str, threads: int) -> None:
        """Load the tokenizer of ``tokenizer_dir`` (a local model directory) and the graph file ``graph``
        in a CPU session with ``threads`` intra-op threads; ``ValueError`` when ``threads`` < 1."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.tokenizer: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.session = ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The embeddings of ``texts`` (one batch, padded to its longest row): float32 [rows, 384],
        unit L2 norm per row."""
        batch = self.tokenizer(
            list(texts),
            padding="longest",
            truncation=True,
            max_length=MAX_SEQUENCE_LENGTH,
            return_tensors="np",
        )
        feeds = {name: np.asarray(batch[name], dtype=np.int64) for name in self.inputs}
        return np.asarray(self.session.run([OUTPUT], feeds)[0], dtype=np.float32)
