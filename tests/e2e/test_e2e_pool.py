"""A ModelPool on the real node: six tiny models of mixed formats and one that cannot load, served by
a pool of two replicas whose memory budget fits three of the six.

The models are made here (hack/devtools/runtime_tiny.py) into a directory on the node, which a
PersistentVolume (hostPath) and its claim ``models`` hold, as a Triton user keeps a model repository
on a volume: Triton's ``simple`` as a ``torch.export`` program and as ONNX, a tiny text classifier on
the torch engine and on ONNX Runtime (exported at load), a tiny token classifier, a tiny ONNX MLP, and
a file that is not a model. Each is an InferenceService with ``spec.pool`` and a ``pvc://models/...``
URI. The budget is the sum of the three smallest resident sizes the runtime measures for these models
(measured first in this process with the runtime's own repository, as test_runtime_repository.py
does; an ONNX model's process is about 90 MB, a torch one's 700-900 MB), so a replica holds three at
most and traffic over all six evicts.

1. every model answers right through its own Service (the sums, transformers' labels and scores, the
   pipeline's entities);
2. traffic cycling over the six through their Services evicts and reloads with no failed request, and
   no replica's loaded models pass the budget;
3. ``tritonclient`` lists, unloads and loads on a replica (repository calls act on the replica that
   answers them, so they go to one pod's address);
4. the model that cannot load fails alone: 503 naming it and the cause, its InferenceService not
   Ready with the cause; the others answer.

A hundred load and unload cycles leave a replica's memory where it was: that is checked on a runtime
process in tests/integration/runtime/test_runtime_repository.py (each cycle starts a model process:
about a second each, too long for this tier).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_pool_configmap
from kubeinfer.operator.builders.common import PVC_MOUNT_ROOT
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.repository import ModelRepository
from prometheus_client.parser import text_string_to_metric_families

from hack.devtools.runtime_tiny import (
    simple_onnx,
    simple_pt2,
    tiny_hf_classifier,
    tiny_hf_token_classifier,
    tiny_onnx_mlp,
)
from tests.e2e.conftest import hostpath_claim, isvc_condition, wait_isvc
from tests.e2e.test_e2e_formats import ELEMENTS, LABELS, TEXTS, Models, _add_sub, _classify, _tag
from tests.support.cluster import Cluster, wait_until

pytestmark = pytest.mark.timeout(900)

POOL = "pool"
CLAIM = "models"
#: InferenceService (and served model) name -> (its path on the claim, spec.model beyond uri and name,
#: spec.runtime beyond device).
MODELS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "simple": ("simple.pt2", {"format": "pt2"}, {}),
    "simple-onnx": ("simple.onnx", {"format": "onnx"}, {}),
    "classifier": ("classifier", {}, {}),
    "classifier-ort": ("classifier", {"task": "text-classification"}, {"engine": "onnxruntime"}),
    "tagger": ("tagger", {}, {}),
    "mlp": ("mlp.onnx", {"format": "onnx"}, {}),
}
BROKEN = "broken"


@dataclass
class Pool:
    ns: str
    models: Models  # the classifier's and the tagger's directories (the references)
    budget: int  # bytes
    http: dict[str, str]  # InferenceService -> ClusterIP:port of its REST port


def _make_models(root: Path) -> Models:
    root.mkdir(mode=0o755)
    simple_pt2(root / "simple.pt2", ELEMENTS)
    simple_onnx(root / "simple.onnx", ELEMENTS)
    tiny_onnx_mlp(root / "mlp.onnx")
    (root / "broken.onnx").write_bytes(b"this is not an ONNX model")
    classifier = tiny_hf_classifier(root / "classifier", LABELS)
    tagger = tiny_hf_token_classifier(root / "tagger")
    for path in (root, *root.rglob("*")):  # the runtime's user reads them
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Models(files=None, classifier_dir=classifier, tagger_dir=tagger, reranker_dir=root, sha256={})  # type: ignore[arg-type]


async def _resident_sizes(root: Path, docs: list[dict[str, Any]]) -> dict[str, int]:
    """Each model's resident bytes as the runtime's repository measures them (all pinned: loaded at
    start), on this machine with the image's packages, from the very ``<model>.yaml`` files the operator
    renders into the pool's ConfigMap (the claim's mount path pointed at ``root``)."""
    pool = api.ModelPool.from_body(next(d for d in docs if d["kind"] == "ModelPool"))
    members = [api.InferenceService.from_body(d) for d in docs if d["kind"] == "InferenceService"]
    configmap = build_pool_configmap(pool, [m for m in members if m.name in MODELS])
    repo = root.parent / "measure"
    repo.mkdir()
    for key, text in configmap["data"].items():
        (repo / key).write_text(text.replace(f"{PVC_MOUNT_ROOT}/{CLAIM}", str(root)))
    config = RuntimeConfig.model_validate(
        {"repository": {"path": str(repo), "memory_budget_bytes": 1 << 40, "pinned": list(MODELS)}}
    )
    repository = ModelRepository(config)
    await repository.start()
    try:
        for _ in range(1200):
            if await repository.readiness() is None:
                break
            await asyncio.sleep(0.1)
        assert await repository.readiness() is None, await repository.readiness()
        text = (await repository.metrics_text()).decode()
    finally:
        await repository.close()
    return {name: int(value) for name, value in _samples(text, "kubeinfer_model_resident_bytes").items()}


def _samples(text: str, metric: str) -> dict[str, float]:
    """The samples of ``metric`` by their ``model`` label (summed over the other labels)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric:
                out[s.labels.get("model", "")] = out.get(s.labels.get("model", ""), 0.0) + s.value
    return out


def _manifests(ns: str, root: Path, budget: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [
        *hostpath_claim(ns, CLAIM, f"e2e-pool-models-{ns}", root, "ReadOnlyMany"),
        {
            "apiVersion": "kubeinfer.io/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": POOL, "namespace": ns},
            "spec": {
                "replicas": 2,
                "memoryBudget": str(budget),
                "resources": {"gpus": 0, "cpu": "600m", "memory": "4Gi"},
            },
        },
    ]
    for name, (path, model, runtime) in {**MODELS, BROKEN: ("broken.onnx", {"format": "onnx"}, {})}.items():
        docs.append(
            {
                "apiVersion": "kubeinfer.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "pool": POOL,
                    "model": {"uri": f"pvc://{CLAIM}/{path}", "name": name, **model},
                    "resources": {"gpus": 0},
                    "runtime": {"device": "cpu", **runtime},
                },
            }
        )
    return docs


def _rest_address(cluster: Cluster, ns: str, name: str) -> str:
    svc = cluster.get_json("service", name, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
    return f"{svc['spec']['clusterIP']}:{port}"


def _pool_pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    pods = cluster.get_json("pods", "-n", ns, "-l", f"kubeinfer.io/pool={POOL}")["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]


def _resident(pod: dict[str, Any]) -> float:
    """The bytes of the models loaded on ``pod`` (its runtime's measure)."""
    return _samples(_pod_metrics(pod), "kubeinfer_repository_resident_bytes").get("", 0.0)


def _rolled_out(cluster: Cluster, ns: str) -> bool:
    """The pool's Deployment mounts the claim and its rollout is complete (no pod of an older template)."""
    dep = cluster.get_json("deployment", POOL, "-n", ns)
    claims = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    st = dep.get("status") or {}
    want = dep["spec"]["replicas"]
    return (
        bool(claims)
        and st.get("observedGeneration") == dep["metadata"]["generation"]
        and st.get("updatedReplicas") == want
        and st.get("readyReplicas") == want
        and st.get("replicas") == want
    )


def _pod_metrics(pod: dict[str, Any]) -> str:
    return httpx.get(f"http://{pod['status']['podIP']}:8080/metrics", timeout=30).text


@pytest.fixture(scope="module")
def pool(cluster: Cluster, operator_release: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    work = tmp_path_factory.mktemp("pool")
    work.chmod(0o755)
    root = work / "models"
    models = _make_models(root)
    ns = f"e2e-pool-{secrets.token_hex(3)}"
    # measured with a budget that fits all, then the pool made with one that fits the three largest
    sizes = asyncio.run(_resident_sizes(root, _manifests(ns, root, 1 << 30)))
    assert set(sizes) == set(MODELS) and all(v > 0 for v in sizes.values()), sizes
    # the three smallest fit (and any one alone): two of the large ones never do, so each replica, which
    # sees about half of the traffic over the six, evicts
    budget = max(sum(sorted(sizes.values())[:3]), max(sizes.values()))
    print(
        "resident MiB: " + ", ".join(f"{k} {v >> 20}" for k, v in sizes.items()) + f"; budget {budget >> 20}"
    )
    cluster.create_namespace(ns)
    try:
        docs = _manifests(ns, root, budget)
        # the claim, the models, then the pool: its first pod template mounts the claim (a pool made
        # before its first model on a claim rolls its pods once to mount it)
        cluster.apply([d for d in docs if d["kind"] != "ModelPool"])
        cluster.apply([d for d in docs if d["kind"] == "ModelPool"])
        try:
            wait_until(
                lambda: _rolled_out(cluster, ns), timeout=300, interval=2.0, message="the pool on the claim"
            )
        except TimeoutError as exc:
            pods = cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
            status = cluster.get_json("deployment", POOL, "-n", ns).get("status")
            raise AssertionError(f"{exc}\n{pods}\n{status}") from None
        wait_until(lambda: len(_pool_pods(cluster, ns)) == 2, timeout=60, interval=1.0, message="2 pool pods")
        for name in MODELS:
            wait_isvc(cluster, ns, name, "True", timeout=120)
        pod = _pool_pods(cluster, ns)[0]["metadata"]["name"]
        listed = cluster.kubectl("exec", "-n", ns, pod, "--", "ls", f"{PVC_MOUNT_ROOT}/{CLAIM}", check=False)
        volumes = cluster.get_json("deployment", POOL, "-n", ns)["spec"]["template"]["spec"]["volumes"]
        assert "simple.onnx" in listed.stdout, (listed.stdout, listed.stderr, volumes)
        yield Pool(ns, models, budget, {name: _rest_address(cluster, ns, name) for name in (*MODELS, BROKEN)})
        cluster.kubectl(
            "delete",
            "inferenceservices,modelpools",
            "--all",
            "-n",
            ns,
            "--wait=true",
            "--timeout=120s",
            timeout=130,
        )
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "persistentvolume", f"e2e-pool-models-{ns}", "--wait=false", check=False)


def _answers(pool: Pool, name: str, pipeline: Any) -> None:
    """One right answer from ``name`` through its Service (REST, tritonclient)."""
    client = httpclient.InferenceServerClient(pool.http[name], network_timeout=120.0, connection_timeout=10.0)
    try:
        if name.startswith("simple"):
            a = np.arange(2 * ELEMENTS, dtype=np.int32).reshape(2, ELEMENTS)
            _add_sub(httpclient, client, a, np.full((2, ELEMENTS), 3, np.int32), name)
        elif name.startswith("classifier"):
            _classify(httpclient, client, name, pool.models, TEXTS[:3])
        elif name == "tagger":
            _tag(httpclient, client, pipeline, TEXTS[:2], None)
        else:
            x = httpclient.InferInput("x", [2, 3], "FP32")
            x.set_data_from_numpy(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
            result = client.infer(name, [x])
            y, top = result.as_numpy("y"), result.as_numpy("top")
            assert y is not None and y.shape == (2, 4) and np.isfinite(y).all(), y
            assert top is not None and top.tolist() == y.argmax(axis=1).tolist(), (y, top)
    finally:
        client.close()


@pytest.fixture(scope="module")
def pipeline(pool: Pool) -> Any:
    import transformers

    return transformers.pipeline("token-classification", model=str(pool.models.tagger_dir), device="cpu")


def test_every_pooled_model_answers_right_through_its_own_service(pool: Pool, pipeline: Any) -> None:
    for name in MODELS:
        _answers(pool, name, pipeline)


def test_traffic_cycling_over_the_six_evicts_and_reloads_without_a_failed_request(
    cluster: Cluster, pool: Pool, pipeline: Any
) -> None:
    pods = _pool_pods(cluster, pool.ns)
    before = sum(sum(_samples(_pod_metrics(p), "kubeinfer_model_evictions_total").values()) for p in pods)
    for _ in range(2):
        for name in MODELS:
            _answers(pool, name, pipeline)
            for pod in pods:  # a load makes room first; a model bigger than expected is evicted for after it
                wait_until(
                    lambda pod=pod: _resident(pod) <= pool.budget,
                    timeout=30,
                    interval=0.5,
                    message=f"{pod['metadata']['name']} within its budget ({pool.budget >> 20} MiB)",
                )
    after = sum(sum(_samples(_pod_metrics(p), "kubeinfer_model_evictions_total").values()) for p in pods)
    assert after > before, (before, after)


def test_tritonclient_lists_unloads_and_loads_on_a_replica(cluster: Cluster, pool: Pool) -> None:
    (pod, *_) = _pool_pods(cluster, pool.ns)
    client = httpclient.InferenceServerClient(f"{pod['status']['podIP']}:8080", network_timeout=120.0)
    try:
        assert {m["name"] for m in client.get_model_repository_index()} == {*MODELS, BROKEN}
        client.load_model("simple-onnx")
        assert client.is_model_ready("simple-onnx")
        client.unload_model("simple-onnx")
        assert not client.is_model_ready("simple-onnx")
        states = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert states["simple-onnx"] == "UNAVAILABLE", states
        client.load_model("simple-onnx")
        assert client.is_model_ready("simple-onnx")
    finally:
        client.close()


def test_a_model_that_cannot_load_fails_alone(cluster: Cluster, pool: Pool, pipeline: Any) -> None:
    row = {"datatype": "INT32", "shape": [1, ELEMENTS], "data": list(range(ELEMENTS))}
    body = {"inputs": [{"name": "INPUT0", **row}, {"name": "INPUT1", **row}]}
    r = httpx.post(f"http://{pool.http[BROKEN]}/v2/models/{BROKEN}/infer", json=body, timeout=120)
    assert r.status_code == 503, r.text
    assert r.json()["error"].startswith(f"model '{BROKEN}' failed to load: "), r.text
    for name in ("simple-onnx", "classifier"):
        _answers(pool, name, pipeline)
    # the operator reads the replicas' repository index: the failure is the broken one's condition alone
    wait_isvc(cluster, pool.ns, BROKEN, "False", reason="ModelLoadFailed", timeout=60)
    assert "failed to load" in isvc_condition(cluster, pool.ns, BROKEN)["message"]
    for name in ("simple-onnx", "classifier"):
        assert isvc_condition(cluster, pool.ns, name)["status"] == "True"
    # the pool's status is polled from the replicas every autoscaler interval (5 s): the models just
    # answered show in a later poll (one taken before those loads, after the cycling's evictions, says 0)
    status: dict[str, Any] = {}

    def loaded() -> bool:
        status.update(cluster.get_json("modelpool", POOL, "-n", pool.ns)["status"])
        return status.get("loadedModels", 0) >= 1 and bool(status.get("replicaModels"))

    wait_until(loaded, timeout=30, interval=1, message=f"the pool's status to count a loaded model: {status}")
