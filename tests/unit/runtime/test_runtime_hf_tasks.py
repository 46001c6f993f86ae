"""Hugging Face tasks beyond embeddings (tiny random models): detection, a text classifier's labels and
scores, a cross-encoder reranker's scores, both checked against transformers' own model; batching
across requests, the v2 metadata, errors naming the tensor, quantization's deviation report, and
``POST /v1/rerank`` through the data plane."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pydantic
import pytest
import torch
import transformers
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import InputError, load_model
from kubeinfer.runtime.models.base import QuantizationError
from kubeinfer.runtime.models.hf_tasks import (
    CrossEncoderModel,
    TextClassifierModel,
    detect_task,
    model_task,
    reranker_sigmoid,
)
from kubeinfer.runtime.models.quantize import compare_scores
from kubeinfer.runtime.openai_api import rerank_results
from kubeinfer.runtime.server import RuntimeServer

from hack.devtools.runtime_tiny import tiny_hf_classifier, tiny_hf_config, tiny_hf_cross_encoder, tiny_hf_dir
from tests.unit.runtime.runtime_fakes import texts

pytestmark = pytest.mark.timeout(120)

LABELS = ["anger", "joy", "sadness"]
TEXTS = [
    "I love this film, it is wonderful.",
    "The service was terrible and slow.",
    "",
    "héllo wörld ✓",
    "one two three four five six seven eight nine ten eleven twelve",
    "ok",
]
QUERY = "how do I bake bread"
DOCS = [
    "Knead the dough, let it rise, then bake at 220 degrees.",
    "The stock market fell sharply on Monday.",
    "Bread needs flour, water, salt and yeast.",
    "Cats sleep most of the day.",
    "a",
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tasks")
    return {
        "embedder": tiny_hf_dir(root / "embedder"),
        "classifier": tiny_hf_classifier(root / "classifier", LABELS),
        "multi": tiny_hf_classifier(root / "multi", LABELS, multi_label=True),
        "reranker": tiny_hf_cross_encoder(root / "reranker"),
        "raw": tiny_hf_cross_encoder(root / "raw", activation="Identity"),
    }


@pytest.fixture(scope="module")
def classifier(dirs: dict[str, Path]) -> TextClassifierModel:
    model = load_model(tiny_hf_config(dirs["classifier"]))
    assert isinstance(model, TextClassifierModel)
    return model


@pytest.fixture(scope="module")
def reranker(dirs: dict[str, Path]) -> CrossEncoderModel:
    model = load_model(tiny_hf_config(dirs["reranker"]))
    assert isinstance(model, CrossEncoderModel)
    return model


def reference_logits(path: Path, first: list[str], second: list[str] | None = None) -> torch.Tensor:
    """The logits of transformers' own model and tokenizer, one row at a time (no padding)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    module = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    rows = []
    with torch.inference_mode():
        for i, text in enumerate(first):
            enc = tokenizer(text, None if second is None else second[i], return_tensors="pt")
            rows.append(module(**enc).logits[0])
    return torch.stack(rows)


# --- detection and configuration ------------------------------------------------------------------


def test_the_task_is_detected_from_config_json(dirs: dict[str, Path], tmp_path: Path) -> None:
    assert detect_task(dirs["embedder"]) == "text-embedding"
    assert detect_task(dirs["classifier"]) == "text-classification"
    assert detect_task(dirs["multi"]) == "text-classification"
    assert detect_task(dirs["reranker"]) == "reranking"
    assert detect_task(dirs["raw"]) == "reranking"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert detect_task(tmp_path) == "text-embedding"  # no architectures: an encoder
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["XLMRobertaForSequenceClassification"], "num_labels": 1})
    )
    assert detect_task(tmp_path) == "reranking"  # num_labels without id2label
    explicit = tiny_hf_config(
        dirs["reranker"], model={"name": "r", "source": str(dirs["reranker"]), "task": "text-classification"}
    )
    assert model_task(explicit) == "text-classification"
    assert model_task(RuntimeConfig()) == "text-embedding"  # the bundled MiniLM


def test_reranker_activation_comes_from_the_sentence_transformers_config() -> None:
    assert reranker_sigmoid({}) is True  # sentence-transformers' default for one label
    assert (
        reranker_sigmoid({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}})
        is False
    )
    assert reranker_sigmoid({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"})
    with pytest.raises(ValueError, match="Tanh"):
        reranker_sigmoid({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}})


def test_task_in_the_config_file_only_when_set(dirs: dict[str, Path]) -> None:
    plain = tiny_hf_config(dirs["classifier"])
    assert "task" not in plain.file_data()["model"]  # the operator's hash of an existing spec is kept
    cfg = tiny_hf_config(dirs["classifier"], model={"name": "c", "source": "/m", "task": "reranking"})
    assert cfg.file_data()["model"]["task"] == "reranking"
    assert RuntimeConfig.from_yaml(cfg.to_yaml()).model.task == "reranking"
    with pytest.raises(pydantic.ValidationError, match="huggingface models only"):
        RuntimeConfig.model_validate({"model": {"source": "/m.onnx", "format": "onnx", "task": "reranking"}})


def test_a_task_the_model_cannot_serve_is_refused(dirs: dict[str, Path]) -> None:
    def cfg(path: Path, task: str, **model: object) -> RuntimeConfig:
        return tiny_hf_config(path, model={"name": "m", "source": str(path), "task": task, **model})

    with pytest.raises(ValueError, match="no sequence-classification head"):
        load_model(cfg(dirs["embedder"], "text-classification"))
    with pytest.raises(ValueError, match="3 labels"):
        load_model(cfg(dirs["classifier"], "reranking"))
    with pytest.raises(QuantizationError, match="not supported on engine onnxruntime yet"):
        load_model(
            tiny_hf_config(
                dirs["reranker"],
                model={"name": "m", "source": str(dirs["reranker"]), "engine": "onnxruntime"},
                quantization={"mode": "bf16"},
            )
        )


# --- the classifier ----------------------------------------------------------------------------------


def test_classifier_labels_scores_and_logits_match_transformers(
    classifier: TextClassifierModel, dirs: dict[str, Path]
) -> None:
    out = classifier.execute(classifier.preprocess([{"text": texts(*TEXTS)}]))
    expected = reference_logits(dirs["classifier"], TEXTS)
    np.testing.assert_allclose(out["logits"], expected.numpy(), atol=1e-5)
    assert out["logits"].dtype == np.float32 and out["logits"].shape == (len(TEXTS), 3)
    top = expected.argmax(dim=1).tolist()
    assert list(out["label"]) == [LABELS[i].encode() for i in top]
    softmax = torch.softmax(expected, dim=1)
    np.testing.assert_allclose(out["score"], softmax.max(dim=1).values.numpy(), atol=1e-6)
    assert out["score"].dtype == np.float32
    assert out["token_count"].tolist() == [len(ids) for ids in classifier.tokenizer(TEXTS)["input_ids"]]


def test_multi_label_classifier_scores_are_sigmoids(dirs: dict[str, Path]) -> None:
    model = load_model(tiny_hf_config(dirs["multi"]))
    assert isinstance(model, TextClassifierModel) and model.multi_label
    out = model.execute(model.preprocess([{"text": texts(*TEXTS)}]))
    expected = reference_logits(dirs["multi"], TEXTS)
    np.testing.assert_allclose(out["score"], torch.sigmoid(expected).max(dim=1).values.numpy(), atol=1e-6)


def test_classifier_metadata_states_its_tensors(classifier: TextClassifierModel) -> None:
    doc = model_metadata_doc(classifier)
    assert doc["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    assert doc["outputs"] == [
        {"name": "label", "datatype": "BYTES", "shape": [-1]},
        {"name": "score", "datatype": "FP32", "shape": [-1]},
        {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
    ]
    assert doc["platform"] == "pytorch"


# --- the reranker ------------------------------------------------------------------------------------


def test_reranker_scores_pairs_as_transformers_does(
    reranker: CrossEncoderModel, dirs: dict[str, Path]
) -> None:
    queries = [QUERY] * len(DOCS)
    out = reranker.execute(reranker.preprocess([{"query": texts(*queries), "text": texts(*DOCS)}]))
    logits = reference_logits(dirs["reranker"], queries, DOCS)[:, 0]
    np.testing.assert_allclose(out["score"], torch.sigmoid(logits).numpy(), atol=1e-6)
    assert out["score"].dtype == np.float32 and out["score"].shape == (len(DOCS),)
    pair_tokens = [len(ids) for ids in reranker.tokenizer(queries, DOCS)["input_ids"]]
    assert out["token_count"].tolist() == pair_tokens
    # token_type_ids mark the second text: the pair is tokenized as a pair, not two texts joined
    prepared = reranker.tokenize([QUERY], [DOCS[0]])
    assert prepared.tensors["token_type_ids"].sum().item() > 0


def test_identity_reranker_gives_the_raw_logit(dirs: dict[str, Path]) -> None:
    model = load_model(tiny_hf_config(dirs["raw"]))
    assert isinstance(model, CrossEncoderModel) and not model.sigmoid
    out = model.execute(model.tokenize([QUERY] * 2, DOCS[:2]))
    logits = reference_logits(dirs["raw"], [QUERY] * 2, DOCS[:2])[:, 0]
    np.testing.assert_allclose(out["score"], logits.numpy(), atol=1e-5)


def reranker_dir(model: CrossEncoderModel) -> str:
    return str(model.tokenizer.name_or_path)


def test_reranker_metadata_errors_and_warmup(reranker: CrossEncoderModel) -> None:
    doc = model_metadata_doc(reranker)
    assert doc["inputs"] == [
        {"name": "query", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
    ]
    assert doc["outputs"] == [{"name": "score", "datatype": "FP32", "shape": [-1]}]
    with pytest.raises(InputError, match="'query' is missing") as missing:
        reranker.validate({"text": texts("a")})
    assert missing.value.tensor == "query"
    with pytest.raises(InputError, match="expected datatype BYTES, got FP32") as dtype:
        reranker.validate({"query": texts("a"), "text": np.zeros(1, np.float32)})
    assert dtype.value.tensor == "text"
    with pytest.raises(InputError, match="has 2 rows but another input has 1") as rows:
        reranker.validate({"query": texts("a"), "text": texts("b", "c")})
    assert rows.value.tensor == "text"
    assert reranker.validate(reranker.example_inputs(3)) == 3
    assert reranker.sequence_limit() == reranker.max_sequence_length == reranker.token_limit == 256
    short = load_model(tiny_hf_config(reranker_dir(reranker), limits={"max_text_tokens": 20}))
    assert isinstance(short, CrossEncoderModel)
    # two texts of 20 tokens, [CLS] and [SEP] once each, one [SEP] between them
    assert short.sequence_limit() == 2 * (20 - 2) + 3 and short.sequence_buckets() == [16, 32, 39]
    assert reranker.warmup(max_batch_size=2, steps=1) > 0 and reranker.max_batch_size == 2


# --- quantization ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["classifier", "reranker"])
def test_int8_dynamic_reports_label_agreement_and_score_deviation(dirs: dict[str, Path], which: str) -> None:
    model = load_model(tiny_hf_config(dirs[which], quantization={"mode": "int8-dynamic"}))
    assert any("quantized" in type(m).__module__ for m in model.module.modules())  # type: ignore[attr-defined]
    report = model.report()
    # a random tiny model's scores are near ties: the figures are in range, not high
    assert 0.0 <= report["quantization_label_agreement_ratio"] <= 1.0
    assert (
        0.0 <= report["quantization_score_deviation_mean"] <= report["quantization_score_deviation_max"] < 0.5
    )
    assert "quantization_cosine_mean_ratio" not in report  # an embedder's figure
    metrics = RuntimeMetrics("m")
    metrics.set_report(report, model.measured_on)
    text = metrics.exposition().decode()
    for name in ("label_agreement_ratio", "score_deviation_mean", "score_deviation_max"):
        assert f'kubeinfer_quantization_{name}{{model="m"}}' in text
    # a reranker is judged on 32 held-out queries x 8 candidates, whatever texts are given
    compared = (
        '{measured_on="held-out pairs",model="m"} 256.0'
        if which == "reranker"
        else ('{measured_on="held-out sentences",model="m"} 349.0')
    )
    assert f"kubeinfer_quantization_compared_texts{compared}" in text


def test_compare_scores() -> None:
    ref = np.array([[0.1, 0.9], [0.8, 0.2]])
    agreement, mean, most = compare_scores(ref, np.array([[0.2, 0.8], [0.4, 0.6]]))
    assert agreement == 0.5 and mean == pytest.approx(0.25) and most == pytest.approx(0.4)
    with pytest.raises(ValueError):
        compare_scores(ref, ref[:1])


# --- through the server: batching across requests, /v1/rerank ---------------------------------------------


@pytest.fixture
async def served(
    request: pytest.FixtureRequest, dirs: dict[str, Path]
) -> AsyncIterator[tuple[object, list[int], httpx.AsyncClient]]:
    model = load_model(tiny_hf_config(dirs[request.param]))
    model.max_batch_size = 16
    batches: list[int] = []
    execute = model.execute

    def recording(prepared: object) -> dict[str, np.ndarray]:
        batches.append(prepared.rows)  # type: ignore[attr-defined]
        return execute(prepared)

    model.execute = recording  # type: ignore[method-assign]
    cfg = tiny_hf_config(dirs[request.param], batching={"max_batch_size": 4, "max_queue_delay_seconds": 0.05})
    server = RuntimeServer(cfg)
    server.attach(model, BatchSettings(max_batch_size=16, max_queue_delay_seconds=0.05))
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield model, batches, client
    server.close()


def v2_body(**columns: list[str]) -> dict[str, object]:
    return {
        "inputs": [
            {"name": name, "datatype": "BYTES", "shape": [len(rows)], "data": rows}
            for name, rows in columns.items()
        ]
    }


def outputs(response: httpx.Response) -> dict[str, list[object]]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


@pytest.mark.parametrize("served", ["classifier"], indirect=True)
async def test_classifier_requests_batch_together_with_the_same_results(served) -> None:  # type: ignore[no-untyped-def]
    _, batches, client = served
    groups = [TEXTS[:1], TEXTS[1:4], TEXTS[4:6], TEXTS[2:3]]
    alone = [outputs(await client.post("/v2/models/tiny/infer", json=v2_body(text=g))) for g in groups]
    assert max(batches) <= 3
    batches.clear()
    together = await asyncio.gather(
        *(client.post("/v2/models/tiny/infer", json=v2_body(text=g)) for g in groups)
    )
    assert max(batches) > 3  # rows of several requests in one batch
    for one, concurrent in zip(alone, together, strict=True):
        got = outputs(concurrent)
        assert got["label"] == one["label"]
        np.testing.assert_allclose(got["score"], one["score"], atol=1e-5)
        np.testing.assert_allclose(got["logits"], one["logits"], atol=1e-5)
    only = outputs(
        await client.post(
            "/v2/models/tiny/infer", json={**v2_body(text=TEXTS[:2]), "outputs": [{"name": "label"}]}
        )
    )
    assert set(only) == {"label"} and all(label in LABELS for label in only["label"])
    r = await client.post("/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "not a reranker" in r.json()["error"]["message"]


@pytest.mark.parametrize("served", ["reranker"], indirect=True)
async def test_reranker_pairs_batch_and_v1_rerank_answers_in_the_cohere_shape(served) -> None:  # type: ignore[no-untyped-def]
    model, batches, client = served
    groups = [(QUERY, DOCS[:2]), ("bread", DOCS[2:5]), ("cats", DOCS[3:4])]
    alone = [
        outputs(await client.post("/v2/models/tiny/infer", json=v2_body(query=[q] * len(d), text=d)))
        for q, d in groups
    ]
    batches.clear()
    together = await asyncio.gather(
        *(client.post("/v2/models/tiny/infer", json=v2_body(query=[q] * len(d), text=d)) for q, d in groups)
    )
    assert max(batches) > 3
    for one, concurrent in zip(alone, together, strict=True):
        np.testing.assert_allclose(outputs(concurrent)["score"], one["score"], atol=1e-5)

    batches.clear()
    r = await client.post(
        "/v1/rerank",
        json={"model": "tiny", "query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": True},
    )
    assert r.status_code == 200, r.text
    ran = list(batches)
    doc = r.json()
    expected = model.execute(model.tokenize([QUERY] * len(DOCS), DOCS))["score"]
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:3]
    assert [res["index"] for res in doc["results"]] == order
    np.testing.assert_allclose([res["relevance_score"] for res in doc["results"]], expected[order], atol=1e-5)
    assert [res["document"]["text"] for res in doc["results"]] == [DOCS[i] for i in order]
    assert doc["model"] == "tiny"
    tokens = sum(len(ids) for ids in model.tokenizer([QUERY] * len(DOCS), DOCS)["input_ids"])
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # two calls (batching.max_batch_size 4: 4 rows and 1), through the batcher
    assert sum(ran) == 5 and len(ran) <= 2
    plain = (
        await client.post("/v1/rerank", json={"query": QUERY, "documents": [{"text": DOCS[0]}, DOCS[1]]})
    ).json()
    assert [set(res) for res in plain["results"]] == [{"index", "relevance_score"}] * 2

    for body, status, param in [
        ({"model": "other", "query": "q", "documents": ["d"]}, 404, "model"),
        ({"model": "tiny", "documents": ["d"]}, 400, "query"),
        ({"model": "tiny", "query": "q", "documents": []}, 400, "documents"),
        ({"model": "tiny", "query": "q", "documents": ["d", 3]}, 400, "documents"),
        ({"model": "tiny", "query": "q", "documents": ["d"], "top_n": 0}, 400, "top_n"),
        (
            {"model": "tiny", "query": "q", "documents": ["d"], "return_documents": "yes"},
            400,
            "return_documents",
        ),
    ]:
        r = await client.post("/v1/rerank", json=body)
        assert r.status_code == status, body
        assert r.json()["error"]["param"] == param
    r = await client.post("/v1/rerank", json={"query": "word " * 600, "documents": ["d"]})
    assert r.status_code == 413 and "input tensor 'query'" in r.json()["error"]["message"]
    r = await client.post("/v2/models/tiny/infer", json=v2_body(text=["only text"]))
    assert r.status_code == 400 and "'query' is missing" in r.json()["error"]


async def test_v1_rerank_truncate_keeps_the_query_whole_and_cuts_the_document(dirs: dict[str, Path]) -> None:
    window = 24
    model_cfg = {"name": "tiny", "source": str(dirs["reranker"]), "max_sequence_length": window}
    long = " ".join(f"word{i} and more" for i in range(40))  # far over the 24-token window
    documents = [long, DOCS[0]]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(dirs["reranker"]))
    module = transformers.AutoModelForSequenceClassification.from_pretrained(str(dirs["reranker"])).eval()
    with torch.inference_mode():
        expected = [
            torch.sigmoid(
                module(
                    **tokenizer(QUERY, doc, truncation="only_second", max_length=window, return_tensors="pt")
                ).logits[0, 0]
            ).item()
            for doc in documents
        ]
    body = {"query": QUERY, "documents": documents}
    for overflow, cases in [
        (
            "truncate",
            [  # the service truncates: absent or true cut the document, false refuses it
                (None, 200, None),
                (True, 200, None),
                (False, 413, "documents"),
                ("yes", 400, "truncate"),
            ],
        ),
        ("refuse", [(None, 413, "documents"), (True, 400, "truncate"), (False, 413, "documents")]),
    ]:
        cfg = tiny_hf_config(dirs["reranker"], model={**model_cfg, "overflow": overflow})
        model = load_model(cfg)
        model.max_batch_size = 4
        server = RuntimeServer(cfg)
        server.attach(model, BatchSettings(max_batch_size=4))
        try:
            transport = httpx.ASGITransport(app=server.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                for truncate, status, param in cases:
                    sent = body if truncate is None else {**body, "truncate": truncate}
                    r = await client.post("/v1/rerank", json=sent)
                    assert r.status_code == status, (overflow, truncate, r.text)
                    if status != 200:
                        assert r.json()["error"]["param"] == param, (overflow, truncate, r.text)
                        continue
                    scores = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
                    np.testing.assert_allclose([scores[0], scores[1]], expected, atol=1e-5)
        finally:
            server.close()


def test_rerank_results_order_ties_and_top_n() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.1], np.float32)
    results = rerank_results(scores, ["a", "b", "c", "d"], None, False)
    assert [r["index"] for r in results] == [1, 0, 2, 3]  # ties by index
    assert [r["index"] for r in rerank_results(scores, ["a", "b", "c", "d"], 10, True)] == [1, 0, 2, 3]
    assert rerank_results(scores, ["a", "b", "c", "d"], 1, True) == [
        {"index": 1, "relevance_score": pytest.approx(0.9), "document": {"text": "b"}}
    ]
