"""A token classifier (an NER tagger; a tiny random model, the task detected from config.json) served by a
real ``kubeinfer-runtime`` process: ``tritonclient`` over REST and gRPC reads the tensors from the v2
metadata and gets, for every aggregation strategy, the entities ``transformers.pipeline`` finds on the same
model; concurrent requests of different sizes and strategies batch together with the same entities; a bad
strategy, a missing or mistyped tensor is refused naming it."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_token_classifier
from tests.support.model_config import model_configs, tensors

pytestmark = pytest.mark.timeout(300)

STRATEGIES = ["none", "simple", "first", "average", "max"]
TEXTS = [
    "John Schwarzenegger lives in Kraków with Ms. Okonkwo-Eze.",
    "héllo wörld ✓ and unbelievably hyperparameterised tokenisation",
    "",
    "Paris",
    "New   York,\tNY  ",
]


@pytest.fixture(scope="module")
def tagger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_token_classifier(tmp_path_factory.mktemp("tagger"))


@pytest.fixture(scope="module")
def tagger(tagger_dir: Path) -> Iterator[RuntimeProcess]:
    cfg = tiny_hf_config(
        tagger_dir,
        batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.05},
        limits={"max_text_tokens": 64},
    )
    with RuntimeProcess(cfg, ready_timeout=90) as rt:
        yield rt


@pytest.fixture(scope="module")
def pipeline(tagger_dir: Path) -> Any:
    return transformers.pipeline("token-classification", model=str(tagger_dir), device="cpu")


def expected(pipeline: Any, rows: list[str], strategy: str) -> list[list[dict[str, Any]]]:
    return [
        [{k: v.item() if isinstance(v, np.generic) else v for k, v in e.items()} for e in row]
        for row in pipeline(rows, aggregation_strategy=strategy)
    ]


def assert_same(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]]) -> None:
    assert len(got) == len(want)
    for row, ref in zip(got, want, strict=True):
        assert [{k: v for k, v in e.items() if k != "score"} for e in row] == [
            {k: v for k, v in e.items() if k != "score"} for e in ref
        ]
        np.testing.assert_allclose([e["score"] for e in row], [e["score"] for e in ref], atol=1e-5)


def bytes_input(module: Any, name: str, rows: list[str]) -> Any:
    inp = module.InferInput(name, [len(rows)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in rows], dtype=object))
    return inp


def infer(module: Any, client: Any, rows: list[str], strategy: str | None) -> list[list[dict[str, Any]]]:
    inputs = [bytes_input(module, "text", rows)]
    if strategy is not None:
        inputs.append(bytes_input(module, "aggregation_strategy", [strategy]))
    out = client.infer("tiny", inputs).as_numpy("entities")
    assert out is not None and out.shape == (len(rows),)
    return [json.loads(row) for row in out]


def test_entities_over_rest_and_grpc(tagger: RuntimeProcess, pipeline: Any) -> None:
    http = httpclient.InferenceServerClient(tagger.address)
    grpc = grpcclient.InferenceServerClient(tagger.grpc_address)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        meta = client.get_model_metadata("tiny")
        if isinstance(meta, dict):
            inputs, outputs = meta["inputs"], meta["outputs"]
        else:
            inputs, outputs = (
                [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]
                for tensors in (meta.inputs, meta.outputs)
            )
        assert inputs == [
            {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
            {"name": "aggregation_strategy", "datatype": "BYTES", "shape": [1]},
        ]
        assert outputs == [{"name": "entities", "datatype": "BYTES", "shape": [-1]}]
        for strategy in STRATEGIES:
            assert_same(infer(module, client, TEXTS, strategy), expected(pipeline, TEXTS, strategy))
        assert_same(infer(module, client, TEXTS, None), expected(pipeline, TEXTS, "none"))  # the default

        with pytest.raises(InferenceServerException, match="input tensor 'aggregation_strategy': 'mean'"):
            infer(module, client, TEXTS[:1], "mean")
        with pytest.raises(InferenceServerException, match="input tensor 'text' is missing"):
            client.infer("tiny", [bytes_input(module, "aggregation_strategy", ["simple"])])
        with pytest.raises(InferenceServerException, match="input tensor 'text': expected datatype BYTES"):
            inp = module.InferInput("text", [1], "FP32")
            inp.set_data_from_numpy(np.zeros(1, np.float32))
            client.infer("tiny", [inp])


def test_the_model_configuration_marks_the_strategy_optional(tagger: RuntimeProcess) -> None:
    _, cfg = model_configs(tagger.address, tagger.grpc_address, "tiny")
    assert tensors(cfg, "input") == [
        ("text", "TYPE_STRING", [1]),
        ("aggregation_strategy", "TYPE_STRING", [1]),
    ]
    assert [t.optional for t in cfg.input] == [False, True]
    assert tensors(cfg, "output") == [("entities", "TYPE_STRING", [1])]


def test_concurrent_requests_batch_with_the_same_entities(tagger: RuntimeProcess, pipeline: Any) -> None:
    groups = [
        (TEXTS[:1], "simple"),
        (TEXTS[1:4], "first"),
        (TEXTS[3:], None),
        (TEXTS[:2], "max"),
        (TEXTS, "average"),
        (TEXTS[1:2], "none"),
    ]

    def one(group: tuple[list[str], str | None]) -> list[list[dict[str, Any]]]:
        rows, strategy = group
        use_grpc = strategy in ("first", "average")
        module: Any = grpcclient if use_grpc else httpclient
        client = module.InferenceServerClient(tagger.grpc_address if use_grpc else tagger.address)
        return infer(module, client, rows, strategy)

    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        together = list(pool.map(one, groups))
    for (rows, strategy), got in zip(groups, together, strict=True):
        assert_same(got, expected(pipeline, rows, strategy or "none"))
    status, metrics = tagger.get("/metrics")
    assert status == 200 and b'kubeinfer_quantization_label_agreement_ratio{model="tiny"} 1.0' in metrics
