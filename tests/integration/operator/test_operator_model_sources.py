"""The operator with models from where they live, on a real control plane (no kubelet: pod statuses are
written here as the kubelet would write them): the API server takes the pod spec of every scheme (the
fetch init container, the emptyDir, the image volume), the pods the ReplicaSet creates carry it; a fetch
that fails is Ready=False ModelFetchFailed with its one-line cause, stays so through the back-off with
one Warning Event; an OCI model image that cannot be pulled is ModelFetchFailed too; a Secret outside the
operator's secretReferences.allowed is refused (SecretNotAllowed) and no Deployment is created; the
operator reads the API server's version at start, and an oci:// model where image volumes are not used
(KUBEINFER_IMAGE_VOLUMES=false) is refused (ImageVolumeUnsupported) and no Deployment is created."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.integration.operator.test_operator_reconcile import _create, _isvc_manifest, _ready
from tests.support.cluster import Cluster, get_object, wait_until

#: The operator of this module allows Secrets named model-* only.
POLICY = {"KUBEINFER_SECRET_REFERENCES_ALLOWED": "model-*"}
FETCH_CAUSE = "s3://models/bert: 403 AccessDenied"
MODEL_IMAGE = "registry.example.com/models/bert:v1"


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator for the module, with a Secret reference policy."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=2.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env={**TEST_ENV, **POLICY},
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])


def _pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    pods = wait_until(
        lambda: cluster.get_json("pods", "-n", ns, "-l", f"kubeinfer.io/inferenceservice={name}")["items"],
        timeout=30,
        message=f"a pod of {name}",
    )
    found: dict[str, Any] = pods[0]
    return found


def _write_status(cluster: Cluster, ns: str, pod: str, status: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch",
        "pod",
        pod,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def _warnings(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The reasons of the InferenceService's own Warning Events (not its Service's, which shares its name:
    the API server's IP allocator repair loop may post ``ClusterIPNotAllocated`` there when busy)."""
    selector = f"involvedObject.name={name},involvedObject.kind={api.KIND}"
    items = cluster.get_json("events", "-n", ns, "--field-selector", selector)["items"]
    return [e["reason"] for e in items if e["type"] == "Warning"]


def _wait_reason(cluster: Cluster, ns: str, name: str, reason: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        lambda: (c := _ready(cluster, ns, name)) and c["reason"] == reason and c,
        timeout=30,
        message=f"Ready=False {reason}",
    )
    return found


SCHEMES: dict[str, dict[str, Any]] = {
    "s3": {
        "uri": "s3://models/bert/",
        "s3": {"endpoint": "http://minio.storage.svc:9000", "addressingStyle": "path"},
        "credentials": {"secretName": "model-s3"},
        "fetch": {"sizeLimit": "2Gi"},
    },
    "hf": {
        "uri": "hf://sentence-transformers/all-MiniLM-L6-v2@main",
        "credentials": {"secretName": "model-hf"},
    },
    "https": {"uri": "https://models.example.com/m.tar.gz", "sha256": "ab" * 32},
    "oci": {"uri": f"oci://{MODEL_IMAGE}", "credentials": {"secretName": "model-pull"}},
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_the_api_server_takes_each_schemes_pod_spec(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess, scheme: str
) -> None:
    ns, name = op_namespace, f"src-{scheme}"
    _create(cluster, ns, _isvc_manifest(name, model=SCHEMES[scheme]))
    pod = _pod(cluster, ns, name)["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    runtime = pod["containers"][0]
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in runtime["volumeMounts"]
    assert runtime["terminationMessagePolicy"] == "File"
    assert pod["automountServiceAccountToken"] is False
    if scheme == "oci":
        assert volumes["model"]["image"] == {"reference": MODEL_IMAGE, "pullPolicy": "IfNotPresent"}
        assert pod["imagePullSecrets"] == [{"name": "model-pull"}] and "initContainers" not in pod
    else:
        (init,) = pod["initContainers"]
        assert init["name"] == "fetch" and init["args"][:3] == ["fetch", "--source", SCHEMES[scheme]["uri"]]
        assert "emptyDir" in volumes["model"]


def test_a_failing_fetch_is_model_fetch_failed_through_the_back_off(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "fetch-fails"
    _create(cluster, ns, _isvc_manifest(name, model={"uri": "s3://models/bert/"}))
    pod = _pod(cluster, ns, name)["metadata"]["name"]
    failed = {"exitCode": 1, "reason": "Error", "message": FETCH_CAUSE + "\n"}
    fetch = {"name": "fetch", "image": "x", "imageID": "", "ready": False}
    runtime = {
        "name": "runtime",
        "image": "x",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "PodInitializing"}},
    }
    states = [
        {**fetch, "restartCount": 0, "state": {"terminated": failed}},
        {
            **fetch,
            "restartCount": 0,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}},
            "lastState": {"terminated": failed},
        },
        {
            **fetch,
            "restartCount": 1,
            "state": {"running": {"startedAt": "2026-01-01T00:00:30Z"}},
            "lastState": {"terminated": failed},
        },
    ]
    _write_status(cluster, ns, pod, {"initContainerStatuses": [states[0]], "containerStatuses": [runtime]})
    first = _wait_reason(cluster, ns, name, "ModelFetchFailed")
    assert first["status"] == "False" and first["message"] == f"pod {pod} init container fetch: {FETCH_CAUSE}"
    for state in states[1:]:
        _write_status(cluster, ns, pod, {"initContainerStatuses": [state], "containerStatuses": [runtime]})
        time.sleep(3)  # the pod's watch event reconciles at once, the resync every 2 s
        seen = _ready(cluster, ns, name) or {}
        assert (seen.get("reason"), seen.get("message")) == ("ModelFetchFailed", first["message"]), state
        assert seen["lastTransitionTime"] == first["lastTransitionTime"]
    isvc = get_object(cluster, ns, "kisvc", name) or {}
    conditions = {c["type"]: c for c in isvc["status"]["conditions"]}
    assert conditions["Stalled"]["status"] == "True" and "Reconciling" not in conditions
    assert wait_until(lambda: _warnings(cluster, ns, name) or None, timeout=10) == ["ModelFetchFailed"]


def test_an_oci_model_image_that_cannot_be_pulled_is_model_fetch_failed(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "oci-pull-fails"
    _create(cluster, ns, _isvc_manifest(name, model={"uri": f"oci://{MODEL_IMAGE}"}))
    pod = _pod(cluster, ns, name)["metadata"]["name"]
    waiting = {
        "reason": "ErrImagePull",
        "message": f'failed to pull and unpack image "{MODEL_IMAGE}": not found',
    }
    runtime = {"name": "runtime", "image": "x", "imageID": "", "ready": False, "restartCount": 0}
    _write_status(cluster, ns, pod, {"containerStatuses": [{**runtime, "state": {"waiting": waiting}}]})
    cond = _wait_reason(cluster, ns, name, "ModelFetchFailed")
    assert f"model image {MODEL_IMAGE}" in cond["message"]


def test_a_secret_outside_the_policy_is_refused_and_nothing_is_applied(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "secret-refused"
    env = [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}]
    cluster.apply(_isvc_manifest(name, runtime={"device": "cpu", "env": env}), "-n", ns)
    cond = _wait_reason(cluster, ns, name, "SecretNotAllowed")
    assert cond["status"] == "False"
    assert 'spec.runtime.env[0].valueFrom.secretKeyRef.name: Secret "db-password"' in cond["message"]
    for kind in ("deployment", "configmap", "service"):
        assert get_object(cluster, ns, kind, name if kind != "configmap" else f"{name}-runtime") is None, kind
    assert "SecretNotAllowed" in wait_until(lambda: _warnings(cluster, ns, name) or None, timeout=10)
    # a name the policy allows: applied as usual
    allowed = [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "model-db", "key": "password"}}}]
    _create(cluster, ns, _isvc_manifest(name, runtime={"device": "cpu", "env": allowed}))


def test_the_operator_reads_the_api_servers_version_at_start(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)["gitVersion"]
    assert f"cluster capabilities: API server {version}; image volumes" in operator.log()


def test_an_oci_model_where_image_volumes_are_off_is_refused_and_nothing_is_applied(
    cluster: Cluster, op_namespace: str, namespace: str, tmp_path: Path
) -> None:
    ns, name = namespace, "oci-refused"
    off = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[ns],
        resync_seconds=2.0,
        log_dir=tmp_path,
        extra_env={**TEST_ENV, "KUBEINFER_IMAGE_VOLUMES": "false"},
        name="operator-image-volumes-off",
    )
    with off:
        off.wait_ready()
        cluster.apply(_isvc_manifest(name, model={"uri": f"oci://{MODEL_IMAGE}"}), "-n", ns)
        cond = _wait_reason(cluster, ns, name, "ImageVolumeUnsupported")
        assert cond["status"] == "False" and "imageVolumes: false" in cond["message"]
        assert cond["message"].startswith("spec.model.uri: oci:// models are mounted as image volumes")
        for kind in ("deployment", "configmap", "service"):
            assert (
                get_object(cluster, ns, kind, name if kind != "configmap" else f"{name}-runtime") is None
            ), kind
        assert "ImageVolumeUnsupported" in wait_until(
            lambda: _warnings(cluster, ns, name) or None, timeout=10
        )
        # another source is applied as usual by the same operator
        _create(cluster, ns, _isvc_manifest("s3-applied", model=SCHEMES["s3"]))
