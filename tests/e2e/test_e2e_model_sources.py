"""Models from where they live, on the real node: ``s3://``, ``http(s)://``, ``hf://``, ``oci://`` and
``pvc://`` InferenceServices whose pods get the model, turn Ready and answer ``tritonclient``; and
the fetch failures a user meets (a wrong credential, a missing object, a bad checksum, a stalled
server), each shown as ``Ready=False ModelFetchFailed`` naming the cause within a minute.

The servers are real and run on this machine, started here: MinIO (``make setup`` builds it) and
the project's HTTP file server on the node's address (pods reach it through the pod bridge), the
local Hugging Face Hub stand-in (:mod:`tests.support.hfhub`: no self-hosted hub serves a seeded repo
offline with the Hub's errors, see there), and an OCI registry (``crane registry serve``) on
127.0.0.1, from where the node's containerd pulls the model image. The ``pvc://`` model lives on a
static hostPath PersistentVolume bound by kube-controller-manager's PV binder.

Triton's ``simple`` add/sub model (ONNX, its tensors read from the model) is the model of every
scheme but ``hf://``, which serves a tiny cross-encoder reranker (v2 and ``/v1/rerank``). The
successful sources run first, the failures after them with small requests (the node has two cores).

The ``https://`` file server has a private CA (``spec.model.caBundle``, a ConfigMap) and wants a
bearer token (``spec.model.credentials``); the ``http://`` one is plain, behind
``spec.model.allowInsecureHttp``, and serves the archive.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from hack.devtools.runtime_tiny import simple_onnx, tiny_hf_cross_encoder
from hack.podnetwork import NODE_IP
from tests.e2e.conftest import (
    OPERATOR_NAMESPACE,
    OPERATOR_PODS,
    accepting,
    isvc_condition,
    runtime_pods,
    wait_isvc,
)
from tests.support.cluster import Cluster, wait_until
from tests.support.hfhub import LocalHub
from tests.support.registry import Registry, push_model_image
from tests.support.storage import FileServer, MinioServer

pytestmark = pytest.mark.timeout(900)

ELEMENTS = 16
#: Triton's own client examples, vendored unchanged (tests/vendor/triton_client_examples/README.md).
EXAMPLES = Path(__file__).resolve().parents[1] / "vendor" / "triton_client_examples"
#: What an example prints per element it validated: "3 + 1 = 4", "3 - -1 = 4".
ARITH = re.compile(r"^(-?\d+) ([+-]) (-?\d+) = (-?\d+)$", re.MULTILINE)
#: Requests of a pod that must start and serve, and of one that only has to fail its fetch.
SERVING = {"gpus": 0, "cpu": "250m", "memory": "1Gi"}
FAILING = {"gpus": 0, "cpu": "100m", "memory": "512Mi"}
HF_TOKEN = "hf_" + secrets.token_hex(12)
BEARER_TOKEN = "bearer-" + secrets.token_hex(12)
WRONG_SECRET_KEY = "wrong-" + secrets.token_hex(8)


@dataclass
class Sources:
    """The servers and what they hold."""

    files: FileServer
    https: FileServer
    stalled: FileServer
    minio: MinioServer
    hub: LocalHub
    registry: Registry
    oci_ref: str
    oci_layer: str
    archive_sha256: str
    onnx_sha256: str
    pv_dir: Path


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sources]:
    work = tmp_path_factory.mktemp("model-sources")
    model_dir = work / "simple"
    model_dir.mkdir()
    onnx_bytes = simple_onnx(model_dir / "simple.onnx", ELEMENTS).read_bytes()
    hf_dir = tiny_hf_cross_encoder(work / "tiny-reranker")
    hf_files = {p.relative_to(hf_dir).as_posix(): p.read_bytes() for p in hf_dir.rglob("*") if p.is_file()}

    served = work / "http"
    served.mkdir()
    archive = _tar_gz({"simple.onnx": onnx_bytes})
    (served / "simple.tar.gz").write_bytes(archive)
    (served / "simple.onnx").write_bytes(onnx_bytes)
    (served / "broken.onnx").write_bytes(b"not an ONNX model" * 64)

    # a hostPath directory readable by the runtime's user (65532)
    pv_dir = work / "pv"
    (pv_dir / "simple").mkdir(parents=True)
    (pv_dir / "simple" / "simple.onnx").write_bytes(onnx_bytes)
    for p in (work, pv_dir, pv_dir / "simple"):
        p.chmod(0o755)
    (pv_dir / "simple" / "simple.onnx").chmod(0o644)

    files = FileServer(served, host=NODE_IP).start()
    # TLS with a private CA (the InferenceService's caBundle) and a bearer token (its Secret)
    https = FileServer(served, host=NODE_IP, tls=True, token=BEARER_TOKEN).start()
    stalled = FileServer(served, host=NODE_IP, stall_after=64).start()
    minio = MinioServer(work / "minio-data", host=NODE_IP).start()
    hub = LocalHub(host=NODE_IP)
    hub.token = HF_TOKEN
    hub.add("kubeinfer/tiny-reranker", {"main": hf_files}, private=True)
    hub.start()
    registry = Registry(work / "registry").start()
    try:
        minio.put("models", {"simple/simple.onnx": onnx_bytes})
        oci_ref = f"{registry.host}/models/simple:v1"
        # a layer no earlier run pushed: the node's image store outlives clusters, and a layer it
        # already holds is never downloaded (the loaders skip hidden files)
        (model_dir / ".nonce").write_text(secrets.token_hex(16))
        push_model_image(registry, model_dir, oci_ref, work / "layers")
        (layer,) = json.loads(registry.crane("manifest", oci_ref))["layers"]
        yield Sources(
            files=files,
            https=https,
            stalled=stalled,
            minio=minio,
            hub=hub,
            registry=registry,
            oci_ref=oci_ref,
            oci_layer=layer["digest"],
            archive_sha256=hashlib.sha256(archive).hexdigest(),
            onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest(),
            pv_dir=pv_dir,
        )
    finally:
        registry.stop()
        hub.stop()
        minio.stop()
        stalled.stop()
        https.stop()
        files.stop()


@pytest.fixture(scope="module")
def ns(cluster: Cluster, operator_release: str) -> Iterator[str]:
    name = f"e2e-sources-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"{name}-models", "--wait=false", check=False)


def _isvc(name: str, model: dict[str, Any], resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "simple", "format": "onnx", **model},
            "resources": resources,
            "runtime": {"device": "cpu"},
            **spec,
        },
    }


def _secret(name: str, data: dict[str, str], type_: str = "Opaque") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": type_,
        "stringData": data,
    }


def _service_url(cluster: Cluster, ns: str, name: str) -> str:
    svc = cluster.get_json("service", name, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
    return accepting(f"{svc['spec']['clusterIP']}:{port}")


def _add_sub(url: str) -> None:
    """One ``simple`` request through the Service: OUTPUT0 = a + b, OUTPUT1 = a - b."""
    client = httpclient.InferenceServerClient(url, network_timeout=30.0, connection_timeout=10.0)
    a = np.arange(ELEMENTS, dtype=np.int32).reshape(1, ELEMENTS)
    b = np.full((1, ELEMENTS), 3, dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, ELEMENTS], "INT32"),
        httpclient.InferInput("INPUT1", [1, ELEMENTS], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    res = client.infer("simple", inputs)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def _triton_examples(cluster: Cluster, ns: str, name: str) -> None:
    """Triton's client examples, unchanged, through the Service's REST and gRPC ports: each exits 0,
    validates every element of its results (sums and differences) and prints its PASS line."""
    svc = cluster.get_json("service", name, "-n", ns)
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    ip = svc["spec"]["clusterIP"]
    runs = [
        ("simple_http_infer_client.py", f"{ip}:{ports['http']}", 2, None),
        ("simple_http_async_infer_client.py", f"{ip}:{ports['http']}", 2, None),
        ("simple_http_aio_infer_client.py", f"{ip}:{ports['http']}", 4, "PASS: infer"),
        ("simple_grpc_infer_client.py", f"{ip}:{ports['grpc']}", 2, "PASS: infer"),
        ("simple_grpc_async_infer_client.py", f"{ip}:{ports['grpc']}", 1, "PASS: Async infer"),
        ("simple_grpc_aio_infer_client.py", f"{ip}:{ports['grpc']}", 3, "PASS: grpc aio infer"),
    ]
    for script, address, results, passed in runs:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / script), "-u", address],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (script, done.stdout[-2000:], done.stderr[-2000:])
        lines = ARITH.findall(done.stdout)
        assert len(lines) == 2 * ELEMENTS * results, (script, done.stdout[-2000:])
        for a, op, b, c in lines:
            assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b)), (script, a, op, b, c)
        if passed:
            assert passed in done.stdout, (script, done.stdout[-2000:])


def _reranks(url: str) -> None:
    """The hub's cross-encoder (its task detected from config.json) through the Service: v2 scores for
    (query, text) pairs, and ``POST /v1/rerank`` ranking the same documents by the same scores."""
    import httpx

    query = "how do I reset my password?"
    docs = ["Reset it from the login page.", "The weather is sunny.", "Passwords expire every 90 days."]
    client = httpclient.InferenceServerClient(url, network_timeout=30.0, connection_timeout=10.0)
    queries = httpclient.InferInput("query", [len(docs)], "BYTES")
    queries.set_data_from_numpy(np.array([query.encode()] * len(docs), dtype=np.object_))
    texts = httpclient.InferInput("text", [len(docs)], "BYTES")
    texts.set_data_from_numpy(np.array([d.encode() for d in docs], dtype=np.object_))
    scores = client.infer("reranker", [queries, texts]).as_numpy("score")
    assert scores is not None and scores.shape == (len(docs),) and np.isfinite(scores).all()
    resp = httpx.post(
        f"http://{url}/v1/rerank",
        json={"model": "reranker", "query": query, "documents": docs, "top_n": 2, "return_documents": True},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    best = sorted(range(len(docs)), key=lambda i: -float(scores[i]))[:2]
    assert [r["index"] for r in results] == best, (results, scores)
    for r in results:
        assert r["relevance_score"] == pytest.approx(float(scores[r["index"]]), abs=1e-5)
        assert r["document"]["text"] == docs[r["index"]]


def _bind_pv(cluster: Cluster, ns: str, pv_dir: Path) -> None:
    pv = f"{ns}-models"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(pv_dir), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": "models"},
            },
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        "-n",
        ns,
    )
    wait_until(
        lambda: cluster.get_json("pvc", "models", "-n", ns).get("status", {}).get("phase") == "Bound",
        timeout=60,
        message="PVC models Bound by the PV binder",
    )


def _layer_downloads(sources: Sources) -> int:
    """Downloads of the model image's layer the registry served so far (its request log): only the
    node's containerd downloads it (pushing and ``crane mutate`` read the manifest and config only)."""
    log = sources.registry.log_tail(10**7)
    return sum(1 for line in log.splitlines() if f"GET /v2/models/simple/blobs/{sources.oci_layer}" in line)


def test_every_scheme_fetches_its_model_turns_ready_and_serves(
    cluster: Cluster, ns: str, sources: Sources
) -> None:
    minio = sources.minio
    cluster.apply(
        [
            _secret(
                "minio", {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
            ),
            _secret("hub", {"HF_TOKEN": HF_TOKEN}),
            _secret("files-token", {"BEARER_TOKEN": BEARER_TOKEN}),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "model-ca"},
                "data": {"ca.crt": sources.https.ca_file.read_text() if sources.https.ca_file else ""},
            },
        ],
        "-n",
        ns,
    )
    _bind_pv(cluster, ns, sources.pv_dir)
    isvcs = [
        _isvc(
            "from-s3",
            {
                "uri": "s3://models/simple/",
                "s3": {"endpoint": minio.endpoint, "region": "us-east-1", "addressingStyle": "path"},
                "credentials": {"secretName": "minio"},
            },
            SERVING,
        ),
        _isvc(
            "from-http",
            {
                "uri": sources.files.url("simple.tar.gz"),
                "allowInsecureHttp": True,
                "sha256": sources.archive_sha256,
            },
            SERVING,
        ),
        _isvc(
            "from-https",
            {
                "uri": sources.https.url("simple.onnx"),
                "sha256": sources.onnx_sha256,
                "caBundle": {"configMapName": "model-ca"},
                "credentials": {"secretName": "files-token"},
            },
            SERVING,
        ),
        _isvc("from-oci", {"uri": f"oci://{sources.oci_ref}"}, SERVING),
        _isvc("from-pvc", {"uri": "pvc://models/simple"}, SERVING),
        {
            "apiVersion": "kubeinfer.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "from-hf"},
            "spec": {
                "model": {
                    "name": "reranker",
                    "uri": "hf://kubeinfer/tiny-reranker@main",
                    "hf": {"endpoint": sources.hub.endpoint},
                    "credentials": {"secretName": "hub"},
                },
                "resources": SERVING,
                "runtime": {"device": "cpu"},
            },
        },
    ]
    cluster.apply(isvcs, "-n", ns)
    for obj in isvcs:
        wait_isvc(cluster, ns, obj["metadata"]["name"], "True", timeout=420)

    try:
        for name in ("from-s3", "from-http", "from-https", "from-oci", "from-pvc"):
            _add_sub(_service_url(cluster, ns, name))
        _reranks(_service_url(cluster, ns, "from-hf"))
    except Exception:
        # what the Services led to: the pods (restarts, last state) and the endpoints
        print(cluster.kubectl("get", "pods,endpointslices", "-n", ns, "-o", "wide", check=False).stdout)
        for pod in cluster.get_json("pods", "-n", ns)["items"]:
            for c in pod.get("status", {}).get("containerStatuses") or []:
                if c.get("restartCount") or not c.get("ready"):
                    print(pod["metadata"]["name"], c.get("restartCount"), c.get("lastState"), c.get("state"))
        raise
    _triton_examples(cluster, ns, "from-oci")

    # the fetch ran as the init container and said what it fetched; the Ready Event tells it too
    for name in ("from-s3", "from-http", "from-https", "from-hf"):
        (pod,) = runtime_pods(cluster, ns, name)
        (fetch,) = pod["status"]["initContainerStatuses"]
        done = fetch["state"]["terminated"]
        assert done["exitCode"] == 0 and done["message"].startswith("fetched "), (name, done)
    events = cluster.get_json("events", "-n", ns)["items"]
    ready_notes = [
        e["message"]
        for e in events
        if e["involvedObject"]["name"] == "from-s3" and e["message"].startswith("Ready=True")
    ]
    assert any("model fetched in" in m and "fetched 1 file" in m for m in ready_notes), ready_notes
    # only what the format needs came from the hub (no other weight formats): every request named
    # a file the tiny repo has
    assert sources.hub.requests, "the hub was asked"

    # a second replica of the oci:// model starts without pulling the image again
    pulls = _layer_downloads(sources)
    assert pulls == 1, sources.registry.log_tail()
    cluster.kubectl(
        "patch", "inferenceservice", "from-oci", "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    wait_until(
        lambda: (
            sum(
                1
                for p in runtime_pods(cluster, ns, "from-oci")
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])
                )
            )
            == 2
        ),
        timeout=300,
        message="two Ready replicas of from-oci",
    )
    assert _layer_downloads(sources) == pulls, "the second replica pulled the model image again"

    assert any(r.authorization == f"Bearer {BEARER_TOKEN}" for r in sources.https.requests)
    _assert_no_credentials(cluster, ns, {minio.secret_key, HF_TOKEN, BEARER_TOKEN})

    cluster.kubectl(
        "delete", "inferenceservice", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=130
    )


def _wait_fetch_failed(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return wait_isvc(cluster, ns, name, "False", reason="ModelFetchFailed", timeout=60)


def test_fetch_failures_are_model_fetch_failed_naming_the_cause_within_a_minute(
    cluster: Cluster, ns: str, sources: Sources
) -> None:
    minio = sources.minio
    cluster.apply(
        _secret(
            "minio-wrong", {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": WRONG_SECRET_KEY}
        ),
        "-n",
        ns,
    )
    s3 = {"endpoint": minio.endpoint, "region": "us-east-1", "addressingStyle": "path"}
    fetch = {"stallTimeout": "5s", "retries": 0}
    cases = {
        "wrong-credential": (
            {"uri": "s3://models/simple/", "s3": s3, "credentials": {"secretName": "minio-wrong"}},
            "403",
        ),
        "missing-object": ({"uri": sources.files.url("nope.onnx"), "allowInsecureHttp": True}, "404"),
        "bad-checksum": (
            {"uri": sources.files.url("simple.onnx"), "allowInsecureHttp": True, "sha256": "0" * 64},
            "sha256 mismatch",
        ),
        "stalled": (
            {"uri": sources.stalled.url("simple.onnx"), "allowInsecureHttp": True, "fetch": fetch},
            "stalled",
        ),
    }
    cluster.apply([_isvc(name, model, FAILING) for name, (model, _) in cases.items()], "-n", ns)
    for name, (_, cause) in cases.items():
        cond = _wait_fetch_failed(cluster, ns, name)
        assert cause in cond["message"], (name, cond)
        # the InferenceService's status stays put: Stalled names the same cause
        stalled = isvc_condition(cluster, ns, name, "Stalled")
        assert stalled.get("status") == "True", (name, stalled)
    _assert_no_credentials(cluster, ns, {minio.secret_key, WRONG_SECRET_KEY})


def _assert_no_credentials(cluster: Cluster, ns: str, needles: set[str]) -> None:
    """No credential value in the namespace's ConfigMaps, InferenceServices, Deployments, Events, pod
    statuses, any container's log (init containers included), or the operator's log."""
    haystacks: dict[str, str] = {
        kind: json.dumps(cluster.get_json(kind, "-n", ns))
        for kind in ("configmaps", "inferenceservices", "deployments", "events")
    }
    haystacks["operator log"] = cluster.kubectl(
        "logs", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS, "--tail=-1"
    ).stdout
    for pod in cluster.get_json("pods", "-n", ns)["items"]:
        pname = pod["metadata"]["name"]
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            logs = cluster.kubectl("logs", "-n", ns, pname, "-c", c["name"], check=False)
            haystacks[f"{pname}/{c['name']} log"] = logs.stdout + logs.stderr
        haystacks[f"{pname} status"] = json.dumps(pod.get("status", {}))
    assert len(haystacks) > 5, haystacks.keys()
    found = [
        (where, needle[:6] + "...")
        for where, text in haystacks.items()
        for needle in needles
        if needle in text
    ]
    assert not found, f"credentials found in: {found}"


def test_a_model_that_does_not_load_and_a_container_killed_for_memory_keep_a_stable_reason(
    cluster: Cluster, ns: str, sources: Sources
) -> None:
    cluster.kubectl(
        "delete", "inferenceservice", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=130
    )
    broken = _isvc(
        "does-not-load",
        {"uri": sources.files.url("broken.onnx"), "allowInsecureHttp": True},
        {"gpus": 0, "cpu": "250m", "memory": "1Gi"},
    )
    small = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "too-small"},
        "spec": {
            "model": {"uri": "default"},
            "resources": {"gpus": 0, "cpu": "250m", "memory": "300Mi"},
            "runtime": {"device": "cpu"},
        },
    }
    cluster.apply([broken, small], "-n", ns)
    expected = {"does-not-load": "ModelLoadFailed", "too-small": "OOMKilled"}
    for name, reason in expected.items():
        cond = wait_isvc(cluster, ns, name, "False", reason=reason, timeout=240)
        if reason == "ModelLoadFailed":
            assert "model load failed" in cond["message"], cond
    # through the kubelet's restarts and back-offs the reason, the message and Stalled stay put: checked
    # every 2 s until each container has restarted once more (a back-off and a new start seen), then once
    # again; the restart is due within 60 s (the kubelet's crash back-off starts at 10 s and doubles)
    first = {name: isvc_condition(cluster, ns, name) for name in expected}
    restarts0 = {name: _restarts(cluster, ns, name) for name in expected}
    deadline = time.monotonic() + 60
    restarted = False
    while True:
        for name, reason in expected.items():
            ready = isvc_condition(cluster, ns, name)
            assert ready.get("reason") == reason, (name, ready)
            assert ready.get("message") == first[name].get("message"), (name, ready, first[name])
            stalled = isvc_condition(cluster, ns, name, "Stalled")
            assert stalled.get("status") == "True", (name, stalled)
            assert isvc_condition(cluster, ns, name, "Reconciling").get("status") != "True", name
        if restarted:
            break
        restarted = all(_restarts(cluster, ns, name) > restarts0[name] for name in expected)
        if not restarted:
            assert time.monotonic() < deadline, (
                "the containers restarted in the window (the check saw at least one restart each)",
                restarts0,
            )
            time.sleep(2)
    cluster.kubectl(
        "delete", "inferenceservice", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=130
    )


def _restarts(cluster: Cluster, ns: str, name: str) -> int:
    return sum(
        c.get("restartCount", 0)
        for p in runtime_pods(cluster, ns, name)
        for c in p["status"].get("containerStatuses", [])
    )
