"""tests/support/pod_sd.py: the kubernetes_sd pod-role labels served through http_sd."""

from __future__ import annotations

from typing import Any

from tests.support.pod_sd import pod_target_groups

M = "__meta_kubernetes_"


def _pod(ip: str | None = "10.244.0.7", ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "minilm-abc",
            "namespace": "demo",
            "uid": "u1",
            "labels": {
                "app.kubernetes.io/name": "kubeinfer-runtime",
                "kubeinfer.io/inferenceservice": "minilm",
            },
            "annotations": {"prometheus.io/path": "/metrics"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "minilm-5d", "controller": True}],
        },
        "spec": {
            "nodeName": "kubeinfer-node",
            "containers": [
                {
                    "name": "runtime",
                    "image": "ghcr.io/kubeinfer/runtime:0.1.0",
                    "ports": [
                        {"name": "http", "containerPort": 8080},
                        {"containerPort": 9000, "protocol": "UDP"},
                    ],
                },
                {"name": "sidecar", "image": "busybox"},
            ],
            "initContainers": [{"name": "init", "image": "busybox"}],
        },
        "status": {
            "podIP": ip,
            "hostIP": "10.244.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def test_one_target_per_container_port_and_one_per_portless_container() -> None:
    groups = pod_target_groups([_pod()])
    assert [g["targets"] for g in groups] == [["10.244.0.7:8080"], ["10.244.0.7:9000"], ["10.244.0.7"]]
    http = groups[0]["labels"]
    assert http[f"{M}namespace"] == "demo"
    assert http[f"{M}pod_name"] == "minilm-abc"
    assert http[f"{M}pod_label_kubeinfer_io_inferenceservice"] == "minilm"
    assert http[f"{M}pod_labelpresent_app_kubernetes_io_name"] == "true"
    assert http[f"{M}pod_annotation_prometheus_io_path"] == "/metrics"
    assert http[f"{M}pod_container_name"] == "runtime"
    assert http[f"{M}pod_container_port_name"] == "http"
    assert http[f"{M}pod_container_port_number"] == "8080"
    assert http[f"{M}pod_container_port_protocol"] == "TCP"
    assert http[f"{M}pod_container_init"] == "false"
    assert http[f"{M}pod_ready"] == "true"
    assert http[f"{M}pod_controller_kind"] == "ReplicaSet"
    assert groups[1]["labels"][f"{M}pod_container_port_protocol"] == "UDP"
    assert f"{M}pod_container_port_name" not in groups[2]["labels"]


def test_pods_without_an_ip_are_left_out_and_unready_is_false() -> None:
    assert pod_target_groups([_pod(ip=None)]) == []
    assert pod_target_groups([_pod(ready="False")])[0]["labels"][f"{M}pod_ready"] == "false"
