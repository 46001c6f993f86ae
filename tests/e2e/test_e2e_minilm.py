"""examples/minilm.yaml on the real node, checked as a user would with kubectl and a client.

One InferenceService for the module (a runtime pod start costs tens of seconds on two cores); the
tests run in file order and each leaves it Ready.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.operator.api import DEFAULT_IMAGE

from hack.devtools.prom import PrometheusServer
from tests.e2e.conftest import accepting, isvc_condition, runtime_pods, wait_isvc
from tests.support.cluster import Cluster, wait_until
from tests.support.perf_analyzer import MINILM, check_report, command, perf_analyzer, run

ROOT = Path(__file__).resolve().parents[2]
NAME = "minilm"
SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar.",
    "The stock market fell sharply today.",
]


@pytest.fixture(scope="module")
def ns(cluster: Cluster, operator_release: str) -> Iterator[str]:
    name = f"e2e-minilm-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    try:
        cluster.kubectl("apply", "-n", name, "-f", str(ROOT / "examples" / "minilm.yaml"))
        cluster.kubectl(
            "wait",
            "-n",
            name,
            "--for=condition=Ready",
            f"inferenceservice/{NAME}",
            "--timeout=300s",
            timeout=320,
        )
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _ts(s: str) -> float:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _cluster_ip(cluster: Cluster, ns: str) -> str:
    svc = cluster.get_json("service", NAME, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
    return accepting(f"{svc['spec']['clusterIP']}:{port}")


def _embed(url: str, texts: list[str]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=30.0, connection_timeout=10.0)
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    res = client.infer("minilm", [inp], outputs=[httpclient.InferRequestedOutput("embedding")])
    out = res.as_numpy("embedding")
    assert out is not None
    return np.asarray(out, dtype=np.float32)


def _pod_metric(cluster: Cluster, pod: dict[str, Any], metric: str) -> float:
    """A runtime metric read from the pod's /metrics on its pod IP (first sample)."""
    import httpx

    text = httpx.get(f"http://{pod['status']['podIP']}:8080/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(metric)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M)
    assert m, f"{metric} not in the pod's /metrics"
    return float(m.group(1))


def test_runtime_pod_runs_from_the_local_image_and_is_ready_only_after_warmup(
    cluster: Cluster, ns: str
) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    assert pod["spec"]["nodeName"] == "kubeinfer-node"
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["image"] == DEFAULT_IMAGE
    assert cs["imageID"], "containerd reports the image it ran"
    assert cs["ready"] is True and cs["restartCount"] == 0
    started = _ts(cs["state"]["running"]["startedAt"])
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    load = _pod_metric(cluster, pod, "kubeinfer_model_load_seconds")
    warm = _pod_metric(cluster, pod, "kubeinfer_warmup_seconds")
    assert warm > 0, "warmup ran"
    # the pod turned Ready only after the model loaded and warmed up (1 s: timestamps are whole seconds)
    assert _ts(ready["lastTransitionTime"]) >= started + load + warm - 1.0


def test_service_endpointslice_lists_the_pod(cluster: Cluster, ns: str) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    slices = cluster.get_json("endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={NAME}")["items"]
    ready_ips = {
        a
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for a in e["addresses"]
    }
    assert pod["status"]["podIP"] in ready_ips


def test_tritonclient_through_the_cluster_ip_returns_embeddings(cluster: Cluster, ns: str) -> None:
    emb = _embed(_cluster_ip(cluster, ns), SENTENCES)
    assert emb.shape == (3, 384)
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    paraphrase, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert paraphrase > unrelated + 0.2, (paraphrase, unrelated)


def test_clients_people_use_through_the_service_get_the_same_answers(cluster: Cluster, ns: str) -> None:
    """The OpenAI SDK, Triton's statistics (REST and gRPC) and the protocol's error shape, through the
    Service's ClusterIP as a pod in the cluster reaches them."""
    import httpx
    import openai
    import tritonclient.grpc as grpcclient

    url = _cluster_ip(cluster, ns)
    expected = _embed(url, SENTENCES)
    client = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0, timeout=30)
    response = client.embeddings.create(model=NAME, input=SENTENCES)
    got = np.array([d.embedding for d in response.data], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert response.usage.prompt_tokens > len(SENTENCES)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")

    rest_stats = httpclient.InferenceServerClient(url).get_inference_statistics(NAME)["model_stats"]
    assert [s["name"] for s in rest_stats] == [NAME] and rest_stats[0]["inference_count"] >= 2 * len(
        SENTENCES
    )
    svc = cluster.get_json("service", NAME, "-n", ns)
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    grpc = grpcclient.InferenceServerClient(f"{svc['spec']['clusterIP']}:{grpc_port}")
    (grpc_stats,) = grpc.get_inference_statistics(NAME).model_stats
    assert grpc_stats.inference_count >= rest_stats[0]["inference_count"]

    r = httpx.get(f"http://{url}/v2/no/such/route", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_prometheus_discovers_the_pod_and_the_autoscaler_reads_its_metrics(
    cluster: Cluster, ns: str, node_prometheus: PrometheusServer
) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    target = f"{pod['status']['podIP']}:8080"

    def discovered() -> dict[str, Any] | None:
        for t in node_prometheus.active_targets():
            if t["labels"].get("instance") == target and t["health"] == "up":
                return dict(t["labels"])
        return None

    labels = wait_until(discovered, timeout=60, interval=1.0, message=f"kubernetes_sd target {target} up")
    # the chart's relabelling: the two labels the autoscaler's queries select on
    assert labels["namespace"] == ns and labels["inferenceservice"] == NAME
    url = _cluster_ip(cluster, ns)
    deadline = time.monotonic() + 120
    observed: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for _ in range(5):
            _embed(url, SENTENCES[:1])
        status = cluster.get_json("inferenceservice", NAME, "-n", ns).get("status") or {}
        observed = status.get("observed") or {}
        if observed.get("p99Seconds") is not None and observed.get("requestRate"):
            break
        time.sleep(1.0)
    assert observed.get("p99Seconds") is not None, f"the autoscaler read no P99 from Prometheus: {observed}"
    assert 0 < observed["p99Seconds"] < 10


def test_pods_resolve_service_names_through_cluster_dns(cluster: Cluster, ns: str) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    script = (
        "import socket;"
        f"print(socket.gethostbyname('{NAME}.{ns}.svc.cluster.local'));"
        "print(socket.gethostbyname('kubernetes.default'))"
    )
    out = cluster.kubectl(
        "exec", "-n", ns, pod["metadata"]["name"], "--", "python3", "-c", script
    ).stdout.split()
    svc_ip = cluster.get_json("service", NAME, "-n", ns)["spec"]["clusterIP"]
    assert out == [svc_ip, "10.0.0.1"]


def test_max_queue_delay_change_reaches_the_running_pod_without_restart(cluster: Cluster, ns: str) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    # autoscaling off: otherwise the autoscaler's status.maxQueueDelay is the value in force
    cluster.kubectl(
        "patch", "inferenceservice", NAME, "-n", ns, "--type=merge",
        "-p", '{"spec":{"autoscaling":{"enabled":false},"batching":{"maxQueueDelay":"17ms"}}}',
    )  # fmt: skip
    wait_until(
        lambda: abs(_pod_metric(cluster, pod, "kubeinfer_max_queue_delay_seconds") - 0.017) < 1e-9,
        timeout=120,
        interval=2.0,
        message="the runtime applies maxQueueDelay 17ms from the updated ConfigMap volume",
    )
    (same,) = runtime_pods(cluster, ns, NAME)
    assert same["metadata"]["name"] == pod["metadata"]["name"]
    assert same["status"]["containerStatuses"][0]["restartCount"] == 0


def test_scale_in_under_load_through_the_service_fails_no_request(cluster: Cluster, ns: str) -> None:
    cluster.kubectl(
        "patch", "inferenceservice", NAME, "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    wait_until(
        lambda: len([p for p in runtime_pods(cluster, ns, NAME) if _ready(p)]) == 2,
        timeout=300,
        interval=2.0,
        message="2 ready runtime pods",
    )
    wait_isvc(cluster, ns, NAME, "True")
    url = _cluster_ip(cluster, ns)
    failures: list[str] = []
    done = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal done
        while not stop.is_set():
            try:
                _embed(url, SENTENCES[:1])
                done += 1
            except Exception as e:  # every failure is reported
                failures.append(repr(e))
            time.sleep(0.05)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(3)
        cluster.kubectl(
            "patch", "inferenceservice", NAME, "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":1}}'
        )
        # until the terminating pod is gone: through its shutdown delay, drain and exit
        selector = f"kubeinfer.io/inferenceservice={NAME}"
        wait_until(
            lambda: len(cluster.get_json("pods", "-n", ns, "-l", selector)["items"]) == 1,
            timeout=120,
            interval=1.0,
            message="the scaled-in pod gone",
        )
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert done > 20
    assert failures == []


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def test_rollout_restart_completes_and_the_operator_keeps_it(cluster: Cluster, ns: str) -> None:
    (before,) = runtime_pods(cluster, ns, NAME)
    cluster.kubectl("rollout", "restart", f"deployment/{NAME}", "-n", ns)
    cluster.kubectl("rollout", "status", f"deployment/{NAME}", "-n", ns, "--timeout=300s", timeout=320)
    (after,) = runtime_pods(cluster, ns, NAME)
    assert after["metadata"]["name"] != before["metadata"]["name"]
    dep = cluster.get_json("deployment", NAME, "-n", ns)
    assert "kubectl.kubernetes.io/restartedAt" in dep["spec"]["template"]["metadata"].get("annotations", {})
    wait_isvc(cluster, ns, NAME, "True")
    # the operator reconciles on the Deployment's events during the rollout: none undid the annotation
    cluster.kubectl("annotate", "inferenceservice", NAME, "-n", ns, "e2e/poke=1", "--overwrite")  # reconcile
    time.sleep(5)
    dep = cluster.get_json("deployment", NAME, "-n", ns)
    assert "kubectl.kubernetes.io/restartedAt" in dep["spec"]["template"]["metadata"].get("annotations", {})


def test_killed_runtime_is_restarted_and_ready_follows(cluster: Cluster, ns: str) -> None:
    (pod,) = runtime_pods(cluster, ns, NAME)
    # kill -9 from the node (inside the pid namespace, SIGKILL to its init is ignored)
    assert cluster.info is not None
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    info = json.loads(
        subprocess.run([*cluster.info.crictl, "inspect", cid], capture_output=True, check=True).stdout
    )
    os.kill(int(info["info"]["pid"]), signal.SIGKILL)
    wait_isvc(cluster, ns, NAME, "False", timeout=120)
    reason = isvc_condition(cluster, ns, NAME).get("reason")
    assert reason, "Ready=False carries a reason"
    wait_isvc(cluster, ns, NAME, "True", timeout=300)
    (again,) = runtime_pods(cluster, ns, NAME)
    assert again["metadata"]["name"] == pod["metadata"]["name"]
    assert again["status"]["containerStatuses"][0]["restartCount"] >= 1


def test_perf_analyzer_through_the_service_measures_it_with_the_server_side_breakdown(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """Triton's perf_analyzer, unmodified, through the Service's ClusterIP over REST and gRPC: a sweep
    at concurrency 1 and 2 with the queue and compute times it reads from the statistics extension.
    Last of the module: its load may make the autoscaler add a replica, which the tests above do not
    expect."""
    svc = cluster.get_json("service", NAME, "-n", ns)
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    for protocol, port in (("http", ports["http"]), ("grpc", ports["grpc"])):
        report = tmp_path / f"{protocol}.csv"
        address = f"{svc['spec']['clusterIP']}:{port}"
        args = command(perf_analyzer(), NAME, address, protocol, report, *MINILM)
        proc, shown = run(args, tmp_path)
        assert proc.returncode == 0, shown
        rows = check_report(report, shown)
        print(f"{protocol}: " + ", ".join(f"{r['Inferences/Second']:.0f}/s" for r in rows))
