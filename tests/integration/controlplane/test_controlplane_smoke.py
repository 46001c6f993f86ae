"""Smoke tests proving the local control plane and Prometheus are the real thing.

Real etcd + kube-apiserver v1.37.2 + kube-controller-manager (``cluster`` fixture) and Debian's
Prometheus (``prometheus`` fixture); no mock anywhere.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hack.devtools.prom import PrometheusServer
from tests.support.cluster import Cluster, KubectlError, wait_until

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.kubeinfer.io"},
    "spec": {
        "group": "smoke.kubeinfer.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _widget(namespace: str, name: str, size: object) -> dict[str, object]:
    return {
        "apiVersion": "smoke.kubeinfer.io/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"size": size},
    }


def _exists(cluster: Cluster, *args: str) -> bool:
    return cluster.kubectl("get", *args, "--ignore-not-found", "-o", "name").stdout.strip() != ""


@pytest.fixture(scope="module")
def widget_crd(cluster: Cluster) -> Iterator[str]:
    cluster.apply(CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.kubeinfer.io", "--timeout=30s")
    yield "widgets.smoke.kubeinfer.io"
    cluster.kubectl("delete", "crd", "widgets.smoke.kubeinfer.io", "--wait=false", check=False)


def test_kubectl_version_reports_server_v1_37_2(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == "v1.37.2"
    assert (out["serverVersion"]["major"], out["serverVersion"]["minor"]) == ("1", "37")
    assert out["clientVersion"]["gitVersion"] == "v1.37.2"


def test_helm_installs_a_chart_gated_on_the_server_version(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    assert cluster.helm("version", "--short").stdout.startswith("v3.22.0")
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    chart_yaml = "apiVersion: v2\nname: smoke\nversion: 0.1.0\nkubeVersion: '{}'\n"
    (chart / "Chart.yaml").write_text(chart_yaml.format(">=1.38.0-0"))
    # Helm reads the server's version: a chart that needs a newer Kubernetes is refused ...
    r = cluster.helm("install", "too-new", str(chart), "-n", namespace, check=False)
    assert r.returncode != 0 and "v1.37.2" in r.stderr
    # ... and one that fits installs, rendering the server version into the object.
    (chart / "Chart.yaml").write_text(chart_yaml.format(">=1.37.0-0 <1.38.0-0"))
    cluster.helm("install", "fits", str(chart), "-n", namespace, "--wait", "--timeout=60s")
    cm = cluster.get_json("configmap", "fits-cm", "-n", namespace)
    assert cm["data"] == {"kube": "v1.37.2"}
    releases = json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("fits", "deployed")]


def test_crd_and_custom_resource_with_schema_validation(
    cluster: Cluster, namespace: str, widget_crd: str
) -> None:
    cluster.apply(_widget(namespace, "w1", 3))
    got = cluster.get_json("widgets.smoke.kubeinfer.io", "w1", "-n", namespace)
    assert got["spec"] == {"size": 3}
    assert got["metadata"]["uid"]
    # The API server enforces the structural schema: a string where an integer goes is rejected.
    with pytest.raises(KubectlError, match=r"spec\.size"):
        cluster.apply(_widget(namespace, "w2", "big"))
    with pytest.raises(KubectlError, match=r"spec\.size"):
        cluster.apply(_widget(namespace, "w3", 0))


def test_deployment_gets_replicaset_and_pods_and_gc_removes_them(cluster: Cluster, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]},
            },
        },
    }
    cluster.apply(deployment)
    uid = cluster.get_json("deployment", "web", "-n", namespace)["metadata"]["uid"]

    def replicaset() -> dict[str, object] | None:
        items = cluster.get_json("replicasets", "-n", namespace, "-l", "app=web")["items"]
        return items[0] if items else None

    rs = wait_until(replicaset, timeout=30, message="kube-controller-manager to create the ReplicaSet")
    owners = rs["metadata"]["ownerReferences"]  # type: ignore[index]
    assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owners] == [
        ("Deployment", "web", uid, True)
    ]
    pods = wait_until(
        lambda: len(cluster.get_json("pods", "-n", namespace, "-l", "app=web")["items"]) == 2,
        timeout=30,
        message="the ReplicaSet controller to create 2 Pods",
    )
    assert pods
    # Delete the owner only (background cascade): the garbage collector removes the dependents.
    cluster.kubectl("delete", "deployment", "web", "-n", namespace, "--cascade=background")
    wait_until(
        lambda: (
            not _exists(cluster, "replicasets", "-n", namespace, "-l", "app=web")
            and not _exists(cluster, "pods", "-n", namespace, "-l", "app=web")
        ),
        timeout=60,
        message="the garbage collector to delete the ReplicaSet and its Pods",
    )


def test_custom_resource_owner_deletion_collects_dependents(
    cluster: Cluster, namespace: str, widget_crd: str
) -> None:
    cluster.apply(_widget(namespace, "owner", 1))
    owner = cluster.get_json("widgets.smoke.kubeinfer.io", "owner", "-n", namespace)
    ref = {
        "apiVersion": "smoke.kubeinfer.io/v1",
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for name in ("dep-a", "dep-b"):
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [ref]},
                "data": {"k": "v"},
            }
        )
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned", "namespace": namespace}}
    )
    cluster.kubectl("delete", "widgets.smoke.kubeinfer.io", "owner", "-n", namespace, "--wait=false")
    wait_until(
        lambda: (
            not _exists(cluster, "configmap", "dep-a", "-n", namespace)
            and not _exists(cluster, "configmap", "dep-b", "-n", namespace)
        ),
        timeout=60,
        message="owned ConfigMaps to be garbage-collected",
    )
    assert _exists(cluster, "configmap", "unowned", "-n", namespace)


def test_service_account_without_permissions_gets_403(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = cluster.kubeconfig_for_service_account(namespace, "nobody", tmp_path / "nobody.kubeconfig")
    api = client.CoreV1Api(cluster.api_client(kubeconfig))
    with pytest.raises(ApiException) as e:
        api.list_namespaced_config_map(namespace)
    assert e.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in str(e.value.body)
    r = cluster.kubectl("--kubeconfig", str(kubeconfig), "get", "configmaps", "-n", namespace, check=False)
    assert r.returncode != 0 and "Forbidden" in r.stderr
    # Same through impersonation (kubectl honours `as` in the kubeconfig).
    as_kc = cluster.kubeconfig_for_impersonation(
        tmp_path / "as.kubeconfig", user=f"system:serviceaccount:{namespace}:nobody"
    )
    r = cluster.kubectl("--kubeconfig", str(as_kc), "get", "configmaps", "-n", namespace, check=False)
    assert r.returncode != 0 and "Forbidden" in r.stderr
    # RBAC is what decides: a Role + RoleBinding grants exactly the listed verbs.
    cluster.kubectl("create", "role", "cm-reader", "--verb=list", "--resource=configmaps", "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "nobody-cm",
        "--role=cm-reader",
        f"--serviceaccount={namespace}:nobody",
        "-n",
        namespace,
    )
    wait_until(
        lambda: api.list_namespaced_config_map(namespace) is not None,
        timeout=15,
        message="the RoleBinding to take effect",
    )
    with pytest.raises(ApiException) as e:
        api.list_namespaced_secret(namespace)
    assert e.value.status == 403


def test_admin_token_and_python_client(cluster: Cluster) -> None:
    if cluster.info is None:
        pytest.skip("needs the locally started cluster (KUBEINFER_TEST_KUBECONFIG is set)")
    cfg = client.Configuration()
    cfg.host = cluster.server
    cfg.ssl_ca_cert = str(cluster.info.ca_path)
    cfg.api_key = {"authorization": f"Bearer {cluster.info.admin_token}"}
    with client.ApiClient(cfg) as api_client:
        names = [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
    assert {"default", "kube-system"} <= set(names)


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b"# HELP smoke_value A constant.\n# TYPE smoke_value gauge\nsmoke_value 42\n"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_prometheus_scrapes_a_target_and_answers_promql(prometheus: PrometheusServer) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        prometheus.set_targets([(target, {"namespace": "smoke", "inferenceservice": "echo"})])
        prometheus.wait_for_scrape(target, timeout=30)
        (sample,) = prometheus.query('smoke_value{namespace="smoke",inferenceservice="echo"}')
        assert float(sample["value"][1]) == 42.0
        assert sample["metric"]["instance"] == target
        assert (
            prometheus.query_value('sum by (inferenceservice) (smoke_value{namespace="smoke"}) * 2') == 84.0
        )
        # Targets change without a restart: with none left, `up` for it goes stale/absent.
        prometheus.set_targets([])
        wait_until(
            lambda: all(t["labels"].get("instance") != target for t in prometheus.active_targets()),
            timeout=20,
            message="the target to be dropped",
        )
    finally:
        server.shutdown()
        server.server_close()
