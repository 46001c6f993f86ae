"""A text classifier, a cross-encoder reranker and a token classifier served on ``engine: onnxruntime``
by real ``kubeinfer-runtime`` processes (tiny seeded models, exported to ONNX at load): ``tritonclient``
over REST and gRPC gets what transformers' own torch model computes (labels, scores, logits, entities),
the v2 metadata states the torch engine's tensors on platform ``onnxruntime_onnx``, concurrent requests
batch together with the same results, and int8-dynamic exports its deviation from torch fp32 as the
quantization gauges."""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import (
    tiny_hf_classifier,
    tiny_hf_config,
    tiny_hf_cross_encoder,
    tiny_hf_token_classifier,
)
from tests.support.model_config import model_configs, tensors

pytestmark = pytest.mark.timeout(300)

LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "I love this film, it is wonderful.",
    "The service was terrible and slow.",
    "John Schwarzenegger lives in Kraków.",
    "héllo wörld ✓",
    "one two three four five six seven eight nine ten",
    "",
]
QUERY = "how do I bake bread"
DOCS = [
    "Knead the dough, let it rise, then bake at 220 degrees.",
    "The stock market fell sharply on Monday.",
    "Bread needs flour, water, salt and yeast.",
    "Preheat the oven.",
]
#: ONNX Runtime fp32 against torch fp32: float rounding only.
ATOL = 1e-4


def reference_logits(path: Path, first: list[str], second: list[str] | None = None) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    module = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        enc = tokenizer(first, second, padding=True, return_tensors="pt")
        return module(**enc).logits


def serve(path: Path, cache: Path, mode: str = "none") -> RuntimeProcess:
    cfg = tiny_hf_config(
        path,
        model={"name": "tiny", "source": str(path), "engine": "onnxruntime"},
        quantization={"mode": mode},
        batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.05},
        limits={"max_text_tokens": 64},
    )
    return RuntimeProcess(cfg, ready_timeout=120, env={"KUBEINFER_CACHE_DIR": str(cache)})


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_classifier(tmp_path_factory.mktemp("classifier"), LABELS)


@pytest.fixture(scope="module")
def classifier(classifier_dir: Path, cache: Path) -> Iterator[RuntimeProcess]:
    with serve(classifier_dir, cache) as rt:
        yield rt


def bytes_input(module: Any, name: str, rows: list[str]) -> Any:
    inp = module.InferInput(name, [len(rows)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in rows], dtype=object))
    return inp


def metadata(client: Any) -> dict[str, Any]:
    """The v2 model metadata as REST's JSON, from either client."""
    meta = client.get_model_metadata("tiny")
    if isinstance(meta, dict):
        return meta
    return {
        "platform": meta.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs],
    }


def gauge(metrics: bytes, name: str) -> float:
    found = re.search(rf'^{name}{{model="tiny"}} (\S+)$', metrics.decode(), re.MULTILINE)
    assert found, f"no {name} series"
    return float(found.group(1))


def test_classifier_over_rest_and_grpc(classifier: RuntimeProcess, classifier_dir: Path) -> None:
    logits = reference_logits(classifier_dir, TEXTS)
    labels = [LABELS[i].encode() for i in logits.argmax(dim=1).tolist()]
    scores = torch.softmax(logits, dim=1).max(dim=1).values.numpy()
    http = httpclient.InferenceServerClient(classifier.address)
    grpc = grpcclient.InferenceServerClient(classifier.grpc_address)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        assert metadata(client) == {
            **metadata(client),
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
            "outputs": [
                {"name": "label", "datatype": "BYTES", "shape": [-1]},
                {"name": "score", "datatype": "FP32", "shape": [-1]},
                {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
            ],
        }
        result = client.infer("tiny", [bytes_input(module, "text", TEXTS)])
        assert list(result.as_numpy("label")) == labels
        np.testing.assert_allclose(result.as_numpy("score"), scores, atol=ATOL)
        np.testing.assert_allclose(result.as_numpy("logits"), logits.numpy(), atol=ATOL)
        with pytest.raises(InferenceServerException, match="input tensor 'text'"):
            inp = module.InferInput("text", [1], "FP32")
            inp.set_data_from_numpy(np.zeros(1, np.float32))
            client.infer("tiny", [inp])

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
        np.testing.assert_allclose(got, reference_logits(classifier_dir, group).numpy(), atol=ATOL)
    status, metrics = classifier.get("/metrics")
    assert status == 200 and gauge(metrics, "kubeinfer_quantization_label_agreement_ratio") == 1.0


def test_the_classifier_configuration_names_onnxruntime(classifier: RuntimeProcess) -> None:
    _, cfg = model_configs(classifier.address, classifier.grpc_address, "tiny")
    assert (cfg.platform, cfg.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert tensors(cfg, "input") == [("text", "TYPE_STRING", [1])]
    assert tensors(cfg, "output")[2] == ("logits", "TYPE_FP32", [len(LABELS)])


def test_reranker_over_rest_and_grpc(tmp_path: Path, cache: Path) -> None:
    path = tiny_hf_cross_encoder(tmp_path / "reranker")
    queries = [QUERY] * len(DOCS)
    expected = torch.sigmoid(reference_logits(path, queries, DOCS)[:, 0]).numpy()
    with serve(path, cache) as rt:
        for module, client in (
            (httpclient, httpclient.InferenceServerClient(rt.address)),
            (grpcclient, grpcclient.InferenceServerClient(rt.grpc_address)),
        ):
            assert metadata(client)["platform"] == "onnxruntime_onnx"
            inputs = [bytes_input(module, "query", queries), bytes_input(module, "text", DOCS)]
            np.testing.assert_allclose(client.infer("tiny", inputs).as_numpy("score"), expected, atol=ATOL)
            with pytest.raises(InferenceServerException, match="input tensor 'query' is missing"):
                client.infer("tiny", [bytes_input(module, "text", DOCS)])


def test_token_classifier_gives_the_pipelines_entities(tmp_path: Path, cache: Path) -> None:
    path = tiny_hf_token_classifier(tmp_path / "tagger")
    pipeline = transformers.pipeline("token-classification", model=str(path), device="cpu")
    with serve(path, cache) as rt:
        for module, client in (
            (httpclient, httpclient.InferenceServerClient(rt.address)),
            (grpcclient, grpcclient.InferenceServerClient(rt.grpc_address)),
        ):
            for strategy in ("none", "simple"):
                inputs = [
                    bytes_input(module, "text", TEXTS),
                    bytes_input(module, "aggregation_strategy", [strategy]),
                ]
                got = [json.loads(row) for row in client.infer("tiny", inputs).as_numpy("entities")]
                want = [[plain(e) for e in row] for row in pipeline(TEXTS, aggregation_strategy=strategy)]
                assert [[unscored(e) for e in row] for row in got] == [
                    [unscored(e) for e in row] for row in want
                ]
                for row, ref in zip(got, want, strict=True):
                    np.testing.assert_allclose(
                        [e["score"] for e in row], [e["score"] for e in ref], atol=ATOL
                    )


def plain(entity: dict[str, Any]) -> dict[str, Any]:
    """A pipeline entity with numpy numbers as Python numbers, as the JSON carries them."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in entity.items()}


def unscored(entity: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entity.items() if k != "score"}


def test_int8_dynamic_reports_its_deviation_from_torch_fp32(classifier_dir: Path, cache: Path) -> None:
    logits = reference_logits(classifier_dir, TEXTS)
    with serve(classifier_dir, cache, "int8-dynamic") as rt:
        client = httpclient.InferenceServerClient(rt.address)
        result = client.infer("tiny", [bytes_input(httpclient, "text", TEXTS)])
        got = result.as_numpy("logits")
        assert got is not None and got.shape == tuple(logits.shape) and got.dtype == np.float32
        assert set(result.as_numpy("label")) <= {label.encode() for label in LABELS}
        status, metrics = rt.get("/metrics")
        assert status == 200
        agreement = gauge(metrics, "kubeinfer_quantization_label_agreement_ratio")
        largest = gauge(metrics, "kubeinfer_quantization_score_deviation_max")
        mean = gauge(metrics, "kubeinfer_quantization_score_deviation_mean")
        assert 0.0 <= agreement <= 1.0 and 0.0 < mean <= largest
        assert "engine onnxruntime" in rt.log_text()
