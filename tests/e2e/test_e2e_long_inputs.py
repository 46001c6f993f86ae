"""Texts longer than the model and the quality gate on the real node, through each service's ClusterIP
with ``tritonclient.http``:

- ``spec.model.overflow: chunk`` on an embedder: a 10,000-character text's embedding equals (1e-5) the
  same windows (the model's 256 tokens, content overlapping by an eighth) embedded by transformers in
  this process, mean-pooled, weighted by their tokens and normalised;
- ``overflow: truncate``: the embedding equals transformers' ``truncation=True, max_length=256``;
- ``overflow: chunk`` on a token classifier: the entities equal transformers' pipeline with ``stride``
  (every strategy but ``none``), their offsets indexing the original text beyond the first window;
- ``spec.quantization.gate`` on int8 (a tiny embedder whose weights are drawn wide enough for int8 to
  lose something measurable): a bar above what int8 reaches on a held-out file (a ConfigMap)
  leaves the service ``Ready=False QuantizationBelowGate`` with the figure in the message; a bar below
  lets it serve, the figure and the bars in ``status.quantization`` (autoscaling on: the autoscaler
  reads them from the node's Prometheus).

Tiny seeded models (hack/devtools/runtime_tiny.py; MiniLM is not the subject) served by the project's
HTTP file server on the node's address as ``.tar.gz`` archives; one namespace, every InferenceService
created at once and waited together (a runtime pod start costs tens of seconds on two cores), the one
that cannot pass its gate deleted as soon as it says so (its crash loop would take CPU from the
others).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as httpclient

from hack.devtools.runtime_tiny import tiny_hf_dir, tiny_hf_token_classifier
from hack.podnetwork import NODE_IP
from tests.e2e.conftest import wait_isvc
from tests.e2e.test_e2e_model_sources import _service_url, _tar_gz
from tests.support.cluster import Cluster, wait_until
from tests.support.storage import FileServer

pytestmark = pytest.mark.timeout(600)

#: The runtime's window (``model.max_sequence_length``'s default) and a window's content overlap
#: (``CHUNK_OVERLAP``, an eighth of its content tokens).
WINDOW = 256
OVERLAP = int((WINDOW - 2) * 0.125)
#: Requests of a pod that must start and serve (the node has two cores, shared).
SERVING = {"gpus": 0, "cpu": "250m", "memory": "1Gi"}
#: The held-out file of the gate (a ConfigMap key): texts of the user's own, not the bundled ones.
HELD_OUT = [
    f"order {i} arrived late and the customer asked for a refund of {i * 3} euros" for i in range(100)
]
GATE_TEXTS = {"name": "held-out", "key": "texts.txt"}
#: A bar int8 does not reach on the gated tiny model (its weights drawn wide: mean cosine about 0.9975
#: on these texts), and one it passes.
HIGH_GATE = {"minCosine": 0.9999, "texts": GATE_TEXTS}
LOW_GATE = {"minCosine": 0.5, "minAgreement": 0.1, "texts": GATE_TEXTS}
INT8 = "int8-dynamic"
#: InferenceService name -> (the archive served, spec.model beyond uri, spec beyond model/resources/runtime).
SERVICES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "chunked": ("embedder.tar.gz", {"overflow": "chunk", "maxTextTokens": 4096}, {}),
    "truncated": ("embedder.tar.gz", {"overflow": "truncate"}, {}),
    "tagger": (
        "tagger.tar.gz",
        {"overflow": "chunk", "maxTextTokens": 4096, "aggregationStrategy": "simple"},
        {},
    ),
    "gate-high": ("gated.tar.gz", {}, {"quantization": {"mode": INT8, "gate": HIGH_GATE}}),
    "gate-low": (
        "gated.tar.gz",
        {},
        {
            "quantization": {"mode": INT8, "gate": LOW_GATE},
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 1},
        },
    ),
}
SERVED = tuple(name for name in SERVICES if name != "gate-high")


def long_text(chars: int = 10_000) -> str:
    """``chars`` characters of English with names and places (about 2,600 tokens: 12 windows)."""
    parts: list[str] = []
    i = 0
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(f"Ms. Okonkwo met John Smith in Kraków on day {i} to talk about order {i * 7}.")
        i += 1
    return " ".join(parts)[:chars]


TEXT = long_text()


@dataclass
class Models:
    files: FileServer
    embedder_dir: Path
    tagger_dir: Path
    sha256: dict[str, str]


@dataclass
class Served:
    ns: str
    http: dict[str, str]
    below_gate: dict[str, Any]  # gate-high's Ready condition


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    work = tmp_path_factory.mktemp("long-inputs")
    served = work / "http"
    served.mkdir()
    embedder_dir = tiny_hf_dir(work / "embedder")
    tagger_dir = tiny_hf_token_classifier(work / "tagger")
    gated_dir = tiny_hf_dir(work / "gated", init_std=0.3)
    for name, directory in (("embedder", embedder_dir), ("tagger", tagger_dir), ("gated", gated_dir)):
        files = {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()
        }
        (served / f"{name}.tar.gz").write_bytes(_tar_gz(files))
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in served.iterdir()}
    server = FileServer(served, host=NODE_IP).start()
    try:
        yield Models(files=server, embedder_dir=embedder_dir, tagger_dir=tagger_dir, sha256=sha256)
    finally:
        server.stop()


def _isvc(name: str, models: Models) -> dict[str, Any]:
    archive, model, rest = SERVICES[name]
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": name,
                "uri": models.files.url(archive),
                "allowInsecureHttp": True,
                "sha256": models.sha256[archive],
                **model,
            },
            "resources": SERVING,
            "runtime": {"device": "cpu"},
            **rest,
        },
    }


@pytest.fixture(scope="module")
def served(cluster: Cluster, operator_release: str, models: Models) -> Iterator[Served]:
    ns = f"e2e-long-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    try:
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": GATE_TEXTS["name"]},
                "data": {GATE_TEXTS["key"]: "\n".join(HELD_OUT) + "\n"},
            },
            "-n",
            ns,
        )
        cluster.apply([_isvc(name, models) for name in SERVICES], "-n", ns)
        below = wait_isvc(cluster, ns, "gate-high", "False", reason="QuantizationBelowGate", timeout=300)
        cluster.kubectl("delete", "inferenceservice", "gate-high", "-n", ns, "--wait=false")
        for name in SERVED:
            wait_isvc(cluster, ns, name, "True", timeout=300)
        yield Served(ns=ns, http={name: _service_url(cluster, ns, name) for name in SERVED}, below_gate=below)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _infer(url: str, name: str, texts: dict[str, list[str]], output: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=60.0, connection_timeout=10.0)
    inputs = []
    for tensor, rows in texts.items():
        inp = httpclient.InferInput(tensor, [len(rows)], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in rows], dtype=np.object_))
        inputs.append(inp)
    out = client.infer(name, inputs).as_numpy(output)
    assert out is not None
    return out


def _embed_windows(path: Path, windows: list[list[int]]) -> np.ndarray:
    """Each window of token ids (special tokens included) through transformers' own model, mean-pooled
    and normalised: float32 [windows, dim]."""
    bert = transformers.AutoModel.from_pretrained(str(path)).eval()
    out = []
    with torch.inference_mode():
        for ids in windows:
            hidden = bert(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))
            ).last_hidden_state
            out.append(torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0].numpy())
    return np.stack(out)


def test_chunk_embeds_the_windows_transformers_embeds_pooled(served: Served, models: Models) -> None:
    got = _infer(served.http["chunked"], "chunked", {"text": [TEXT]}, "embedding")[0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models.embedder_dir))
    content = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    body = WINDOW - 2
    step = body - OVERLAP
    starts = range(0, max(1, len(content) - body + step), step)
    windows = [[tokenizer.cls_token_id, *content[s : s + body], tokenizer.sep_token_id] for s in starts]
    assert len(windows) > 10 and windows[-1][-2] == content[-1]
    vectors = _embed_windows(models.embedder_dir, windows)
    pooled = (vectors * np.array([len(w) for w in windows], dtype=np.float64)[:, None]).sum(axis=0)
    np.testing.assert_allclose(got, pooled / np.linalg.norm(pooled), atol=1e-5)


def test_truncate_embeds_what_transformers_truncation_gives(served: Served, models: Models) -> None:
    got = _infer(served.http["truncated"], "truncated", {"text": [TEXT]}, "embedding")[0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models.embedder_dir))
    ids = tokenizer(TEXT, truncation=True, max_length=WINDOW)["input_ids"]
    assert len(ids) == WINDOW
    np.testing.assert_allclose(got, _embed_windows(models.embedder_dir, [ids])[0], atol=1e-5)


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_chunked_entities_are_the_stride_pipelines_with_offsets_into_the_text(
    served: Served, models: Models, strategy: str
) -> None:
    out = _infer(
        served.http["tagger"], "tagger", {"text": [TEXT], "aggregation_strategy": [strategy]}, "entities"
    )
    got = json.loads(out[0])
    pipeline = transformers.pipeline("token-classification", model=str(models.tagger_dir), device="cpu")
    pipeline.tokenizer.model_max_length = WINDOW
    want = pipeline(TEXT, stride=OVERLAP, aggregation_strategy=strategy)
    assert [(e["word"], e["entity_group"], e["start"], e["end"]) for e in got] == [
        (e["word"], e["entity_group"], int(e["start"]), int(e["end"])) for e in want
    ]
    np.testing.assert_allclose([e["score"] for e in got], [float(e["score"]) for e in want], atol=1e-4)
    # offsets index the whole text, far past the first window's thousand-odd characters
    assert all(0 <= e["start"] < e["end"] <= len(TEXT) for e in got)
    assert max(e["end"] for e in got) > len(TEXT) - 200


def test_a_gate_above_int8_leaves_the_service_unready_with_the_figure(served: Served) -> None:
    message = served.below_gate["message"]
    assert "QuantizationBelowGate: quantization below the gate: mean cosine 0." in message, message
    assert f"< min_cosine 0.9999 against fp32 on {len(HELD_OUT)} gate texts" in message, message


def test_a_gate_below_int8_serves_with_the_figure_in_status(cluster: Cluster, served: Served) -> None:
    def quantization() -> dict[str, Any] | None:
        found: dict[str, Any] | None = (
            cluster.get_json("inferenceservice", "gate-low", "-n", served.ns)
            .get("status", {})
            .get("quantization")
        )
        return found

    status = wait_until(quantization, timeout=90, message="status.quantization of gate-low")
    assert (status["minCosine"], status["minAgreement"]) == (0.5, 0.1)
    assert (status["measuredOn"], status["texts"]) == ("gate texts", len(HELD_OUT))
    assert 0.5 <= status["cosineMean"] < 0.9999 and 0.1 <= status["retrievalAgreement"] <= 1.0
    # the same int8 on the same texts and node: the figure the refused service's message gives
    refused = float(served.below_gate["message"].split("mean cosine ")[1].split(" ")[0])
    assert abs(status["cosineMean"] - refused) < 1e-3, (status, refused)
    _infer(served.http["gate-low"], "gate-low", {"text": ["it serves"]}, "embedding")
