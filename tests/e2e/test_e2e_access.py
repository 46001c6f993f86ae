"""examples/minilm-auth.yaml on the real node: who may call the model.

The chart's operator (``operator_release``) reconciles the example with a Secret made here (a random
token). Through the Service's ClusterIP, as a pod in the cluster reaches it: infer without the token
is 401 (REST) / UNAUTHENTICATED (gRPC), with it 200 and a real embedding; health and ``/metrics`` need
no token. The NetworkPolicy exists, owned by the InferenceService. The node's pod network is the plain
CNI bridge plugin (hack/podnetwork.py: bridge, host-local, portmap, loopback; no policy agent), which
does not enforce NetworkPolicy: a pod the policy does not admit still connects, and the test says so,
so that a change of the pod network that starts enforcing it shows here. The token is in no log.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubeinfer.operator.api import DEFAULT_IMAGE

from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE, runtime_pods
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minilm-auth.yaml"
MODEL = "minilm"
INFER = {
    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["How do I reset my password?"]}]
}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


@pytest.fixture(scope="module")
def token() -> str:
    return f"e2e-{secrets.token_hex(24)}"


@pytest.fixture(scope="module")
def ns(cluster: Cluster, operator_release: str, example: dict[str, Any], token: str) -> Iterator[str]:
    """A namespace with the example's Secret (``token``) and the example, Ready."""
    name = f"e2e-access-{secrets.token_hex(3)}"
    ref = example["spec"]["server"]["auth"]["bearerTokenSecretRef"]
    cluster.create_namespace(name)
    try:
        cluster.kubectl(
            "create", "secret", "generic", ref["name"], "-n", name, f"--from-literal={ref['key']}={token}"
        )
        cluster.kubectl("apply", "-n", name, "-f", str(EXAMPLE))
        cluster.kubectl(
            "wait", "-n", name, "--for=condition=Ready", f"inferenceservice/{example['metadata']['name']}",
            "--timeout=300s", timeout=320,
        )  # fmt: skip
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _service(cluster: Cluster, ns: str, name: str) -> tuple[str, int, int]:
    """ClusterIP, REST port and gRPC port of the InferenceService's Service."""
    svc = cluster.get_json("service", name, "-n", ns)
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    return svc["spec"]["clusterIP"], ports["http"], ports["grpc"]


def test_rest_infer_needs_the_token_health_and_metrics_do_not(
    cluster: Cluster, ns: str, example: dict[str, Any], token: str
) -> None:
    ip, port, _ = _service(cluster, ns, example["metadata"]["name"])
    base = f"http://{ip}:{port}"
    url = f"{base}/v2/models/{MODEL}/infer"
    with httpx.Client(timeout=30) as http:
        anonymous = http.post(url, json=INFER)
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        wrong = http.post(url, json=INFER, headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        assert "not-the-token" not in wrong.text  # the refusal does not repeat what was sent
        ok = http.post(url, json=INFER, headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200, ok.text
        (out,) = ok.json()["outputs"]
        assert out["name"] == "embedding" and out["shape"] == [1, 384] and len(out["data"]) == 384
        assert http.get(f"{base}/v2/health/ready").status_code == 200
        assert http.get(f"{base}/v2/health/live").status_code == 200
        metrics = http.get(f"{base}/metrics")
        assert metrics.status_code == 200 and "kubeinfer_" in metrics.text
        # the metadata of the model is guarded like inference
        assert http.get(f"{base}/v2/models/{MODEL}").status_code == 401


def test_grpc_infer_needs_the_token_server_live_does_not(
    cluster: Cluster, ns: str, example: dict[str, Any], token: str
) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    ip, _, grpc_port = _service(cluster, ns, example["metadata"]["name"])
    client = grpcclient.InferenceServerClient(f"{ip}:{grpc_port}")
    assert client.is_server_live()
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"How do I reset my password?"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text])
    assert "UNAUTHENTICATED" in str(refused.value.status())
    result = client.infer(MODEL, [text], headers={"authorization": f"Bearer {token}"})
    embedding = result.as_numpy("embedding")
    assert embedding is not None and embedding.shape == (1, 384)


def test_the_networkpolicy_exists_and_is_owned(cluster: Cluster, ns: str, example: dict[str, Any]) -> None:
    name = example["metadata"]["name"]
    isvc = cluster.get_json("inferenceservice", name, "-n", ns)
    policy = cluster.get_json("networkpolicy", name, "-n", ns)
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"]) == ("InferenceService", isvc["metadata"]["uid"])
    (pod,) = runtime_pods(cluster, ns, name)
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items()  # it selects the runtime pod
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # the chart's Prometheus URL here is an IP on the node: no scraper namespace, only the peers' rule
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == example["spec"]["server"]["allowFrom"]
    assert sorted(p["port"] for p in rule["ports"]) == [8080, 8081]


def test_the_local_cni_does_not_enforce_the_networkpolicy(
    cluster: Cluster, ns: str, example: dict[str, Any]
) -> None:
    """A pod the policy does not admit (this namespace, without the allowed label) still connects:
    the bridge plugin has no policy engine. Where NetworkPolicy is enforced this request times out."""
    ip, port, _ = _service(cluster, ns, example["metadata"]["name"])
    script = (
        "import urllib.request;"
        f"print(urllib.request.urlopen('http://{ip}:{port}/v2/health/ready', timeout=10).status)"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "outsider", "labels": {"app": "outsider"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": DEFAULT_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", script],
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"cpu": "200m", "memory": "128Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    cluster.apply(pod, "-n", ns)
    phase = wait_until(
        lambda: (
            (p := cluster.get_json("pod", "outsider", "-n", ns)["status"].get("phase"))
            in {"Succeeded", "Failed"}
            and p
        ),
        timeout=120,
        interval=1.0,
        message="the outsider pod ran",
    )
    log = cluster.kubectl("logs", "outsider", "-n", ns).stdout
    assert phase == "Succeeded" and log.strip() == "200", f"{phase}: {log}"


def test_the_token_is_in_no_log(cluster: Cluster, ns: str, example: dict[str, Any], token: str) -> None:
    name = example["metadata"]["name"]
    operator_log = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, f"deployment/{RELEASE}").stdout
    (pod,) = runtime_pods(cluster, ns, name)
    runtime_log = cluster.kubectl("logs", "-n", ns, pod["metadata"]["name"]).stdout
    assert operator_log and runtime_log
    assert token not in operator_log, "the token is in the operator's log"
    assert token not in runtime_log, "the token is in the runtime's log"
    events = cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    assert token not in events
