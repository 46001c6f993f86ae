"""A text classifier and a cross-encoder reranker served by real ``kubeinfer-runtime`` processes (tiny
random models, the task detected from config.json): ``tritonclient`` over REST and gRPC gets the labels,
scores and logits transformers' own model computes, concurrent requests batch together with the same
results, a missing or mistyped tensor is refused naming it, and the reranker answers ``POST /v1/rerank``
(httpx) with the scores of the v2 route."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_classifier, tiny_hf_config, tiny_hf_cross_encoder
from tests.support.model_config import model_configs, tensors

pytestmark = pytest.mark.timeout(300)

LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "I love this film, it is wonderful.",
    "The service was terrible and slow.",
    "It was fine.",
    "héllo wörld ✓",
    "one two three four five six seven eight nine ten",
    "",
]
QUERY = "how do I bake bread"
DOCS = [
    "Knead the dough, let it rise, then bake at 220 degrees.",
    "The stock market fell sharply on Monday.",
    "Bread needs flour, water, salt and yeast.",
    "Cats sleep most of the day.",
    "Preheat the oven.",
]


def reference_logits(path: Path, first: list[str], second: list[str] | None = None) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    module = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        enc = tokenizer(first, second, padding=True, return_tensors="pt")
        return module(**enc).logits


def serve(path: Path) -> RuntimeProcess:
    cfg = tiny_hf_config(
        path, batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.05}, limits={"max_text_tokens": 64}
    )
    return RuntimeProcess(cfg, ready_timeout=90)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_classifier(tmp_path_factory.mktemp("classifier"), LABELS)


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_cross_encoder(tmp_path_factory.mktemp("reranker"))


@pytest.fixture(scope="module")
def classifier(classifier_dir: Path) -> Iterator[RuntimeProcess]:
    with serve(classifier_dir) as rt:
        yield rt


@pytest.fixture(scope="module")
def reranker(reranker_dir: Path) -> Iterator[RuntimeProcess]:
    with serve(reranker_dir) as rt:
        yield rt


def bytes_input(module: object, name: str, rows: list[str]) -> object:
    inp = module.InferInput(name, [len(rows)], "BYTES")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([t.encode() for t in rows], dtype=object))
    return inp


def test_classifier_over_rest_and_grpc(classifier: RuntimeProcess, classifier_dir: Path) -> None:
    logits = reference_logits(classifier_dir, TEXTS)
    labels = [LABELS[i].encode() for i in logits.argmax(dim=1).tolist()]
    scores = torch.softmax(logits, dim=1).max(dim=1).values.numpy()
    http = httpclient.InferenceServerClient(classifier.address)
    grpc = grpcclient.InferenceServerClient(classifier.grpc_address)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        meta = client.get_model_metadata("tiny")
        outputs = (
            meta["outputs"]
            if isinstance(meta, dict)
            else [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)} for o in meta.outputs]
        )
        assert outputs == [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "score", "datatype": "FP32", "shape": [-1]},
            {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
        ]
        result = client.infer("tiny", [bytes_input(module, "text", TEXTS)])
        assert list(result.as_numpy("label")) == labels
        np.testing.assert_allclose(result.as_numpy("score"), scores, atol=1e-5)
        np.testing.assert_allclose(result.as_numpy("logits"), logits.numpy(), atol=1e-5)
        only = client.infer(
            "tiny", [bytes_input(module, "text", TEXTS[:2])], outputs=[module.InferRequestedOutput("label")]
        )
        assert list(only.as_numpy("label")) == labels[:2] and only.as_numpy("score") is None

    # concurrent requests of different sizes: the same answers as one by one
    groups = [TEXTS[:1], TEXTS[1:4], TEXTS[4:], TEXTS[2:3], TEXTS[:5]]

    def one(group: list[str]) -> np.ndarray:
        client = httpclient.InferenceServerClient(classifier.address)
        out = client.infer("tiny", [bytes_input(httpclient, "text", group)]).as_numpy("logits")
        assert out is not None
        return out

    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        together = list(pool.map(one, groups))
    for group, got in zip(groups, together, strict=True):
        np.testing.assert_allclose(got, reference_logits(classifier_dir, group).numpy(), atol=1e-5)

    with pytest.raises(InferenceServerException, match="input tensor 'text': expected datatype BYTES"):
        inp = httpclient.InferInput("text", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, np.float32))
        http.infer("tiny", [inp])
    r = httpx.post(f"{classifier.url}/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=10)
    assert r.status_code == 400 and "not a reranker" in r.json()["error"]["message"]


def test_the_model_configurations_of_the_classifier_and_the_reranker(
    classifier: RuntimeProcess, reranker: RuntimeProcess
) -> None:
    _, cfg = model_configs(classifier.address, classifier.grpc_address, "tiny")
    assert (cfg.platform, cfg.backend, cfg.max_batch_size) == ("pytorch", "pytorch", 8)
    assert tensors(cfg, "input") == [("text", "TYPE_STRING", [1])]
    assert tensors(cfg, "output") == [
        ("label", "TYPE_STRING", [1]),
        ("score", "TYPE_FP32", [1]),
        ("logits", "TYPE_FP32", [len(LABELS)]),
    ]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 50000
    _, cfg = model_configs(reranker.address, reranker.grpc_address, "tiny")
    assert tensors(cfg, "input") == [("query", "TYPE_STRING", [1]), ("text", "TYPE_STRING", [1])]
    assert tensors(cfg, "output") == [("score", "TYPE_FP32", [1])]


def test_reranker_over_rest_grpc_and_v1_rerank(reranker: RuntimeProcess, reranker_dir: Path) -> None:
    queries = [QUERY] * len(DOCS)
    expected = torch.sigmoid(reference_logits(reranker_dir, queries, DOCS)[:, 0]).numpy()
    http = httpclient.InferenceServerClient(reranker.address)
    grpc = grpcclient.InferenceServerClient(reranker.grpc_address)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        inputs = [bytes_input(module, "query", queries), bytes_input(module, "text", DOCS)]
        np.testing.assert_allclose(client.infer("tiny", inputs).as_numpy("score"), expected, atol=1e-5)
        with pytest.raises(InferenceServerException, match="input tensor 'query' is missing"):
            client.infer("tiny", [bytes_input(module, "text", DOCS)])

    r = httpx.post(
        f"{reranker.url}/v1/rerank",
        json={"model": "tiny", "query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    order = [int(i) for i in np.argsort(-expected, kind="stable")[:2]]
    assert [res["index"] for res in doc["results"]] == order
    np.testing.assert_allclose([res["relevance_score"] for res in doc["results"]], expected[order], atol=1e-5)
    assert [res["document"] for res in doc["results"]] == [{"text": DOCS[i]} for i in order]
    assert doc["model"] == "tiny" and doc["usage"]["total_tokens"] > 0
    r = httpx.post(
        f"{reranker.url}/v1/rerank", json={"model": "nope", "query": "q", "documents": ["d"]}, timeout=10
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{reranker.url}/v1/rerank", json={"model": "tiny", "documents": ["d"]}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "query"
    status, metrics = reranker.get("/metrics")
    assert status == 200 and b'kubeinfer_quantization_label_agreement_ratio{model="tiny"} 1.0' in metrics
