"""A text longer than the model's window (``model.overflow``): refused with a 413 naming the tensor and
the row (the default), or truncated as transformers truncates (``truncate``; a reranker's pair keeps
its query whole and truncates the text), counted in ``kubeinfer_truncated_rows_total``, or split into
overlapping windows (``chunk``): an embedder's embeddings pooled, a token classifier's entities merged
as transformers' pipeline merges its ``stride`` chunks. Tiny seeded models, compared with transformers'
own tokenizer, model and pipeline."""

from __future__ import annotations

import asyncio
import json
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


def test_chunk_is_for_embedders_and_token_classifiers(dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"chunk applies to text-embedding .* and token-classification"):
        load(dirs["reranker"], "chunk")
    with pytest.raises(
        pydantic.ValidationError, match="chunk applies to text-embedding and token-classification models"
    ):
        RuntimeConfig.model_validate(
            {"model": {"source": str(dirs["reranker"]), "task": "reranking", "overflow": "chunk"}}
        )
    # a token classifier merges entities: strategy none (one per token of a window) cannot be merged
    tagger = {"source": str(dirs["tagger"]), "task": "token-classification", "overflow": "chunk"}
    with pytest.raises(pydantic.ValidationError, match=r"needs model\.aggregation_strategy simple, first"):
        RuntimeConfig.model_validate({"model": tagger})
    with pytest.raises(pydantic.ValidationError, match=r"needs model\.aggregation_strategy simple, first"):
        RuntimeConfig.model_validate({"model": {**tagger, "aggregation_strategy": "none"}})
    RuntimeConfig.model_validate({"model": {**tagger, "aggregation_strategy": "max"}})
    with pytest.raises(ValueError, match=r"needs model\.aggregation_strategy simple, first, average or max"):
        load(dirs["tagger"], "chunk")  # the task detected at load: refused there


#: A text of names and places over 13 windows of the tagger's 32 tokens (about 430 tokens, under 512).
TAGGED = " ".join(f"Mr. Okonkwo{i} flew from Kraków to New York on day {i}," for i in range(25))
TAGGER_STRATEGIES = ("simple", "first", "average", "max")  # none: see the next test


@pytest.fixture(scope="module")
def stride_pipeline(dirs: dict[str, Path]) -> Any:
    """transformers' own pipeline on the tagger, its window the runtime's (the tokenizer's length)."""
    pipeline = transformers.pipeline("token-classification", model=str(dirs["tagger"]), device="cpu")
    pipeline.tokenizer.model_max_length = WINDOW
    return pipeline


@pytest.mark.parametrize("strategy", TAGGER_STRATEGIES)
def test_chunk_tags_the_windows_transformers_stride_tags(
    dirs: dict[str, Path], stride_pipeline: Any, strategy: str
) -> None:
    model = load_model(
        tiny_hf_config(
            dirs["tagger"],
            model={
                "name": "tiny",
                "source": str(dirs["tagger"]),
                "max_sequence_length": WINDOW,
                "overflow": "chunk",
                "aggregation_strategy": "simple",
            },
        )
    )
    assert isinstance(model, TextModel)
    model.max_batch_size = 4  # 13 windows run four at a time, each run padded to its own longest
    inputs = {"text": texts(SHORT, TAGGED), "aggregation_strategy": texts(strategy)}
    assert model.validate(inputs) == 2 and model.chunked_rows == 1
    prepared = model.preprocess([inputs])
    assert prepared.windows is not None and len(prepared.windows) > 10
    out = model.execute(prepared)
    got = [json.loads(row) for row in out["entities"]]
    stride = int((WINDOW - 2) * 0.125)  # the runtime's overlap: an eighth of a window's content tokens
    for text, entities in zip((SHORT, TAGGED), got, strict=True):
        expected = stride_pipeline(text, stride=stride, aggregation_strategy=strategy)
        assert [(e["word"], e["entity_group"], e["start"], e["end"]) for e in entities] == [
            (e["word"], e["entity_group"], int(e["start"]), int(e["end"])) for e in expected
        ]
        np.testing.assert_allclose([e["score"] for e in entities], [e["score"] for e in expected], atol=1e-4)
    # offsets index the whole text: entities reach its last window
    assert got[1] and max(e["end"] for e in got[1]) > len(TAGGED) - 40
    assert all(0 <= e["start"] < e["end"] <= len(TAGGED) for e in got[1])
    tokenizer = transformers.AutoTokenizer.from_pretrained(dirs["tagger"])
    assert out[TOKEN_COUNTS].tolist() == [len(tokenizer(t)["input_ids"]) for t in (SHORT, TAGGED)]


@pytest.mark.parametrize("strategy", ["simple", "average"])
async def test_a_chunked_taggers_windows_queue_as_parts_and_tag_as_the_whole_request(
    dirs: dict[str, Path], strategy: str
) -> None:
    model = load_model(
        tiny_hf_config(
            dirs["tagger"],
            model={
                "name": "tiny",
                "source": str(dirs["tagger"]),
                "max_sequence_length": WINDOW,
                "overflow": "chunk",
                "aggregation_strategy": "first",
            },
        )
    )
    assert isinstance(model, TextModel)
    model.max_batch_size = 4
    inputs = {"text": texts(SHORT, TAGGED), "aggregation_strategy": texts(strategy)}
    whole = model.execute(model.preprocess([inputs]))
    parts = model.window_parts(inputs, 4)
    assert parts is not None and len(parts.parts) > 3 and max(parts.rows) <= 4
    assert all(tokens <= WINDOW for tokens in parts.tokens)
    assert model.window_parts({"text": texts(SHORT)}, 4) is None  # one window: runs whole
    assert model.window_parts(inputs, 4, "refuse") is None
    batcher = Batcher(model, BatchSettings(max_batch_size=4), metrics=RuntimeMetrics("tiny"))
    batcher.start()
    try:
        out, short = await asyncio.gather(batcher.infer(inputs), batcher.infer({"text": texts(SHORT)}))
    finally:
        await batcher.drain(5)
    for got, expected in zip(out["entities"], whole["entities"], strict=True):
        got_entities, expected_entities = json.loads(got), json.loads(expected)
        assert [{**e, "score": 0} for e in got_entities] == [{**e, "score": 0} for e in expected_entities]
        np.testing.assert_allclose(
            [e["score"] for e in got_entities], [e["score"] for e in expected_entities], atol=1e-5
        )
    assert json.loads(out["entities"][1])  # the long text has entities
    assert out[TOKEN_COUNTS].tolist() == whole[TOKEN_COUNTS].tolist()
    assert json.loads(short["entities"][0]) is not None


def test_chunk_tagging_refuses_what_it_cannot_merge(dirs: dict[str, Path]) -> None:
    model = load_model(
        tiny_hf_config(
            dirs["tagger"],
            model={
                "name": "tiny",
                "source": str(dirs["tagger"]),
                "max_sequence_length": WINDOW,
                "overflow": "chunk",
                "aggregation_strategy": "first",
            },
        )
    )
    assert isinstance(model, TextModel)
    none = texts("none")
    refused = r"'aggregation_strategy': 'none' .* row 1 of 'text' \(\d+ tokens\)"
    with pytest.raises(InputError, match=refused) as e:
        model.validate({"text": texts(SHORT, TAGGED), "aggregation_strategy": none})
    assert e.value.status == 400 and e.value.tensor == "aggregation_strategy" and model.chunked_rows == 0
    assert model.validate({"text": texts(SHORT), "aggregation_strategy": none}) == 1  # one window: fine
    with pytest.raises(InputError, match=r"'text': row 0 has \d+ tokens, over the limit of 512") as e:
        model.validate({"text": texts(TAGGED * 2), "aggregation_strategy": none})
    assert e.value.status == 413 and e.value.tensor == "text"


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


# ----- a request's overflow parameter may narrow the service's -----------------------------------
@pytest.mark.parametrize(
    ("service", "requested", "policy"),
    [
        ("chunk", None, None),
        ("chunk", "chunk", None),
        ("chunk", "truncate", "truncate"),
        ("chunk", "refuse", "refuse"),
        ("truncate", "refuse", "refuse"),
        ("refuse", "refuse", None),
    ],
)
def test_a_request_may_narrow_the_overflow_policy(
    dirs: dict[str, Path], service: str, requested: str | None, policy: str | None
) -> None:
    assert load(dirs["embedder"], service).narrow_overflow(requested) == policy


@pytest.mark.parametrize(
    ("service", "requested"),
    [("refuse", "truncate"), ("truncate", "chunk"), ("chunk", "split"), ("chunk", 1)],
)
def test_widening_the_overflow_policy_is_a_400_naming_the_parameter(
    dirs: dict[str, Path], service: str, requested: object
) -> None:
    with pytest.raises(InputError, match=r"parameter 'overflow'") as e:
        load(dirs["embedder"], service).narrow_overflow(requested)
    assert e.value.status == 400


async def test_a_chunking_embedder_truncates_or_refuses_a_request_that_asks(dirs: dict[str, Path]) -> None:
    model = load(dirs["embedder"], "chunk")
    model.warmup(4, 1)
    truncating = load(dirs["embedder"], "truncate")
    inputs = {"text": texts(LONG, SHORT)}
    expected = truncating.execute(truncating.preprocess([inputs]))
    metrics = RuntimeMetrics(model.name)
    batcher = Batcher(model, BatchSettings(max_batch_size=4, max_queue_delay_seconds=0.0), metrics=metrics)
    batcher.start()
    try:
        cut = await batcher.infer(inputs, overflow="truncate")
        chunked = await batcher.infer(inputs)
        with pytest.raises(InputError, match=r"row 0 has \d+ tokens, over the limit of 32") as e:
            await batcher.infer(inputs, overflow="refuse")
        assert (await batcher.infer({"text": texts(SHORT)}, overflow="refuse"))["embedding"].shape == (
            1,
            model.dim,
        )
    finally:
        await batcher.drain(5)
    assert e.value.status == 413
    np.testing.assert_allclose(cut["embedding"], expected["embedding"], atol=1e-6)
    np.testing.assert_array_equal(cut[TOKEN_COUNTS], expected[TOKEN_COUNTS])
    assert not np.allclose(chunked["embedding"][0], cut["embedding"][0], atol=1e-3)
    exposition = metrics.exposition().decode()
    assert 'kubeinfer_truncated_rows_total{model="tiny"} 1.0' in exposition
    assert 'kubeinfer_chunked_rows_total{model="tiny"} 1.0' in exposition


def test_a_chunking_token_classifier_narrows_to_refuse_only(dirs: dict[str, Path]) -> None:
    model: dict[str, Any] = {
        "name": "tiny",
        "source": str(dirs["tagger"]),
        "max_sequence_length": WINDOW,
        "overflow": "chunk",
        "aggregation_strategy": "simple",
    }
    tagger = load_model(tiny_hf_config(dirs["tagger"], model=model))
    assert tagger.narrow_overflow("refuse") == "refuse"
    with pytest.raises(InputError, match=r"parameter 'overflow'.*not truncate"):
        tagger.narrow_overflow("truncate")
