"""A fake ``ServableModel`` for the batcher and server unit tests (no torch).

Input ``x`` FP32 [-1, 2]; outputs ``y`` = 2 * x (FP32 [-1, 2]) and ``n`` = the batch's row count
(INT64 [-1]), so a test sees which rows ran together. A row whose first value is -1 makes
``execute`` raise (a "poisoned" request); -2 makes ``preprocess`` raise an ``InputError`` (413).
``gate`` (a threading.Event), when set up, blocks ``execute`` until released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime.config import LimitsConfig, TensorConfig
from kubeinfer.runtime.models.base import TOKEN_COUNTS, InputError, ServableModel


class FakeModel(ServableModel):
    def __init__(self, max_batch_size: int = 64, delay: float = 0.0, name: str = "fake") -> None:
        self.name = name
        self.inputs = [TensorConfig(name="x", datatype="FP32", shape=[-1, 2])]
        self.outputs = [
            TensorConfig(name="y", datatype="FP32", shape=[-1, 2]),
            TensorConfig(name="n", datatype="INT64", shape=[-1]),
        ]
        self.device = "cpu"
        self.max_batch_size = max_batch_size
        self.limits = LimitsConfig(max_request_elements=10_000)
        self.delay = delay
        self.gate: threading.Event | None = None
        self.batches: list[int] = []  # rows of every execute call
        self.firsts: list[list[float]] = []  # first values of the rows of every execute call
        self.prepared = 0  # preprocess calls
        self.started = threading.Event()
        self.lock = threading.Lock()

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> Any:
        x = np.concatenate([b["x"] for b in batch])
        with self.lock:
            self.prepared += 1
        if (x[:, 0] == -2).any():
            raise InputError("input tensor 'x': value -2 is refused by preprocess", tensor="x", status=413)
        return x

    def execute(self, prepared: Any) -> dict[str, np.ndarray]:
        x: np.ndarray = prepared
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.batches.append(len(x))
            self.firsts.append([float(v) for v in x[:, 0]])
        if (x[:, 0] == -1).any():
            raise ValueError("poisoned row")
        return {"y": x * 2, "n": np.full(len(x), len(x), dtype=np.int64)}

    def warmup(self, max_batch_size: int, steps: int) -> float:
        self.max_batch_size = max_batch_size
        return 0.0

    def report(self) -> dict[str, float]:
        return {"model_load_seconds": 0.5, "warmup_seconds": 0.25}

    def example_inputs(self, rows: int) -> dict[str, np.ndarray]:
        return {"x": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)}


def rows(*values: float) -> dict[str, np.ndarray]:
    """A request whose rows have first values ``values`` (second value 0)."""
    return {"x": np.array([[v, 0.0] for v in values], dtype=np.float32)}


class KeyedFakeModel(FakeModel):
    """A ``FakeModel`` whose requests batch together only if their rows share the second value of
    ``x`` (its batch key, as a TorchScript model keys on shapes); ``preprocess`` raises ``ValueError``
    for a batch that mixes keys, as ``TorchScriptModel.preprocess`` does for mixed shapes."""

    def __init__(self, max_batch_size: int = 64, delay: float = 0.0) -> None:
        super().__init__(max_batch_size, delay, name="keyed")
        self.mixed = 0  # preprocess calls that got mixed keys

    def batch_key(self, inputs: Mapping[str, np.ndarray]) -> Any:
        return float(inputs["x"][0, 1])

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> Any:
        keys = {float(v) for b in batch for v in b["x"][:, 1]}
        if len(keys) > 1:
            with self.lock:
                self.mixed += 1
            raise ValueError(f"input tensor 'x': requests in one batch differ in key {sorted(keys)}")
        return super().preprocess(batch)


def keyed(key: float, *values: float) -> dict[str, np.ndarray]:
    """A request whose rows have first values ``values`` and second value (batch key) ``key``."""
    return {"x": np.array([[v, key] for v in values], dtype=np.float32)}


class FakeEmbedder(FakeModel):
    """A text embedder as the OpenAI routes see one: input ``text`` BYTES [-1], output ``embedding`` FP32
    [-1, 2] = (the text's length in bytes, its row's position in its batch), and the per-row token
    counts (one token a byte). A text ``poison`` makes ``execute`` raise."""

    def __init__(self, max_batch_size: int = 64, name: str = "fake") -> None:
        super().__init__(max_batch_size, name=name)
        self.inputs = [TensorConfig(name="text", datatype="BYTES", shape=[-1])]
        self.outputs = [TensorConfig(name="embedding", datatype="FP32", shape=[-1, 2])]
        self.texts: list[list[bytes]] = []  # the texts of every execute call

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> Any:
        with self.lock:
            self.prepared += 1
        return [t for b in batch for t in b["text"]]

    def execute(self, prepared: Any) -> dict[str, np.ndarray]:
        texts: list[bytes] = prepared
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.batches.append(len(texts))
            self.texts.append(list(texts))
        if b"poison" in texts:
            raise ValueError("poisoned text")
        lengths = np.array([len(t) for t in texts], dtype=np.float32)
        embedding = np.stack([lengths, np.arange(len(texts), dtype=np.float32)], axis=1)
        return {"embedding": embedding, TOKEN_COUNTS: lengths.astype(np.int64)}

    def example_inputs(self, rows: int) -> dict[str, np.ndarray]:
        return {"text": np.array([b"x"] * rows, dtype=object)}


def texts(*items: str) -> np.ndarray:
    """A BYTES tensor [rows] of ``items`` encoded as UTF-8 (an object array of ``bytes``)."""
    array = np.empty(len(items), dtype=object)
    array[:] = [t.encode("utf-8") for t in items]
    return array
