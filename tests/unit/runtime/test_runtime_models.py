"""Runtime models: input validation, padding to the longest row in the batch, loaders (tiny models)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.models import InputError, load_model
from kubeinfer.runtime.models.base import QuantizationError, batch_buckets, shape_matches, tensor_nbytes
from kubeinfer.runtime.models.device import (
    THREADS_ENV,
    available_cpus,
    configure_torch,
    default_threads,
    pick_device,
    resolve_device,
    resolve_engine_device,
)
from kubeinfer.runtime.models.huggingface import TextEmbeddingModel, heldout_pairs, heldout_sentences
from kubeinfer.runtime.models.torchscript import TorchScriptModel

from hack.devtools.runtime_tiny import TORCHSCRIPT_IO, tiny_hf_config, tiny_hf_dir, tiny_torchscript


def texts(*items: bytes | str) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> TextEmbeddingModel:
    cfg = tiny_hf_config(
        tiny_dir,
        limits={"max_request_elements": 6, "max_request_bytes": 400, "max_text_tokens": 20},
    )
    model = load_model(cfg)
    assert isinstance(model, TextEmbeddingModel)
    return model


# --- validation ------------------------------------------------------------------------------


def test_validate_returns_rows(tiny: TextEmbeddingModel) -> None:
    assert tiny.validate({"text": texts(b"hello world", b"second row")}) == 2


@pytest.mark.parametrize(
    ("inputs", "tensor", "status", "words"),
    [
        ({}, "text", 400, ["missing", "BYTES"]),
        ({"text": texts(b"a"), "extra": texts(b"b")}, "extra", 400, ["unexpected", "'text'"]),
        ({"text": np.zeros(2, dtype=np.float32)}, "text", 400, ["expected datatype BYTES", "got FP32"]),
        ({"text": texts(b"a", b"b").reshape(1, 2)}, "text", 400, ["expected shape [-1]", "[1, 2]"]),
        ({"text": texts()}, "text", 400, ["at least one row"]),
        ({"text": texts(*[b"x"] * 7)}, "text", 413, ["7 elements", "limit of 6"]),
        ({"text": texts(b"y" * 300, b"y" * 200)}, "text", 413, ["500 bytes", "limit of 400"]),
        ({"text": texts(b"fine", b"\xff\xfe bad")}, "text", 400, ["row 1", "UTF-8"]),
        ({"text": texts(b"ok", " ".join(["word"] * 30).encode())}, "text", 413, ["row 1", "32 tokens", "20"]),
        ({"text": np.array([1, 2], dtype=object)}, "text", 400, ["row 0", "int"]),
    ],
    ids=[
        "missing",
        "extra",
        "datatype",
        "shape",
        "empty",
        "elements",
        "bytes",
        "utf8",
        "tokens",
        "not-bytes",
    ],
)
def test_validate_rejects_naming_the_tensor(
    tiny: TextEmbeddingModel, inputs: dict[str, np.ndarray], tensor: str, status: int, words: list[str]
) -> None:
    with pytest.raises(InputError) as info:
        tiny.validate(inputs)
    assert info.value.tensor == tensor
    assert info.value.status == status
    message = str(info.value)
    assert f"'{tensor}'" in message
    for word in words:
        assert word in message


def test_a_batch_only_input_sent_as_its_configured_dims_is_taken_as_rows(tiny: TextEmbeddingModel) -> None:
    """The model configuration gives ``text`` (shape [-1]) Triton's ``dims: [1]`` with ``reshape:
    {shape: []}``, so Triton's clients (perf_analyzer) send [rows, 1]: taken as [rows]. Other shapes
    are left for ``validate`` to refuse."""
    column = tiny.with_config_shapes({"text": texts(b"hello world", b"second row").reshape(2, 1)})
    assert column["text"].shape == (2,)
    assert list(column["text"]) == [b"hello world", b"second row"]
    assert tiny.validate(column) == 2
    plain = {"text": texts(b"a", b"b")}
    assert tiny.with_config_shapes(plain) is plain
    wide = tiny.with_config_shapes({"text": texts(b"a", b"b").reshape(1, 2)})
    with pytest.raises(InputError, match=r"expected shape \[-1\]"):
        tiny.validate(wide)


def test_token_limit_is_the_smaller_of_limit_and_model_length(tiny_dir: Path) -> None:
    cfg = tiny_hf_config(tiny_dir, model={"name": "t", "source": str(tiny_dir), "max_sequence_length": 16})
    model = load_model(cfg)
    assert isinstance(model, TextEmbeddingModel)
    assert model.token_limit == 16
    model.validate({"text": texts(" ".join(["word"] * 14))})  # 14 + [CLS] + [SEP] = 16 tokens
    with pytest.raises(InputError, match="17 tokens"):
        model.validate({"text": texts(" ".join(["word"] * 15))})


def test_input_error_status_is_400_or_413() -> None:
    with pytest.raises(ValueError, match="400 or 413"):
        InputError("x", tensor="t", status=500)


def test_helpers() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert batch_buckets(24) == [1, 2, 4, 8, 16, 24]
    with pytest.raises(ValueError):
        batch_buckets(0)
    assert shape_matches([-1, 3], (5, 3))
    assert not shape_matches([-1, 3], (5, 4))
    assert not shape_matches([-1], (5, 1))
    assert tensor_nbytes(texts(b"abc", b"de")) == 5
    assert tensor_nbytes(np.zeros((2, 3), dtype=np.float32)) == 24


# --- preprocessing and execution ---------------------------------------------------------------


def test_padding_is_to_the_longest_row_in_this_batch(tiny: TextEmbeddingModel) -> None:
    short = {"text": texts(b"a cat")}
    long = {"text": texts(b"one two three four five six seven eight")}
    alone = tiny.preprocess([short])
    both = tiny.preprocess([short, long])
    assert alone.sequence_length == 4  # [CLS] a cat [SEP]
    assert both.sequence_length == 10  # 8 words + 2 special tokens, not max_sequence_length
    assert both.rows == 2
    assert both.tensors["attention_mask"][0].sum().item() == 4


def test_batch_tokenization_matches_the_hugging_face_call(tiny_dir: Path) -> None:
    """The one-call ``encode_batch`` path gives the tensors of ``tokenizer(texts, padding="longest",
    truncation=True, max_length=...)``: truncation, padding, special tokens, non-ASCII, empty text."""
    cfg = tiny_hf_config(tiny_dir, model={"name": "t", "source": str(tiny_dir), "max_sequence_length": 16})
    model = load_model(cfg)
    assert isinstance(model, TextEmbeddingModel) and model._batch_encoder is not None
    texts = ["A man is playing a guitar.", "", "héllo wörld ✓ 日本語", "word " * 40, "short"]
    fast = model.tokenize(texts)
    expected = model.tokenizer(texts, padding="longest", truncation=True, max_length=16, return_tensors="pt")
    assert set(fast.tensors) == {"input_ids", "attention_mask", "token_type_ids"}
    for name, tensor in fast.tensors.items():
        assert tensor.dtype == torch.int64
        assert torch.equal(tensor, expected[name]), name
    assert fast.sequence_length == 16  # the long row is truncated, the others padded to it
    single = model.tokenize(["short"])
    alone = model.tokenizer(["short"], return_tensors="pt")["input_ids"]
    assert torch.equal(single.tensors["input_ids"], alone)


def test_execute_rows_in_order_unit_norm_and_padding_invariant(tiny: TextEmbeddingModel) -> None:
    a = {"text": texts(b"a cat sat", b"on the mat today")}
    b = {"text": texts(b"one two three four five six seven eight nine")}
    together = tiny.execute(tiny.preprocess([a, b]))["embedding"]
    assert together.shape == (3, 32)
    assert together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-5)
    separately = np.concatenate([tiny.execute(tiny.preprocess([r]))["embedding"] for r in (a, b)])
    np.testing.assert_allclose(together, separately, atol=1e-5)


def test_warmup_covers_buckets_and_sets_max_batch_size(tiny: TextEmbeddingModel) -> None:
    assert tiny.sequence_buckets() == [16, 20]
    seconds = tiny.warmup(max_batch_size=3, steps=2)
    assert seconds > 0
    assert tiny.max_batch_size == 3
    assert tiny.report()["warmup_seconds"] == seconds


def test_loader_reports_and_examples(tiny: TextEmbeddingModel) -> None:
    report = tiny.report()
    assert report["quantization_cosine_mean_ratio"] == 1.0  # quantization none
    assert report["model_load_seconds"] > 0
    example = tiny.example_inputs(5)
    assert tiny.validate(example) == 5
    assert tiny.device == "cpu"
    assert [(s.name, s.datatype, s.shape) for s in tiny.outputs] == [("embedding", "FP32", [-1, 32])]


def test_heldout_set_is_200_pairs_half_paraphrases() -> None:
    pairs = heldout_pairs()
    assert len(pairs) == 200
    assert sum(p for _, _, p in pairs) == 100
    assert len(heldout_sentences()) > 300


def test_missing_model_dir_is_named(tmp_path: Path) -> None:
    cfg = tiny_hf_config(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        load_model(cfg)


# --- TorchScript ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ts_cfg(tmp_path_factory: pytest.TempPathFactory) -> RuntimeConfig:
    path = tiny_torchscript(tmp_path_factory.mktemp("ts") / "m.pt")
    return RuntimeConfig.model_validate(
        {
            "model": {"name": "ts", "source": str(path), "format": "torchscript", **TORCHSCRIPT_IO},
            "device": "cpu",
        }
    )


def test_torchscript_serves_declared_io(ts_cfg: RuntimeConfig) -> None:
    model = load_model(ts_cfg)
    assert isinstance(model, TorchScriptModel)
    r1 = {"x": np.ones((2, 3), dtype=np.float32), "k": np.array([0, 1], dtype=np.int64)}
    r2 = {"x": np.zeros((1, 3), dtype=np.float32), "k": np.array([5], dtype=np.int64)}
    assert model.validate(r1) == 2
    out = model.execute(model.preprocess([r1, r2]))
    assert out["y"].shape == (3, 4) and out["y"].dtype == np.float32
    assert out["top"].dtype == np.int64
    np.testing.assert_allclose(out["y"][1] - out["y"][0], 1.0, rtol=1e-5)  # k offsets row 1 by one
    np.testing.assert_allclose(out["y"][2], model.execute(model.preprocess([r2]))["y"][0])
    assert model.warmup(4, 1) > 0 and model.max_batch_size == 4
    with pytest.raises(InputError, match=r"'k'.*INT64"):
        model.validate({"x": r1["x"], "k": np.array([0.0, 1.0], dtype=np.float32)})
    with pytest.raises(InputError, match=r"'x'.*\[-1, 3\]"):
        model.validate({"x": np.ones((2, 4), dtype=np.float32), "k": r1["k"]})
    with pytest.raises(InputError, match="'k' has 1 rows"):
        model.validate({"x": r1["x"], "k": np.array([1], dtype=np.int64)})


def test_torchscript_warmup_dims_the_module_cannot_take_are_refused_naming_warmup_dims(
    ts_cfg: RuntimeConfig,
) -> None:
    inputs = [{**t, "shape": [-1, -1]} if t["name"] == "x" else t for t in TORCHSCRIPT_IO["inputs"]]
    data = ts_cfg.model_dump()
    data["model"]["inputs"] = inputs
    data["warmup"] = {"dims": [3, 5]}  # x is [n, 3] inside the module: 5 does not fit its Linear
    model = load_model(RuntimeConfig.model_validate(data))
    with pytest.raises(ValueError, match=r"warmup\.dims size 5: .*'x' \[1, 5\]"):
        model.warmup(2, 1)


def test_torchscript_batch_key_separates_shapes(ts_cfg: RuntimeConfig) -> None:
    model = load_model(ts_cfg)
    a = {"x": np.ones((2, 3), dtype=np.float32), "k": np.zeros(2, dtype=np.int64)}
    b = {"x": np.ones((5, 3), dtype=np.float32), "k": np.zeros(5, dtype=np.int64)}
    assert model.batch_key(a) == model.batch_key(b)
    odd = {
        "x": np.ones((2, 5), dtype=np.float32),
        "k": np.zeros(2, dtype=np.int64),
    }  # not valid: x is [-1, 3]
    assert model.batch_key(odd) != model.batch_key(a)
    with pytest.raises(ValueError, match="differ in shape"):
        model.preprocess([a, odd])


def test_torchscript_bf16_is_compared_and_int8_rejected(ts_cfg: RuntimeConfig) -> None:
    bf16 = load_model(
        ts_cfg.model_copy(update={"quantization": ts_cfg.quantization.model_copy(update={"mode": "bf16"})})
    )
    assert bf16.report()["quantization_cosine_mean_ratio"] > 0.99
    out = bf16.execute(bf16.preprocess([bf16.example_inputs(3)]))
    assert out["y"].dtype == np.float32
    int8 = ts_cfg.model_copy(
        update={"quantization": ts_cfg.quantization.model_copy(update={"mode": "int8-dynamic"})}
    )
    with pytest.raises(QuantizationError, match="TorchScript"):
        load_model(int8)


# --- device -----------------------------------------------------------------------------------------


def test_pick_device_asks_for_cuda_only_when_a_gpu_may_be_used() -> None:
    def never() -> bool:
        raise AssertionError("asked for CUDA with device cpu")

    assert pick_device("cpu", never) == "cpu"
    assert pick_device("auto", lambda: True) == pick_device("cuda", lambda: True) == "cuda:0"
    assert pick_device("auto", lambda: False) == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        pick_device("cuda", lambda: False)
    # torch's view and the driver's agree on this machine (resolve_device, resolve_engine_device)
    assert resolve_engine_device("auto") == str(resolve_device("auto"))


def test_device_resolution_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert str(resolve_device("cpu")) == "cpu"
    if not torch.cuda.is_available():
        assert str(resolve_device("auto")) == "cpu"
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
    monkeypatch.setenv(THREADS_ENV, "zero")
    with pytest.raises(ValueError, match=THREADS_ENV):
        configure_torch(torch.device("cpu"))
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(THREADS_ENV, "1")
        assert configure_torch(torch.device("cpu")) == 1
        monkeypatch.delenv(THREADS_ENV)
        assert configure_torch(torch.device("cpu")) == default_threads() == max(1, available_cpus() - 1)
    finally:
        torch.set_num_threads(before)


def test_available_cpus_are_the_least_of_the_counts_that_bound_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # loky's count: the machine, the affinity mask and the cgroup's CPU quota; its variable lowers it
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert available_cpus() == 1 and default_threads() == 1
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "two")  # a pod's spec.runtime.env: refused by name
    with pytest.raises(ValueError, match="LOKY_MAX_CPU_COUNT must be an integer, got 'two'"):
        available_cpus()
