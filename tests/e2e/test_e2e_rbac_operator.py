"""RBAC is sufficient: the chart's operator, installed in namespaced mode (``watchNamespaces: [<ns>]``:
Roles, the stricter RBAC), runs as a pod under the chart's ServiceAccount (a real projected token),
reconciles examples/minilm.yaml to Ready on the real node, autoscales it, and is never denied.

Only one node runs per machine, so this shares the session's cluster and Prometheus. The session's
cluster-wide release (``operator_release``, if a test installed it) is scaled to 0 meanwhile: two
operators with different peering objects would both act on this namespace; it is scaled back after.
The runtime pods are real. The autoscaler is made to scale out by a ``targetP99`` of 1 ms that no
request meets and a closed-loop load through the Service (8 clients: requests in flight, executors
busy, so not read as a drained backlog). Every path the operator takes is then exercised: watch/list
of the owned kinds, server-side apply (create + patch), the ConfigMap, deployments/scale, status
patches, Events, PodDisruptionBudget delete, PersistentVolumeClaim get, peering.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hack.devtools.prom import PrometheusServer
from tests.e2e.conftest import (
    CHART,
    FAST_READINESS,
    OPERATOR_NAMESPACE,
    OPERATOR_PODS,
    RELEASE,
    GraphCache,
    runtime_pods,
)
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
#: A denial as the operator, kopf or an HTTP client logs it (not any "403", e.g. a timestamp's ms).
DENIED = re.compile(
    r"[Ff]orbidden|Not enough permissions|cannot (get|list|watch|create|patch|delete)|"
    r'HTTP/1\.1" 403|\bstatus[=:]\s*403\b|\b403 Forbidden'
)

pytestmark = [pytest.mark.timeout(900), pytest.mark.quiet_node]


def _isvc(namespace: str, graph_cache: str) -> dict[str, Any]:
    """examples/minilm.yaml autoscaled to act at once, its graphs from the claim ``graph_cache``."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "minilm.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["server"] = {"graphCache": {"claimName": graph_cache}}
    doc["spec"]["autoscaling"].update(
        {
            "maxReplicas": 2,
            "targetP99": "1ms",  # never met: the autoscaler has to act
            "window": "5s",
            "scaleUpCooldown": "2s",
            "scaleDownCooldown": "2s",
            "scaleDownStabilization": "5s",
            "maxQueueDelayCooldown": "2s",
        }
    )
    return doc


def _delete_isvcs(cluster: Cluster, namespace: str) -> None:
    """Delete the namespace's InferenceServices and wait; strip finalizers of any left after 60 s."""
    r = cluster.kubectl("delete", "inferenceservice", "--all", "-n", namespace, "--timeout=60s", check=False)
    if r.returncode != 0:
        for name in cluster.kubectl(
            "get", "inferenceservice", "-n", namespace, "-o", "name", check=False
        ).stdout.split():
            cluster.kubectl(
                "patch", name, "-n", namespace, "--type=merge", "-p", '{"metadata": {"finalizers": null}}',
                check=False,
            )  # fmt: skip


def _condition(cluster: Cluster, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    st = cluster.get_json("inferenceservice", name, "-n", namespace).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c.get("type") == type_), None)


def _ready_pods(cluster: Cluster, namespace: str) -> int:
    return sum(
        1
        for p in runtime_pods(cluster, namespace, "minilm")
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    )


@contextlib.contextmanager
def _session_operator_paused(cluster: Cluster) -> Any:
    """Scale the session's cluster-wide operator (if installed) to 0, and back to 1 afterwards."""
    present = (
        cluster.kubectl("get", "deployment", RELEASE, "-n", OPERATOR_NAMESPACE, check=False).returncode == 0
    )
    if present:
        cluster.kubectl("scale", "deployment", RELEASE, "-n", OPERATOR_NAMESPACE, "--replicas=0")
        wait_until(
            lambda: not cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS)["items"],
            timeout=60,
            message="the session's operator pod gone",
        )
    try:
        yield
    finally:
        if present:
            cluster.kubectl("scale", "deployment", RELEASE, "-n", OPERATOR_NAMESPACE, "--replicas=1")
            cluster.kubectl(
                "rollout", "status", f"deployment/{RELEASE}", "-n", OPERATOR_NAMESPACE, "--timeout=120s",
                check=False, timeout=130,
            )  # fmt: skip


def test_chart_rbac_is_sufficient_for_the_operator(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    node_prometheus: PrometheusServer,
    graph_cache: GraphCache,
) -> None:
    release = f"rb-{secrets.token_hex(3)}"
    sa = f"{release}-kubeinfer"
    with _session_operator_paused(cluster):
        cluster.helm(
            "install", release, str(CHART), "--namespace", namespace,
            "--set", f"watchNamespaces[0]={namespace}", "--set", f"peering.name={release}",
            "--set", f"prometheus.url={node_prometheus.url}",
            "--set", "autoscaleIntervalSeconds=2", "--set", "logFormat=plain",
            *FAST_READINESS,
            "--wait", "--timeout=180s",
            timeout=200,
        )  # fmt: skip
        try:
            # the operator is a pod of this release, under its ServiceAccount; namespaced RBAC only
            (op_pod,) = cluster.get_json(
                "pods",
                "-n",
                namespace,
                "-l",
                f"{OPERATOR_PODS},app.kubernetes.io/instance={release}",
            )["items"]
            assert op_pod["spec"]["serviceAccountName"] == sa
            assert cluster.get_json("roles", "-n", namespace)["items"], "namespaced mode: Roles"
            # the ServiceAccount's token really is limited: it may not read Secrets
            kubeconfig = cluster.kubeconfig_for_service_account(namespace, sa, tmp_path / "sa.kubeconfig")
            r = cluster.kubectl(
                "--kubeconfig", str(kubeconfig), "get", "secrets", "-n", namespace, check=False
            )
            assert r.returncode != 0 and "forbidden" in r.stderr.lower()

            _exercise(cluster, namespace, op_pod, graph_cache.claim(namespace))
            log = cluster.kubectl("logs", "-n", namespace, op_pod["metadata"]["name"]).stdout
            denied = [line for line in log.splitlines() if DENIED.search(line)]
            assert denied == [], "the operator was denied:\n" + "\n".join(denied[:20])
        finally:
            _delete_isvcs(cluster, namespace)
            cluster.helm("uninstall", release, "--namespace", namespace, "--wait", check=False, timeout=120)


def _exercise(cluster: Cluster, namespace: str, op_pod: dict[str, Any], graph_cache: str) -> None:
    """minilm Ready, autoscaled to 2 ready pods, autoscaling off -> PDB deleted; a PVC model -> 404
    (not 403); all while the operator runs, and its InferenceServices deleted at the end."""
    try:
        cluster.apply(_isvc(namespace, graph_cache))
        # a model on a PVC that does not exist: the operator's GET says 404, not 403
        cluster.apply(
            {
                "apiVersion": "kubeinfer.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "on-pvc", "namespace": namespace},
                "spec": {
                    "model": {"uri": "pvc://missing-claim/model"},
                    "resources": {"gpus": 0},
                    "runtime": {"device": "cpu"},
                },
            }
        )
        wait_until(
            lambda: (_condition(cluster, namespace, "minilm", "Ready") or {}).get("status") == "True",
            timeout=300,
            interval=2.0,
            message="InferenceService Ready (a real runtime pod)",
        )
        svc = cluster.get_json("service", "minilm", "-n", namespace)
        url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v2/models/minilm/infer"
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a sentence"]}]}
        stop = threading.Event()

        def load() -> None:  # closed loop: requests in flight, executors busy (not a drained backlog)
            with httpx.Client(timeout=10) as client:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError):
                        client.post(url, json=body)

        loaders = [threading.Thread(target=load, daemon=True) for _ in range(8)]
        for t in loaders:
            t.start()
        try:
            # the autoscaler reads the signals and scales out through deployments/scale
            wait_until(
                lambda: cluster.get_json("deployment", "minilm", "-n", namespace)["spec"]["replicas"] == 2,
                timeout=120,
                interval=1.0,
                message="autoscaled to 2 replicas",
            )
            active = _condition(cluster, namespace, "minilm", "AutoscalingActive")
            assert active is not None and active["status"] == "True", active
            wait_until(
                lambda: (
                    _ready_pods(cluster, namespace) == 2
                    and (_condition(cluster, namespace, "minilm", "Ready") or {}).get("status") == "True"
                ),
                timeout=300,
                interval=2.0,
                message="2 ready replicas",
            )
        finally:
            stop.set()
            for t in loaders:
                t.join(timeout=15)
        cluster.get_json("poddisruptionbudget", "minilm", "-n", namespace)
        # autoscaling off at 1 replica: the operator takes replicas back and deletes the PDB
        cluster.kubectl(
            "patch", "inferenceservice", "minilm", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"replicas": 1, "autoscaling": {"enabled": false}}}',
        )  # fmt: skip
        wait_until(
            lambda: cluster.kubectl("get", "pdb", "minilm", "-n", namespace, check=False).returncode != 0,
            timeout=60,
            message="PodDisruptionBudget deleted",
        )
        pvc_ready = _condition(cluster, namespace, "on-pvc", "Ready")
        assert pvc_ready is not None and pvc_ready["status"] == "False"
        assert "missing-claim" in pvc_ready["message"], pvc_ready
        events = cluster.get_json("events", "-n", namespace)["items"]
        reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "minilm"}
        assert "Autoscaled" in reasons, reasons
        metrics = httpx.get(f"http://{op_pod['status']['podIP']}:8000/metrics", timeout=10).text
        reconciles = re.findall(r"^kubeinfer_operator_reconciles_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
        assert sum(float(v) for v in reconciles) > 0
    finally:
        # while the operator still runs (kopf removes its finalizer), so the namespace can go
        _delete_isvcs(cluster, namespace)
    assert cluster.get_json("inferenceservice", "-n", namespace)["items"] == []
