"""hack/localpods.py against the real control plane: Pods from the kube-controller-manager are run
as local processes (the stand-in runtime), marked Ready, and the Deployment reports them."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hack.localpods import NO_KUBELET_MESSAGE, LocalPods
from tests.support.cluster import Cluster, wait_until

FAKE = Path(__file__).with_name("fake_runtime.py")
LABELS = {"app.kubernetes.io/name": "kubeinfer-runtime", "kubeinfer.io/inferenceservice": "lp"}


def _deployment(namespace: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "lp", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": LABELS},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {"containers": [{"name": "runtime", "image": "ghcr.io/kubeinfer/runtime:0.1.0"}]},
            },
        },
    }


def _configmap(namespace: str, delay: float) -> dict[str, Any]:
    text = yaml.safe_dump({"batching": {"max_queue_delay_seconds": delay}, "server": {"port": 8080}})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "lp-runtime", "namespace": namespace},
        "data": {"runtime.yaml": text},
    }


def _dep_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = cluster.get_json("deployment", "lp", "-n", namespace).get("status") or {}
    return status


def test_chart_localpods_run_the_pods_of_a_real_deployment(
    cluster: Cluster, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubeinfer.localpods")
    cluster.apply([_configmap(namespace, 0.005), _deployment(namespace, 1)])
    targets: list[list[str]] = []
    with LocalPods(
        cluster.kubeconfig,
        namespace,
        "lp",
        workdir=tmp_path / "pods",
        on_targets=lambda t, labels: targets.append(t),
        poll_interval=0.5,
        termination_grace_seconds=5,
        runtime_command=[sys.executable, str(FAKE)],
    ) as lp:
        assert NO_KUBELET_MESSAGE in caplog.text
        wait_until(
            lambda: _dep_status(cluster, namespace).get("readyReplicas") == 1, timeout=40, message="1 ready"
        )
        (pod,) = cluster.get_json("pods", "-n", namespace, "-l", "kubeinfer.io/inferenceservice=lp")["items"]
        assert pod["status"]["phase"] == "Running"
        assert [c["ready"] for c in pod["status"]["containerStatuses"]] == [True]
        assert lp.pods()[0].pod_name == pod["metadata"]["name"]

        # scale out through the Deployment: the ReplicaSet makes a Pod, it gets a process and turns Ready
        cluster.kubectl("scale", "deployment/lp", "-n", namespace, "--replicas=2")
        wait_until(
            lambda: _dep_status(cluster, namespace).get("readyReplicas") == 2, timeout=40, message="2 ready"
        )
        wait_until(lambda: targets and len(targets[-1]) == 2, timeout=10, message="2 targets")

        # the ConfigMap changes: every process's file follows (hot reload), no restart
        pids = sorted(p.proc.pid for p in lp.pods() if p.proc)
        cluster.apply(_configmap(namespace, 0.002))

        def configs_updated() -> bool:
            return all(
                yaml.safe_load(httpx.get(f"{p.url}/config").text)["batching"]["max_queue_delay_seconds"]
                == 0.002
                for p in lp.pods()
            )

        wait_until(configs_updated, timeout=20, message="config rewritten")
        assert sorted(p.proc.pid for p in lp.pods() if p.proc) == pids

        # a rollout (pod template change): new Pods get new processes, old ones are stopped
        dep = _deployment(namespace, 2)
        dep["spec"]["template"]["metadata"]["annotations"] = {"kubeinfer.io/config-hash": "v2"}
        cluster.apply(dep)

        def rolled() -> bool:
            st = _dep_status(cluster, namespace)
            pods = cluster.get_json("pods", "-n", namespace, "-l", "kubeinfer.io/inferenceservice=lp")[
                "items"
            ]
            return (
                st.get("updatedReplicas") == 2
                and st.get("readyReplicas") == 2
                and len(pods) == 2
                and sorted(p.proc.pid for p in lp.pods() if p.proc) != pids
                and len(lp.pods()) == 2
            )

        wait_until(rolled, timeout=60, message="rollout done")

        # scale in: one process is stopped
        cluster.kubectl("scale", "deployment/lp", "-n", namespace, "--replicas=1")
        wait_until(lambda: len(lp.pods()) == 1 and not lp._terminating, timeout=30, message="scaled in")
        survivors = lp.pods()
        assert lp.errors == []
    assert all(not p.alive() for p in survivors)
