"""Errors the user must see on the InferenceService: a persistent API-server error on the operator's
writes becomes ``Ready=False ApiServerError`` (once, with one Warning Event) and clears on success."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubeinfer.operator import api

from hack.devtools.operator_proc import OperatorProcess
from tests.support.cluster import Cluster, wait_until


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: every call to it is refused


def _ready(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    r = cluster.kubectl("get", "kisvc", name, "-n", ns, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    conds = (json.loads(r.stdout).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), None)


@pytest.fixture
def deployments_refused(cluster: Cluster, op_namespace: str) -> Iterator[str]:
    """A fail-closed validating webhook on Deployments of ``op_namespace`` whose server is down: every
    Deployment create/update there fails with 500 ``failed calling webhook``. Yields its name."""
    name = f"kubeinfer-test-deny-{op_namespace}"
    cluster.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "deny.kubeinfer.test",
                    "clientConfig": {"url": f"https://127.0.0.1:{_closed_port()}/validate"},
                    "rules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": op_namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 2,
                }
            ],
        }
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found", check=False)


@pytest.mark.timeout(180)
def test_persistent_api_error_becomes_a_condition_and_clears(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess, deployments_refused: str
) -> None:
    name = "api-error"
    cluster.apply(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": name},
            "spec": {
                "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
                "runtime": {"device": "cpu"},
                "replicas": 1,
            },
        },
        "-n",
        op_namespace,
    )
    ready = wait_until(
        lambda: (c := _ready(cluster, op_namespace, name)) and c["reason"] == "ApiServerError" and c,
        timeout=60,
        message="Ready=False ApiServerError",
    )
    assert ready["status"] == "False"
    assert ready["message"].startswith("3 consecutive reconciles failed; retrying with back-off: ")
    assert "failed calling webhook" in ready["message"], ready["message"]
    first_transition = ready["lastTransitionTime"]

    def warning_events() -> list[dict[str, Any]]:
        events = cluster.get_json(
            "events",
            "-n",
            op_namespace,
            "--field-selector",
            f"involvedObject.name={name},reason=ApiServerError",
        )["items"]
        return [e for e in events if e["involvedObject"]["kind"] == api.KIND]

    wait_until(warning_events, timeout=10, message="ApiServerError Event")
    # further failed reconciles (resync every 2 s) rewrite nothing and post no second Event
    rv = cluster.get_json("kisvc", name, "-n", op_namespace)["metadata"]["resourceVersion"]
    time.sleep(8)
    assert cluster.get_json("kisvc", name, "-n", op_namespace)["metadata"]["resourceVersion"] == rv
    assert len(warning_events()) == 1
    assert cluster.kubectl("get", "deployment", name, "-n", op_namespace, check=False).returncode != 0

    cluster.kubectl("delete", "validatingwebhookconfiguration", deployments_refused)
    wait_until(
        lambda: cluster.kubectl("get", "deployment", name, "-n", op_namespace, check=False).returncode == 0,
        timeout=90,
        message="the Deployment once the webhook is gone",
    )
    cleared = wait_until(
        lambda: (c := _ready(cluster, op_namespace, name)) and c["reason"] != "ApiServerError" and c,
        timeout=30,
        message="Ready no longer ApiServerError",
    )
    assert cleared["status"] == "False"  # no kubelet here: the pods never become available
    assert cleared["lastTransitionTime"] == first_transition  # False all along
