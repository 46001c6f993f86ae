"""A text longer than the model's window (``model.overflow``): refused with a 413 naming the tensor and
the row (the default), or truncated as transformers truncates (``truncate``; a reranker's pair keeps
its query whole and truncates the text), counted in ``kubeinfer_truncated_rows_total``, or, for an
embedder, split into overlapping windows whose embeddings are pooled (``chunk``). Tiny seeded models,
compared with transformers' own tokenizer and model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import torch
import transformers
from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import InputError, load_model
from kubeinfer.runtime.models.base import TOKEN_COUNTS
from kubeinfer.runtime.models.huggingface import TextModel

from hack.devtools.runtime_tiny import (
    tiny_hf_config,
    tiny_hf_cross_encoder,
    tiny_hf_dir,
    tiny_hf_token_classifier,
)
from tests.unit.runtime.runtime_fakes import texts

pytestmark = pytest.mark.timeout(120)

WINDOW = 32
LONG = " ".join(f"word{i} and more" for i in range(60))  # about 240 tokens
SHORT = "a short sentence"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("overflow")
    return {
        "embedder": tiny_hf_dir(root / "embedder"),
        "reranker": tiny_hf_cross_encoder(root / "reranker"),
        "tagger": tiny_hf_token_classifier(root / "tagger"),
    }


def load(path: Path, overflow: str | None) -> TextModel:
    model: dict[str, Any] = {"name": "tiny", "source": str(path), "max_sequence_length": WINDOW}
    if overflow is not None:
        model["overflow"] = overflow
    loaded = load_model(tiny_hf_config(path, model=model))
    assert isinstance(loaded, TextModel)
    return loaded


@pytest.mark.parametrize("overflow", [None, "refuse"])
def test_a_text_over_the_window_is_refused_by_default(dirs: dict[str, Path], overflow: str | None) -> None:
    model = load(dirs["embedder"], overflow)
    with pytest.raises(
        InputError, match=r"input tensor 'text': row 1 has \d+ tokens, over the limit of 32"
    ) as e:
        model.validate({"text": texts(SHORT, LONG)})
    assert e.value.status == 413 and model.truncated_rows == 0


def test_truncate_embeds_what_transformers_truncation_gives(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "truncate")
    inputs = {"text": texts(SHORT, LONG, LONG[:50])}
    assert model.validate(inputs) == 3 and model.truncated_rows == 1
    got = model.execute(model.preprocess([inputs]))["embedding"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(dirs["embedder"])
    bert = transformers.AutoModel.from_pretrained(dirs["embedder"]).eval()
    enc = tokenizer(
        [SHORT, LONG, LONG[:50]], padding=True, truncation=True, max_length=WINDOW, return_tensors="pt"
    )
    assert enc["input_ids"].shape[1] == WINDOW
    with torch.inference_mode():
        hidden = bert(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_truncate_keeps_a_pairs_query_whole_and_cuts_the_text(dirs: dict[str, Path]) -> None:
    model = load(dirs["reranker"], "truncate")
    query = "how do i bake bread at home"  # the uncased tokenizer decodes lower case
    inputs = {"query": texts(query, query), "text": texts(LONG, SHORT)}
    assert model.validate(inputs) == 2 and model.truncated_rows == 1
    prepared = model.preprocess([inputs])
    tokenizer = transformers.AutoTokenizer.from_pretrained(dirs["reranker"])
    enc = tokenizer(
        [query, query],
        [LONG, SHORT],
        padding=True,
        truncation="only_second",
        max_length=WINDOW,
        return_tensors="pt",
    )
    assert torch.equal(prepared.tensors["input_ids"], enc["input_ids"])
    # the query's tokens are all there
    assert tokenizer.decode(enc["input_ids"][0]).startswith(f"[CLS] {query} [SEP]")


def test_truncate_refuses_a_query_that_leaves_no_room(dirs: dict[str, Path]) -> None:
    model = load(dirs["reranker"], "truncate")
    with pytest.raises(InputError, match=r"input tensor 'query': row 0 .*kept whole") as e:
        model.validate({"query": texts(LONG), "text": texts(SHORT)})
    assert e.value.status == 413


def test_truncate_tags_the_window_with_offsets_into_the_text(dirs: dict[str, Path]) -> None:
    model = load(dirs["tagger"], "truncate")
    inputs = {"text": texts(LONG)}
    model.validate(inputs)
    prepared = model.preprocess([inputs])
    assert prepared.tensors["input_ids"].shape[1] == WINDOW
    assert prepared.offsets[0].max() < len(LONG)  # character offsets into the original text


def test_overflow_is_for_huggingface_text_models() -> None:
    with pytest.raises(
        pydantic.ValidationError, match=r"model\.overflow applies to huggingface text models only"
    ):
        RuntimeConfig.model_validate(
            {"model": {"format": "onnx", "source": "/m/model.onnx", "overflow": "truncate"}}
        )


async def test_the_batcher_counts_truncated_rows(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "truncate")
    model.warmup(4, 1)
    metrics = RuntimeMetrics(model.name)
    batcher = Batcher(model, BatchSettings(max_batch_size=4, max_queue_delay_seconds=0.0), metrics=metrics)
    batcher.start()
    try:
        await batcher.infer({"text": texts(LONG, SHORT, LONG)})
        await batcher.infer({"text": texts(SHORT)})
    finally:
        await batcher.drain(5)
    assert 'kubeinfer_truncated_rows_total{model="tiny"} 2.0' in metrics.exposition().decode()


def test_the_model_configuration_states_the_window_and_the_policy(dirs: dict[str, Path]) -> None:
    from google.protobuf import json_format
    from kubeinfer.runtime.dataplane import model_metadata_doc
    from kubeinfer.runtime.model_config import model_config_doc
    from tritonclient.grpc import model_config_pb2

    model = load(dirs["embedder"], "truncate")
    doc = model_config_doc(
        model_metadata_doc(model), BatchSettings(max_batch_size=4), parameters=model.parameters()
    )
    assert doc["parameters"] == {
        "max_text_tokens": {"string_value": str(WINDOW)},
        "max_sequence_length": {"string_value": str(WINDOW)},
        "overflow": {"string_value": "truncate"},
    }
    json_format.ParseDict(doc, model_config_pb2.ModelConfig())  # Triton's own schema takes it


def _embed_with_transformers(path: Path, windows: list[list[int]]) -> np.ndarray:
    """Each window of token ids (special tokens included) through transformers' own model, mean-pooled
    and normalised as a sentence embedding: float32 [windows, dim]."""
    bert = transformers.AutoModel.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for ids in windows:
            hidden = bert(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))
            ).last_hidden_state
            out.append(torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0].numpy())
    return np.stack(out)


def test_chunk_pools_the_windows_transformers_embeds(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "chunk")  # window 32, max_text_tokens 512
    long_text = LONG * 2  # about 480 tokens: windows of 30 content tokens, 3 shared with the next
    inputs = {"text": texts(SHORT, long_text)}
    assert model.validate(inputs) == 2 and model.chunked_rows == 1
    got = model.execute(model.preprocess([inputs]))
    tokenizer = transformers.AutoTokenizer.from_pretrained(dirs["embedder"])
    expected = []
    for text in (SHORT, long_text):
        content = tokenizer(text, add_special_tokens=False)["input_ids"]
        body, step = WINDOW - 2, (WINDOW - 2) - int((WINDOW - 2) * 0.125)
        starts = range(0, max(1, len(content) - body + step), step)
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        windows = [[cls, *content[s : s + body], sep] for s in starts]
        assert windows[-1][-2] == content[-1]  # the last window reaches the text's end
        vectors = _embed_with_transformers(dirs["embedder"], windows)
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        pooled = (vectors * weights[:, None]).sum(0)
        expected.append(pooled / np.linalg.norm(pooled))
        if text is long_text:
            assert len(windows) > 10
    np.testing.assert_allclose(got["embedding"], np.stack(expected), atol=1e-5)
    assert got[TOKEN_COUNTS].tolist() == [len(tokenizer(t)["input_ids"]) for t in (SHORT, long_text)]


def test_chunk_refuses_a_text_over_max_text_tokens(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "chunk")
    with pytest.raises(InputError, match=r"over the limit of 512 tokens per text \(limits.max_text_tokens\)"):
        model.validate({"text": texts(LONG * 4)})


def test_chunk_is_for_embedders(dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="chunk applies to text-embedding models"):
        load(dirs["reranker"], "chunk")
    with pytest.raises(pydantic.ValidationError, match="chunk applies to text-embedding models"):
        RuntimeConfig.model_validate(
            {"model": {"source": str(dirs["reranker"]), "task": "reranking", "overflow": "chunk"}}
        )


async def test_the_batcher_counts_chunked_rows(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "chunk")
    model.warmup(2, 1)
    metrics = RuntimeMetrics(model.name)
    batcher = Batcher(model, BatchSettings(max_batch_size=2, max_queue_delay_seconds=0.0), metrics=metrics)
    batcher.start()
    try:
        # one long row is many windows, run two at a time (max_batch_size) and pooled back into one
        out = await batcher.infer({"text": texts(LONG, SHORT)})
    finally:
        await batcher.drain(5)
    assert out["embedding"].shape == (2, model.dim)
    assert 'kubeinfer_chunked_rows_total{model="tiny"} 1.0' in metrics.exposition().decode()


def test_chunk_on_onnxruntime_gives_the_torch_pooling(
    dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(tmp_path))
    model: dict[str, Any] = {
        "name": "tiny",
        "source": str(dirs["embedder"]),
        "max_sequence_length": WINDOW,
        "overflow": "chunk",
        "engine": "onnxruntime",
    }
    ort_model = load_model(tiny_hf_config(dirs["embedder"], model=model))
    torch_model = load(dirs["embedder"], "chunk")
    inputs = {"text": texts(LONG, SHORT)}
    expected = torch_model.execute(torch_model.preprocess([inputs]))["embedding"]
    got = ort_model.execute(ort_model.preprocess([inputs]))["embedding"]
    np.testing.assert_allclose(got, expected, atol=1e-4)
