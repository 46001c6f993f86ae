"""RBAC is sufficient: the real operator, authenticated as the chart's ServiceAccount (a real token),
reconciles an InferenceService to Ready and autoscales it, and is never denied.

The chart is installed in namespaced mode (``watchNamespaces: [<ns>]``: Roles, the stricter RBAC)
with the in-cluster operator at 0 replicas; the operator runs as a local process with a kubeconfig
holding a TokenRequest token of the chart's ServiceAccount. The runtime pods are run by
hack/localpods.py with a stand-in runtime whose metrics say the service is overloaded, so the
autoscaler writes the Deployment's scale subresource, the status and Events. Every path the
operator takes is then exercised: watch/list of the owned kinds, server-side apply (create +
patch), status patches, Events, PodDisruptionBudget delete, PersistentVolumeClaim get, peering.
"""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

from hack.localpods import LocalPods
from tests.support.cluster import Cluster, wait_until
from tests.support.operator_proc import OperatorProcess
from tests.support.prom import PrometheusServer
from tests.unit.chart.helm_render import CHART

ROOT = Path(__file__).resolve().parents[3]
FAKE = Path(__file__).with_name("fake_runtime.py")
#: A denial as the operator, kopf or an HTTP client logs it (not any "403", e.g. a timestamp's ms).
DENIED = re.compile(
    r"[Ff]orbidden|Not enough permissions|cannot (get|list|watch|create|patch|delete)|"
    r'HTTP/1\.1" 403|\bstatus[=:]\s*403\b|\b403 Forbidden'
)


def _isvc(namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "minilm.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["autoscaling"].update(
        {
            "maxReplicas": 2,
            "window": "5s",
            "scaleUpCooldown": "2s",
            "scaleDownCooldown": "2s",
            "scaleDownStabilization": "5s",
            "batchTimeoutCooldown": "2s",
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
                "patch",
                name,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"metadata": {"finalizers": null}}',
                check=False,
            )


def _condition(cluster: Cluster, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    st = cluster.get_json("inferenceservice", name, "-n", namespace).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c.get("type") == type_), None)


def test_chart_rbac_is_sufficient_for_the_operator(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: PrometheusServer
) -> None:
    release = f"rb-{secrets.token_hex(3)}"
    cluster.helm(
        "install", release, CHART, "--namespace", namespace,
        "--set", "replicas=0", "--set", f"watchNamespaces[0]={namespace}", "--set", f"peering.name={release}",
    )  # fmt: skip
    try:
        sa = f"{release}-kubeinfer"
        kubeconfig = cluster.kubeconfig_for_service_account(namespace, sa, tmp_path / "sa.kubeconfig")
        # the token really is the ServiceAccount's: it may not read Secrets
        r = cluster.kubectl("--kubeconfig", kubeconfig, "get", "secrets", "-n", namespace, check=False)
        assert r.returncode != 0 and "forbidden" in r.stderr.lower()

        env = {"KUBEINFER_PROMETHEUS_URL": prometheus.url, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "2"}
        with OperatorProcess(
            kubeconfig, log_dir=tmp_path, namespaces=[namespace], peering=release, extra_env=env
        ) as op:
            try:
                op.wait_ready()
                cluster.apply(_isvc(namespace))
                # a model on a PVC that does not exist: the operator's GET says 404, not 403
                pvc_isvc = {
                    "apiVersion": "kubeinfer.io/v1alpha1",
                    "kind": "InferenceService",
                    "metadata": {"name": "on-pvc", "namespace": namespace},
                    "spec": {
                        "model": {"uri": "pvc://missing-claim/model"},
                        "resources": {"gpus": 0},
                        "runtime": {"device": "cpu"},
                    },
                }
                cluster.apply(pvc_isvc)
                wait_until(
                    lambda: (
                        cluster.kubectl(
                            "get", "deployment", "minilm", "-n", namespace, check=False
                        ).returncode
                        == 0
                    ),
                    timeout=60,
                    message="the operator's Deployment",
                )
                with LocalPods(
                    cluster.kubeconfig,
                    namespace,
                    "minilm",
                    workdir=tmp_path / "pods",
                    prometheus=prometheus,
                    poll_interval=0.5,
                    termination_grace_seconds=5,
                    runtime_command=[sys.executable, str(FAKE)],
                ):
                    wait_until(
                        lambda: (
                            (_condition(cluster, namespace, "minilm", "Ready") or {}).get("status") == "True"
                        ),
                        timeout=60,
                        message="InferenceService Ready",
                    )
                    # the autoscaler reads the (overloaded) signals and scales out through deployments/scale
                    wait_until(
                        lambda: (
                            cluster.get_json("deployment", "minilm", "-n", namespace)["spec"]["replicas"] == 2
                        ),
                        timeout=60,
                        message="autoscaled to 2 replicas",
                    )
                    active = _condition(cluster, namespace, "minilm", "AutoscalingActive")
                    assert active is not None and active["status"] == "True", active
                    wait_until(
                        lambda: (
                            (_condition(cluster, namespace, "minilm", "Ready") or {}).get("status") == "True"
                            and cluster.get_json("deployment", "minilm", "-n", namespace)["status"].get(
                                "readyReplicas"
                            )
                            == 2
                        ),
                        timeout=60,
                        message="2 ready replicas",
                    )
                    cluster.get_json("poddisruptionbudget", "minilm", "-n", namespace)
                    # autoscaling off at 1 replica: the operator takes replicas back and deletes the PDB
                    cluster.kubectl(
                        "patch", "inferenceservice", "minilm", "-n", namespace, "--type=merge",
                        "-p", '{"spec": {"replicas": 1, "autoscaling": {"enabled": false}}}',
                    )  # fmt: skip
                    wait_until(
                        lambda: (
                            cluster.kubectl("get", "pdb", "minilm", "-n", namespace, check=False).returncode
                            != 0
                        ),
                        timeout=60,
                        message="PodDisruptionBudget deleted",
                    )
                pvc_ready = _condition(cluster, namespace, "on-pvc", "Ready")
                assert pvc_ready is not None and pvc_ready["status"] == "False"
                assert "missing-claim" in pvc_ready["message"], pvc_ready
                events = cluster.get_json("events", "-n", namespace)["items"]
                reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "minilm"}
                assert "Autoscaled" in reasons, reasons
                assert op.reconciles() > 0
            finally:
                # while the operator still runs (kopf removes its finalizer), so the namespace can go
                _delete_isvcs(cluster, namespace)
            assert cluster.get_json("inferenceservice", "-n", namespace)["items"] == []
            log = op.log()
        denied = [line for line in log.splitlines() if DENIED.search(line)]
        assert denied == [], "the operator was denied:\n" + "\n".join(denied[:20])
    finally:
        _delete_isvcs(cluster, namespace)
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
