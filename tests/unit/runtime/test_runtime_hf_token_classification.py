"""A Hugging Face token classifier (an NER tagger; a tiny random model): detection from config.json, the
entities of every aggregation strategy equal to ``transformers.pipeline("token-classification")`` on the
same model, the strategy per request or from the configuration, batching across requests with the same
entities as one request alone, the v2 metadata, errors naming the tensor (a bad request fails alone),
and quantization's per-token deviation report."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest
import transformers
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import InputError, load_model
from kubeinfer.runtime.models.hf_tasks import (
    AGGREGATION_STRATEGIES,
    TaggedBatch,
    TokenClassifierModel,
    detect_task,
)
from kubeinfer.runtime.server import RuntimeServer

from hack.devtools.runtime_tiny import (
    TOKEN_LABELS,
    tiny_hf_classifier,
    tiny_hf_config,
    tiny_hf_token_classifier,
)
from tests.unit.runtime.runtime_fakes import texts

pytestmark = pytest.mark.timeout(120)

TEXTS = [
    "John Schwarzenegger lives in Kraków with Ms. Okonkwo-Eze.",
    "",
    "héllo wörld ✓ and unbelievably hyperparameterised tokenisation",
    "Paris",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
    "New   York,\tNY  ",
]


def strategy(name: str) -> np.ndarray:
    return texts(name)


@pytest.fixture(scope="module")
def tagger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_token_classifier(tmp_path_factory.mktemp("tagger"))


@pytest.fixture(scope="module")
def tagger(tagger_dir: Path) -> TokenClassifierModel:
    model = load_model(tiny_hf_config(tagger_dir))
    assert isinstance(model, TokenClassifierModel)
    return model


@pytest.fixture(scope="module")
def pipeline(tagger_dir: Path) -> Any:
    """transformers' own pipeline on the same directory: its model runs each text alone (no padding)."""
    return transformers.pipeline("token-classification", model=str(tagger_dir), device="cpu")


def plain(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pipeline's entities with numpy numbers as Python numbers, as the JSON carries them."""
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in e.items()} for e in entities]


def assert_same_entities(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert [{k: v for k, v in e.items() if k != "score"} for e in got] == [
        {k: v for k, v in e.items() if k != "score"} for e in expected
    ]
    np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in expected], atol=1e-5)


def entities_of(out: dict[str, np.ndarray]) -> list[list[dict[str, Any]]]:
    assert out["entities"].dtype == object
    return [json.loads(row.decode("utf-8")) for row in out["entities"]]


# --- detection and configuration ------------------------------------------------------------------


def test_the_task_is_detected_from_config_json(tagger_dir: Path, tmp_path: Path) -> None:
    assert detect_task(tagger_dir) == "token-classification"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["XLMRobertaForTokenClassification"]}))
    assert detect_task(tmp_path) == "token-classification"
    config = json.loads((tagger_dir / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert list(config["id2label"].values()) == list(TOKEN_LABELS)


def test_aggregation_strategy_in_the_configuration(tagger_dir: Path) -> None:
    plain_cfg = tiny_hf_config(tagger_dir)
    assert "aggregation_strategy" not in plain_cfg.file_data()["model"]  # runtime.yaml reads as before
    cfg = tiny_hf_config(
        tagger_dir, model={"name": "t", "source": str(tagger_dir), "aggregation_strategy": "first"}
    )
    assert RuntimeConfig.from_yaml(cfg.to_yaml()).model.aggregation_strategy == "first"
    with pytest.raises(pydantic.ValidationError, match="aggregation_strategy"):
        RuntimeConfig.model_validate({"model": {"source": "/m", "aggregation_strategy": "mean"}})
    with pytest.raises(pydantic.ValidationError, match="applies to token-classification, not reranking"):
        RuntimeConfig.model_validate(
            {"model": {"source": "/m", "task": "reranking", "aggregation_strategy": "simple"}}
        )
    with pytest.raises(pydantic.ValidationError, match="huggingface token classifiers only"):
        RuntimeConfig.model_validate(
            {"model": {"source": "/m.onnx", "format": "onnx", "aggregation_strategy": "simple"}}
        )


def test_a_model_that_cannot_tag_is_refused(tagger_dir: Path, tmp_path: Path) -> None:
    classifier = tiny_hf_classifier(tmp_path / "classifier")
    forced = tiny_hf_config(
        classifier, model={"name": "m", "source": str(classifier), "task": "token-classification"}
    )
    with pytest.raises(ValueError, match="no token-classification head"):
        load_model(forced)
    # the strategy of a model detected as another task
    detected = tiny_hf_config(
        classifier, model={"name": "m", "source": str(classifier), "aggregation_strategy": "simple"}
    )
    with pytest.raises(ValueError, match="applies to token-classification, not text-classification"):
        load_model(detected)
    with pytest.raises(ValueError, match="not supported on engine onnxruntime yet"):
        load_model(
            tiny_hf_config(
                tagger_dir,
                model={"name": "m", "source": str(tagger_dir), "engine": "onnxruntime"},
                quantization={"mode": "bf16"},
            )
        )
    module = transformers.AutoModelForTokenClassification.from_pretrained(str(tagger_dir))
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    fast = transformers.AutoTokenizer.from_pretrained(str(tagger_dir))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(sorted(fast.get_vocab(), key=fast.get_vocab().get)) + "\n")
    slow = BertTokenizerLegacy(vocab_file=str(vocab))  # a Python tokenizer: no offsets
    assert not slow.is_fast
    with pytest.raises(ValueError, match="fast"):
        TokenClassifierModel(
            name="m",
            module=module,
            tokenizer=slow,
            device=module.device,
            cfg=tiny_hf_config(tagger_dir),
            labels=TOKEN_LABELS,
            default_strategy="none",
        )


# --- the entities ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", AGGREGATION_STRATEGIES)
def test_entities_are_the_pipelines_for_every_strategy(
    tagger: TokenClassifierModel, pipeline: Any, name: str
) -> None:
    out = tagger.execute(tagger.preprocess([{"text": texts(*TEXTS), "aggregation_strategy": strategy(name)}]))
    got = entities_of(out)
    expected = [plain(row) for row in pipeline(TEXTS, aggregation_strategy=name)]
    assert len(got) == len(TEXTS)
    for row, want in zip(got, expected, strict=True):
        assert_same_entities(row, want)
    key = "entity" if name == "none" else "entity_group"
    found = [e for row in got for e in row]
    assert found and all(
        set(e) == ({key, "score", "word", "start", "end"} | ({"index"} if name == "none" else set()))
        for e in found
    )
    assert got[1] == []  # an empty text has no tokens but [CLS] and [SEP]
    assert out["token_count"].tolist() == [len(ids) for ids in tagger.tokenizer(TEXTS)["input_ids"]]


def test_the_strategies_differ_on_words_split_into_subwords(tagger: TokenClassifierModel) -> None:
    # the tiny model's labels disagree within 'schwarzenegger' (schwarz ##ene ##gger): the strategies
    # that force one label per word merge it, simple splits it, none lists every token
    row = texts(TEXTS[0])
    results = {
        name: entities_of(
            tagger.execute(tagger.preprocess([{"text": row, "aggregation_strategy": strategy(name)}]))
        )[0]
        for name in AGGREGATION_STRATEGIES
    }
    words = {name: [e["word"] for e in found] for name, found in results.items()}
    assert "##ene" in words["none"]
    assert any(w.startswith("##") for w in words["simple"])
    for name in ("first", "average", "max"):
        assert not any(w.startswith("##") for w in words[name])
    assert len({json.dumps(r) for r in results.values()}) >= 3
    # offsets index the row's own text (the word is the uncased tokens decoded: accents and spaces differ)
    for e in results["first"]:
        span = TEXTS[0][e["start"] : e["end"]]
        assert span.lower().replace("ó", "o").replace(" ", "") == e["word"].replace(" ", "")


def test_the_default_strategy_is_the_pipelines_and_the_configuration_changes_it(
    tagger: TokenClassifierModel, tagger_dir: Path, pipeline: Any
) -> None:
    assert tagger.default_strategy == "none"
    unnamed = entities_of(tagger.execute(tagger.preprocess([{"text": texts(*TEXTS)}])))
    for row, want in zip(unnamed, pipeline(TEXTS), strict=True):  # the pipeline's own default
        assert_same_entities(row, plain(want))
    cfg = tiny_hf_config(
        tagger_dir, model={"name": "t", "source": str(tagger_dir), "aggregation_strategy": "max"}
    )
    configured = load_model(cfg)
    assert isinstance(configured, TokenClassifierModel) and configured.default_strategy == "max"
    got = entities_of(configured.execute(configured.preprocess([{"text": texts(*TEXTS)}])))
    for row, want in zip(got, pipeline(TEXTS, aggregation_strategy="max"), strict=True):
        assert_same_entities(row, plain(want))
    # a request's own strategy wins over the configured one, case as the pipeline reads it
    named = configured.preprocess([{"text": texts("Paris"), "aggregation_strategy": strategy(" NONE ")}])
    assert isinstance(named, TaggedBatch) and named.strategies == ["none"]


def test_rows_of_several_requests_batch_with_the_entities_of_each_alone(tagger: TokenClassifierModel) -> None:
    requests = [
        {"text": texts(*TEXTS[:2]), "aggregation_strategy": strategy("simple")},
        {"text": texts(TEXTS[2])},
        {"text": texts(*TEXTS[3:]), "aggregation_strategy": strategy("average")},
        {"text": texts(TEXTS[0]), "aggregation_strategy": strategy("first")},
    ]
    prepared = tagger.preprocess(requests)
    assert prepared.rows == 7 and prepared.strategies == [
        "simple",
        "simple",
        "none",
        "average",
        "average",
        "average",
        "first",
    ]
    together = entities_of(tagger.execute(prepared))
    alone = [row for request in requests for row in entities_of(tagger.execute(tagger.preprocess([request])))]
    assert len(together) == len(alone) == 7
    for got, want in zip(together, alone, strict=True):
        assert_same_entities(got, want)


def test_a_left_padding_tokenizer_tags_as_the_fast_path_does(
    tagger: TokenClassifierModel, tagger_dir: Path
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tagger_dir))
    tokenizer.padding_side = "left"  # the tokenizer call, not the Rust fast path, encodes these
    left = TokenClassifierModel(
        name="left",
        module=tagger.module,
        tokenizer=tokenizer,
        device=tagger.torch_device,
        cfg=tiny_hf_config(tagger_dir),
        labels=TOKEN_LABELS,
        default_strategy="simple",
    )
    assert left._batch_encoder is None
    prepared = left.tokenize(TEXTS)
    # padded on the right all the same: BERT numbers positions from the left
    assert prepared.tensors["attention_mask"][1, 0].item() == 1
    assert prepared.tensors["attention_mask"][1, -1].item() == 0
    fast = tagger.tokenize(TEXTS)
    for key, tensor in fast.tensors.items():
        assert prepared.tensors[key].tolist() == tensor.tolist(), key
    got = entities_of(left.execute(prepared))
    want = entities_of(tagger.execute(tagger.tokenize(TEXTS, strategies=["simple"] * len(TEXTS))))
    for a, b in zip(got, want, strict=True):
        assert_same_entities(a, b)


# --- metadata and errors -----------------------------------------------------------------------------


def test_metadata_states_the_tensors(tagger: TokenClassifierModel) -> None:
    doc = model_metadata_doc(tagger)
    assert doc["inputs"] == [
        {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "aggregation_strategy", "datatype": "BYTES", "shape": [1]},
    ]
    assert doc["outputs"] == [{"name": "entities", "datatype": "BYTES", "shape": [-1]}]
    assert doc["platform"] == "pytorch"


def test_bad_inputs_are_refused_naming_the_tensor(tagger: TokenClassifierModel) -> None:
    assert tagger.validate({"text": texts("a", "b")}) == 2
    assert tagger.validate({"text": texts("a", "b", "c"), "aggregation_strategy": strategy("Simple")}) == 3
    cases: list[tuple[dict[str, np.ndarray], str, str]] = [
        (
            {"text": texts("a"), "aggregation_strategy": strategy("mean")},
            "aggregation_strategy",
            "'mean' is not an aggregation strategy",
        ),
        (
            {"text": texts("a"), "aggregation_strategy": texts("simple", "first")},
            "aggregation_strategy",
            "expected shape \\[1\\]",
        ),
        (
            {"text": texts("a"), "aggregation_strategy": np.zeros(1, np.int32)},
            "aggregation_strategy",
            "expected datatype BYTES",
        ),
        (
            {"text": texts("a"), "aggregation_strategy": np.array([b"\xff"], dtype=object)},
            "aggregation_strategy",
            "not valid UTF-8",
        ),
        ({"text": np.array([b"ok", b"\xc3"], dtype=object)}, "text", "row 1 is not valid UTF-8"),
        ({"aggregation_strategy": strategy("simple")}, "text", "'text' is missing"),
        ({"text": texts("a"), "labels": texts("x")}, "labels", "unexpected input tensor"),
        ({"text": texts("word " * 300)}, "text", "over the limit"),
    ]
    for inputs, tensor, words in cases:
        with pytest.raises(InputError, match=words) as caught:
            tagger.validate(inputs)
        assert caught.value.tensor == tensor


def test_warmup_covers_the_buckets(tagger: TokenClassifierModel) -> None:
    assert tagger.warmup(max_batch_size=2, steps=1) > 0 and tagger.max_batch_size == 2
    assert tagger.validate(tagger.example_inputs(3)) == 3


# --- quantization ------------------------------------------------------------------------------------


def test_int8_dynamic_reports_token_label_agreement_and_score_deviation(
    tagger_dir: Path, pipeline: Any
) -> None:
    model = load_model(tiny_hf_config(tagger_dir, quantization={"mode": "int8-dynamic"}))
    assert isinstance(model, TokenClassifierModel)
    assert any("quantized" in type(m).__module__ for m in model.module.modules())
    report = model.report()
    # the wide random head keeps most tokens' labels through int8: a loose floor, not a quality claim
    assert 0.5 <= report["quantization_label_agreement_ratio"] <= 1.0
    assert (
        0.0 <= report["quantization_score_deviation_mean"] <= report["quantization_score_deviation_max"] < 0.5
    )
    assert "quantization_cosine_mean_ratio" not in report
    metrics = RuntimeMetrics("m")
    metrics.set_report(report, model.measured_on)
    text = metrics.exposition().decode()
    for name in ("label_agreement_ratio", "score_deviation_mean", "score_deviation_max"):
        assert f'kubeinfer_quantization_{name}{{model="m"}}' in text
    # measured on the texts, not on their tokens (which the figures count)
    assert 'kubeinfer_quantization_compared_texts{measured_on="held-out sentences",model="m"} 349.0' in text
    # the quantized model still answers in the pipeline's shape
    found = entities_of(
        model.execute(
            model.preprocess([{"text": texts(TEXTS[0]), "aggregation_strategy": strategy("simple")}])
        )
    )
    assert found[0] and set(found[0][0]) == {"entity_group", "score", "word", "start", "end"}
    fp32 = load_model(tiny_hf_config(tagger_dir))
    assert isinstance(fp32, TokenClassifierModel)
    reference = fp32.comparison()
    assert reference.ndim == 2 and reference.shape[1] == len(TOKEN_LABELS)
    np.testing.assert_allclose(reference.sum(axis=1), 1.0, atol=1e-5)  # per-token probabilities


# --- through the server: batching across requests, a bad request fails alone ------------------------


@pytest.fixture
async def served(tagger_dir: Path) -> AsyncIterator[tuple[list[int], httpx.AsyncClient]]:
    model = load_model(tiny_hf_config(tagger_dir))
    model.max_batch_size = 16
    batches: list[int] = []
    execute = model.execute

    def recording(prepared: Any) -> dict[str, np.ndarray]:
        batches.append(prepared.rows)
        return execute(prepared)

    model.execute = recording  # type: ignore[method-assign]
    cfg = tiny_hf_config(tagger_dir)
    server = RuntimeServer(cfg)
    server.attach(model, BatchSettings(max_batch_size=16, max_queue_delay_seconds=0.05))
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield batches, client
    server.close()


def v2_body(rows: list[str], aggregation: str | None = None) -> dict[str, object]:
    inputs: list[dict[str, object]] = [
        {"name": "text", "datatype": "BYTES", "shape": [len(rows)], "data": rows}
    ]
    if aggregation is not None:
        inputs.append(
            {"name": "aggregation_strategy", "datatype": "BYTES", "shape": [1], "data": [aggregation]}
        )
    return {"inputs": inputs}


def rest_entities(response: httpx.Response) -> list[list[dict[str, Any]]]:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "entities" and output["datatype"] == "BYTES"
    return [json.loads(row) for row in output["data"]]


async def test_requests_batch_together_and_a_bad_one_fails_alone(
    served: tuple[list[int], httpx.AsyncClient], pipeline: Any
) -> None:
    batches, client = served
    groups = [(TEXTS[:1], "simple"), (TEXTS[1:4], None), (TEXTS[4:6], "first"), (TEXTS[2:3], "max")]
    alone = [rest_entities(await client.post("/v2/models/tiny/infer", json=v2_body(g, s))) for g, s in groups]
    for (group, name), got in zip(groups, alone, strict=True):
        for row, want in zip(got, pipeline(group, aggregation_strategy=name or "none"), strict=True):
            assert_same_entities(row, plain(want))
    assert max(batches) <= 3
    batches.clear()
    bad = v2_body(["fine"], "mean")
    responses = await asyncio.gather(
        *(client.post("/v2/models/tiny/infer", json=v2_body(g, s)) for g, s in groups[:2]),
        client.post("/v2/models/tiny/infer", json=bad),
        *(client.post("/v2/models/tiny/infer", json=v2_body(g, s)) for g, s in groups[2:]),
    )
    assert max(batches) > 3  # rows of several requests in one batch
    refused = responses.pop(2)
    assert refused.status_code == 400
    assert "input tensor 'aggregation_strategy'" in refused.json()["error"]
    for one, concurrent in zip(alone, responses, strict=True):
        for got, want in zip(rest_entities(concurrent), one, strict=True):
            assert_same_entities(got, want)
    # the OpenAI-compatible routes serve embedders and rerankers, not taggers
    for route, body in (
        ("/v1/embeddings", {"input": "Paris"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ):
        r = await client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
