"""What a user sees on the real node when things go wrong: an image that does not exist, a GPU the node
does not have, a namespace deleted with its InferenceService."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import OPERATOR_NAMESPACE, OPERATOR_PODS, isvc_condition, wait_isvc
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]

#: A namespace's deletion within a minute is a bound in seconds on what the node does.
pytestmark = pytest.mark.quiet_node


def _isvc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "default"},
            "resources": {"gpus": 0, "cpu": "250m", "memory": "1Gi"},
            **spec,
            "runtime": {"device": "cpu", **spec.get("runtime", {})},
        },
    }


def _operator_pod(cluster: Cluster) -> dict[str, Any]:
    items = cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS)["items"]
    (pod,) = items
    return dict(pod)


def test_image_that_does_not_exist_is_ready_false_naming_the_pull_error(
    cluster: Cluster, operator_release: str, namespace: str
) -> None:
    cluster.apply(
        _isvc("noimage", runtime={"image": "localhost/kubeinfer/does-not-exist:0"}), "-n", namespace
    )
    cond = wait_until(
        lambda: (
            c
            if (c := isvc_condition(cluster, namespace, "noimage")).get("status") == "False"
            and c.get("reason") in ("ErrImagePull", "ImagePullBackOff")
            else None
        ),
        timeout=120,
        message="Ready=False with the pull error as reason",
    )
    assert "does-not-exist" in cond["message"]
    pod = _operator_pod(cluster)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, "the operator keeps running"


def test_gpu_example_on_a_node_without_gpu_is_unschedulable(
    cluster: Cluster, operator_release: str, namespace: str
) -> None:
    t0 = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "gpu-fp16.yaml"))
    name = yaml.safe_load((ROOT / "examples" / "gpu-fp16.yaml").read_text())["metadata"]["name"]
    cond = wait_isvc(cluster, namespace, name, "False", reason="Unschedulable", timeout=60)
    assert time.monotonic() - t0 < 60
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    assert pods and all(p["status"]["phase"] == "Pending" for p in pods)
    (scheduled,) = [c for c in pods[0]["status"]["conditions"] if c["type"] == "PodScheduled"]
    # the scheduler's own words are in the condition; it names only the first filter the node fails
    # (the GPU product nodeSelector), so the operator adds what the pod asks: nvidia.com/gpu
    assert scheduled["message"] in cond["message"]
    assert "nvidia.com/gpu: 1" in cond["message"]


def test_deleting_a_namespace_with_an_inferenceservice_completes_within_a_minute(
    cluster: Cluster, operator_release: str
) -> None:
    ns = "e2e-nsdelete"
    cluster.create_namespace(ns)
    cluster.apply(_isvc("gone"), "-n", ns)
    wait_until(
        lambda: cluster.get_json("pods", "-n", ns)["items"], timeout=60, message="the runtime pod was created"
    )
    t0 = time.monotonic()
    cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=60s", timeout=70)
    elapsed = time.monotonic() - t0
    assert cluster.kubectl("get", "namespace", ns, check=False).returncode != 0
    assert elapsed < 60
