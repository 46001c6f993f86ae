"""Model formats and Hugging Face tasks on the real node, each served with batching on through its
Service to ``tritonclient.http`` and ``tritonclient.grpc``:

- Triton's ``simple`` add/sub model as a ``torch.export`` program (``spec.model.format: pt2``, a
  ``.pt2`` file) with no tensor declared: the v2 metadata states the tensors read from the program,
  and the sums and differences are right;
- a tiny text classifier (a Hugging Face directory, its task detected from config.json) on the torch
  engine, and the same directory as ``task: text-classification`` on ``engine: onnxruntime``
  (exported to ONNX in the pod at load): labels, scores and logits are those transformers computes in
  this process on the same model;
- a tiny token classifier (task detected): its entities are ``transformers.pipeline``'s;
- Triton's ``simple`` as ONNX (``format: onnx``, a ``.onnx`` file, no tensor declared) on ONNX Runtime;
- a tiny cross-encoder reranker (task detected from its one-label head), on ``engine: onnxruntime``:
  its scores are the sigmoid of the logits transformers computes here for each (query, text) pair.

For each, concurrent requests from both clients batch together (the model's statistics count fewer
executions than requests) with the same answers, and a wrong tensor (a wrong datatype, a wrong name)
is a 400 over REST and INVALID_ARGUMENT over gRPC naming it. test_e2e_model_sources.py serves the
ONNX model and the reranker from every model source, with Triton's own example clients.

The models are made here (hack/devtools/runtime_tiny.py) and served by the project's HTTP file
server on the node's address (``allowInsecureHttp``): the ``.pt2`` as one file, each Hugging Face
directory as a ``.tar.gz`` archive the fetch unpacks. One namespace and one set of
InferenceServices for the module: a runtime pod start costs tens of seconds on two cores.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_tiny import (
    simple_onnx,
    simple_pt2,
    tiny_hf_classifier,
    tiny_hf_cross_encoder,
    tiny_hf_token_classifier,
)
from hack.podnetwork import NODE_IP
from tests.e2e.conftest import runtime_pods, wait_isvc
from tests.e2e.test_e2e_model_sources import _service_url, _tar_gz
from tests.support.cluster import Cluster
from tests.support.perf_analyzer import check_report, command, perf_analyzer, run
from tests.support.storage import FileServer

pytestmark = pytest.mark.timeout(900)

ELEMENTS = 16
LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "I love this film, it is wonderful.",
    "John Schwarzenegger lives in Kraków with Ms. Okonkwo-Eze.",
    "héllo wörld ✓ and unbelievably hyperparameterised tokenisation",
    "",
    "New   York,\tNY  ",
]
#: Requests of a pod that must start and serve (the node has two cores, shared).
SERVING = {"gpus": 0, "cpu": "250m", "memory": "1Gi"}
#: A long max queue delay, so that requests released together surely share batches on a throttled pod.
BATCHING = {"maxBatchSize": 16, "maxQueueDelay": "300ms"}
#: The pod's fp32 against this process's fp32 (another thread count, ONNX Runtime): rounding only.
ATOL = 1e-4
#: InferenceService (and served model) name -> (spec.model beyond uri, spec.runtime beyond device,
#: the file served).
SERVICES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "simple": ({"format": "pt2"}, {}, "simple.pt2"),
    "classifier": ({}, {}, "classifier.tar.gz"),
    "classifier-ort": ({"task": "text-classification"}, {"engine": "onnxruntime"}, "classifier.tar.gz"),
    "tagger": ({}, {}, "tagger.tar.gz"),
    "simple-onnx": ({"format": "onnx"}, {}, "simple.onnx"),
    "reranker": ({}, {"engine": "onnxruntime"}, "reranker.tar.gz"),
}
#: The services that serve Triton's add/sub model (``simple``'s tensors, one format each).
ADD_SUB = ("simple", "simple-onnx")
CLIENTS = ((httpclient, "http"), (grpcclient, "grpc"))


@dataclass
class Models:
    files: FileServer
    classifier_dir: Path
    tagger_dir: Path
    reranker_dir: Path
    sha256: dict[str, str]


@dataclass
class Served:
    ns: str
    http: dict[str, str]
    grpc: dict[str, str]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    work = tmp_path_factory.mktemp("formats")
    served = work / "http"
    served.mkdir()
    simple_pt2(served / "simple.pt2", ELEMENTS)
    simple_onnx(served / "simple.onnx", ELEMENTS)
    classifier_dir = tiny_hf_classifier(work / "classifier", LABELS)
    tagger_dir = tiny_hf_token_classifier(work / "tagger")
    reranker_dir = tiny_hf_cross_encoder(work / "reranker", head_std=0.5)
    for name, directory in (
        ("classifier", classifier_dir),
        ("tagger", tagger_dir),
        ("reranker", reranker_dir),
    ):
        files = {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()
        }
        (served / f"{name}.tar.gz").write_bytes(_tar_gz(files))
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in served.iterdir()}
    server = FileServer(served, host=NODE_IP).start()
    try:
        yield Models(
            files=server,
            classifier_dir=classifier_dir,
            tagger_dir=tagger_dir,
            reranker_dir=reranker_dir,
            sha256=sha256,
        )
    finally:
        server.stop()


def _isvc(name: str, models: Models) -> dict[str, Any]:
    model, runtime, served = SERVICES[name]
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": name,
                "uri": models.files.url(served),
                "allowInsecureHttp": True,
                "sha256": models.sha256[served],
                **model,
            },
            "resources": SERVING,
            "batching": BATCHING,
            "runtime": {"device": "cpu", **runtime},
        },
    }


def _grpc_url(cluster: Cluster, ns: str, name: str) -> str:
    svc = cluster.get_json("service", name, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    return f"{svc['spec']['clusterIP']}:{port}"


@pytest.fixture(scope="module")
def served(cluster: Cluster, operator_release: str, models: Models) -> Iterator[Served]:
    ns = f"e2e-formats-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    try:
        cluster.apply([_isvc(name, models) for name in SERVICES], "-n", ns)
        for name in SERVICES:
            wait_isvc(cluster, ns, name, "True", timeout=420)
        yield Served(
            ns=ns,
            http={name: _service_url(cluster, ns, name) for name in SERVICES},
            grpc={name: _grpc_url(cluster, ns, name) for name in SERVICES},
        )
        cluster.kubectl(
            "delete", "inferenceservice", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=130
        )
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _client(module: Any, served: Served, name: str) -> Any:
    if module is httpclient:
        return httpclient.InferenceServerClient(
            served.http[name], network_timeout=60.0, connection_timeout=10.0
        )
    return grpcclient.InferenceServerClient(served.grpc[name])


def _metadata(client: Any, name: str) -> dict[str, Any]:
    """The v2 model metadata as REST's JSON, from either client."""
    meta = client.get_model_metadata(name)
    if isinstance(meta, dict):
        return {k: meta[k] for k in ("platform", "inputs", "outputs")}
    return {
        "platform": meta.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs],
    }


def _tensor(module: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _texts(module: Any, name: str, rows: list[str]) -> Any:
    return _tensor(module, name, np.array([t.encode() for t in rows], dtype=np.object_), "BYTES")


def _add_sub(module: Any, client: Any, a: np.ndarray, b: np.ndarray, name: str = "simple") -> None:
    result = client.infer(
        name, [_tensor(module, "INPUT0", a, "INT32"), _tensor(module, "INPUT1", b, "INT32")]
    )
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0 is not None and out0.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def _reference_logits(path: Path, texts: list[str]) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    module = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        return module(**tokenizer(texts, padding=True, return_tensors="pt")).logits


def _classify(module: Any, client: Any, name: str, models: Models, texts: list[str]) -> None:
    """Labels, scores and logits of ``texts`` equal transformers' on the same model."""
    logits = _reference_logits(models.classifier_dir, texts)
    result = client.infer(name, [_texts(module, "text", texts)])
    assert list(result.as_numpy("label")) == [LABELS[i].encode() for i in logits.argmax(dim=1).tolist()]
    np.testing.assert_allclose(
        result.as_numpy("score"), torch.softmax(logits, dim=1).max(dim=1).values.numpy(), atol=ATOL
    )
    np.testing.assert_allclose(result.as_numpy("logits"), logits.numpy(), atol=ATOL)


@pytest.fixture(scope="module")
def pipeline(models: Models) -> Any:
    return transformers.pipeline("token-classification", model=str(models.tagger_dir), device="cpu")


def _tag(module: Any, client: Any, pipeline: Any, texts: list[str], strategy: str | None) -> None:
    """The entities of ``texts`` equal the pipeline's (``strategy`` None: the default, ``none``)."""
    inputs = [_texts(module, "text", texts)]
    if strategy is not None:
        inputs.append(_texts(module, "aggregation_strategy", [strategy]))
    out = client.infer("tagger", inputs).as_numpy("entities")
    assert out is not None and out.shape == (len(texts),)
    got = [json.loads(row) for row in out]
    want = [
        [{k: v.item() if isinstance(v, np.generic) else v for k, v in e.items()} for e in row]
        for row in pipeline(texts, aggregation_strategy=strategy or "none")
    ]
    unscored = [[{k: v for k, v in e.items() if k != "score"} for e in row] for row in got]
    assert unscored == [[{k: v for k, v in e.items() if k != "score"} for e in row] for row in want]
    for row, ref in zip(got, want, strict=True):
        np.testing.assert_allclose([e["score"] for e in row], [e["score"] for e in ref], atol=ATOL)
    assert any(got), "the tagger found entities (a random head labels most tokens)"


def test_every_model_is_ready_from_its_fetched_file_on_its_engine(cluster: Cluster, served: Served) -> None:
    logs = {}
    for name in SERVICES:
        (pod,) = runtime_pods(cluster, served.ns, name)
        (fetch,) = pod["status"]["initContainerStatuses"]
        assert fetch["state"]["terminated"]["exitCode"] == 0, (name, fetch)
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["ready"] is True and cs["restartCount"] == 0, (name, cs)
        logs[name] = cluster.kubectl(
            "logs", "-n", served.ns, pod["metadata"]["name"], "-c", cs["name"]
        ).stdout
    assert "loaded pt2 simple from /mnt/models/simple.pt2 (ExportedProgram) on cpu" in logs["simple"], logs[
        "simple"
    ][-3000:]
    assert "loaded ONNX simple-onnx from /mnt/models/simple.onnx on cpu" in logs["simple-onnx"], logs[
        "simple-onnx"
    ][-3000:]
    for name in ("classifier-ort", "reranker"):
        assert "engine onnxruntime" in logs[name], logs[name][-3000:]
    assert "engine onnxruntime" not in logs["classifier"], logs["classifier"][-3000:]


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
@pytest.mark.parametrize(("name", "platform"), [("simple", "pytorch"), ("simple-onnx", "onnxruntime_onnx")])
def test_simple_states_the_models_own_tensors_and_adds_and_subtracts(
    served: Served, module: Any, protocol: str, name: str, platform: str
) -> None:
    client = _client(module, served, name)
    tensor = {"datatype": "INT32", "shape": [-1, ELEMENTS]}
    assert _metadata(client, name) == {
        "platform": platform,
        "inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "outputs": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
    }
    a = np.arange(3 * ELEMENTS, dtype=np.int32).reshape(3, ELEMENTS)
    _add_sub(module, client, a, np.full((3, ELEMENTS), -7, np.int32), name)
    _add_sub(module, client, a[:1], a[:1] * 5, name)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_through_the_service_sweeps_simple(
    served: Served, protocol: str, tmp_path: Path
) -> None:
    # Triton's load generator, unmodified, on Triton's own model through the InferenceService's Service.
    address = served.http["simple-onnx"] if protocol == "http" else served.grpc["simple-onnx"]
    report = tmp_path / "report.csv"
    # 2 s windows, up to 10 of them: these pods batch for 300 ms (the batching test below), so at
    # concurrency 2 a window holds a dozen requests; the first requests through the Service are slower
    args = command(perf_analyzer(), "simple-onnx", address, protocol, report, "-p", "2000", "-r", "10")
    proc, shown = run(args, tmp_path)
    assert proc.returncode == 0, shown
    rows = check_report(report, shown)
    print(f"simple-onnx over {protocol}: " + ", ".join(f"{r['Inferences/Second']:.0f}/s" for r in rows))


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
@pytest.mark.parametrize(
    ("name", "platform"), [("classifier", "pytorch"), ("classifier-ort", "onnxruntime_onnx")]
)
def test_text_classifier_gives_transformers_labels_and_scores(
    served: Served, models: Models, module: Any, protocol: str, name: str, platform: str
) -> None:
    client = _client(module, served, name)
    assert _metadata(client, name) == {
        "platform": platform,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "score", "datatype": "FP32", "shape": [-1]},
            {"name": "logits", "datatype": "FP32", "shape": [-1, len(LABELS)]},
        ],
    }
    _classify(module, client, name, models, TEXTS)


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
def test_token_classifier_gives_the_pipelines_entities(
    served: Served, pipeline: Any, module: Any, protocol: str
) -> None:
    client = _client(module, served, "tagger")
    assert _metadata(client, "tagger")["outputs"] == [
        {"name": "entities", "datatype": "BYTES", "shape": [-1]}
    ]
    for strategy in (None, "simple", "first"):
        _tag(module, client, pipeline, TEXTS, strategy)


#: The reranker's scores against transformers' here: a random tiny cross-encoder scores every pair
#: within about 1e-3 of the others (ONNX Runtime against torch differs by about 1e-7).
RERANK_ATOL = 2e-6
#: (query, text) pairs: one query against several texts, and another query, in one request.
PAIRS = [
    ("how do I reset my password?", "Reset it from the login page."),
    ("how do I reset my password?", "The weather is sunny."),
    ("how do I reset my password?", ""),
    ("où est la gare ?", "La gare est à deux rues d'ici."),
    ("", "héllo wörld ✓"),
]


def _rerank(module: Any, client: Any, models: Models, pairs: list[tuple[str, str]]) -> None:
    """The scores of ``pairs`` are the sigmoid of the logits transformers computes on the same model
    (the tiny cross-encoder's config names sentence-transformers' Sigmoid activation)."""
    queries, texts = [q for q, _ in pairs], [t for _, t in pairs]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models.reranker_dir))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(str(models.reranker_dir))
    with torch.inference_mode():
        logits = reference.eval()(**tokenizer(queries, texts, padding=True, return_tensors="pt")).logits
    result = client.infer("reranker", [_texts(module, "query", queries), _texts(module, "text", texts)])
    scores = result.as_numpy("score")
    assert scores is not None and scores.dtype == np.float32 and scores.shape == (len(pairs),)
    want = torch.sigmoid(logits[:, 0]).numpy()
    np.testing.assert_allclose(scores, want, atol=RERANK_ATOL)
    if len(pairs) > 1:  # the pairs' scores lie apart: each row's score is its own pair's
        assert np.diff(np.sort(want)).min() > 5 * RERANK_ATOL, want


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
def test_reranker_scores_each_pair_as_transformers_does(
    served: Served, models: Models, module: Any, protocol: str
) -> None:
    client = _client(module, served, "reranker")
    assert _metadata(client, "reranker") == {
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "query", "datatype": "BYTES", "shape": [-1, 1]},
            {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
        ],
        "outputs": [{"name": "score", "datatype": "FP32", "shape": [-1]}],
    }
    _rerank(module, client, models, PAIRS)
    _rerank(module, client, models, PAIRS[3:4])


def _counts(served: Served, name: str) -> tuple[int, int]:
    stats = _client(httpclient, served, name).get_inference_statistics(name)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.mark.parametrize("name", list(SERVICES))
def test_concurrent_requests_batch_together_with_the_same_answers(
    served: Served, models: Models, pipeline: Any, name: str
) -> None:
    rows = [1, 3, 2, 4, 1, 2, 3, 1]
    clients = [(CLIENTS[i % 2][0], _client(CLIENTS[i % 2][0], served, name)) for i in range(len(rows))]
    start = threading.Barrier(len(rows))
    inferences, executions = _counts(served, name)

    def one(i: int) -> None:
        module, client = clients[i]
        texts = [TEXTS[(i + j) % len(TEXTS)] for j in range(rows[i])]
        a = np.full((rows[i], ELEMENTS), i, np.int32)
        b = np.arange(rows[i] * ELEMENTS, dtype=np.int32).reshape(rows[i], ELEMENTS)
        if name == "tagger":
            start.wait()
            _tag(module, client, pipeline, texts, ("simple", None)[i % 2])
        elif name in ADD_SUB:
            start.wait()
            _add_sub(module, client, a, b, name)
        elif name == "reranker":
            start.wait()
            _rerank(module, client, models, [PAIRS[(i + j) % len(PAIRS)] for j in range(rows[i])])
        else:
            start.wait()
            _classify(module, client, name, models, texts)

    with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
        list(pool.map(one, range(len(rows))))
    inferences_after, executions_after = _counts(served, name)
    assert inferences_after - inferences == sum(rows)
    # 8 requests released together within the max queue delay: fewer batches than requests
    assert 1 <= executions_after - executions < len(rows), (executions, executions_after)


def _wrong_tensors(module: Any, name: str) -> list[tuple[list[Any], str]]:
    if name in ADD_SUB:
        good = np.ones((1, ELEMENTS), np.int32)
        return [
            (
                [
                    _tensor(module, "INPUT0", good, "INT32"),
                    _tensor(module, "INPUT1", good.astype(np.float32), "FP32"),
                ],
                "input tensor 'INPUT1': expected datatype INT32, got FP32",
            ),
            (
                [_tensor(module, "INPUT0", good, "INT32"), _tensor(module, "INPUT2", good, "INT32")],
                "input tensor 'INPUT1' is missing",
            ),
        ]
    if name == "reranker":
        return [
            (
                [_texts(module, "query", ["q"]), _tensor(module, "text", np.zeros(1, np.float32), "FP32")],
                "input tensor 'text': expected datatype BYTES",
            ),
            (
                [_texts(module, "query", ["q"]), _texts(module, "texts", ["hello"])],
                "input tensor 'text' is missing",
            ),
        ]
    return [
        (
            [_tensor(module, "text", np.zeros(1, np.float32), "FP32")],
            "input tensor 'text': expected datatype BYTES",
        ),
        ([_texts(module, "texts", ["hello"])], "input tensor 'text' is missing"),
    ]


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
@pytest.mark.parametrize("name", list(SERVICES))
def test_a_wrong_tensor_is_refused_naming_it(served: Served, module: Any, protocol: str, name: str) -> None:
    client = _client(module, served, name)
    for inputs, message in _wrong_tensors(module, name):
        with pytest.raises(InferenceServerException, match=message) as info:
            client.infer(name, inputs)
        assert info.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"), (
            message,
            info.value.status(),
        )
