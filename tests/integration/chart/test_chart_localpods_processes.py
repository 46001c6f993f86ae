"""hack/localpods.py process management, with a stand-in runtime and the API reads replaced.

The API-server side (Deployment/ConfigMap reads, status patches) is covered against the real
control plane in test_chart_localpods_cluster.py; here the reads come from a dict so the process
logic (scale up/down, config hot-rewrite, restart, targets) is checked quickly and precisely.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hack.localpods import LocalPods

FAKE = Path(__file__).with_name("fake_runtime.py")
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


class DictPods(LocalPods):
    """LocalPods whose Deployment/ConfigMap come from ``self.state`` instead of the API server."""

    state: dict[str, Any]

    def _read_deployment(self) -> dict[str, Any] | None:
        r = self.state.get("replicas")
        return None if r is None else {"metadata": {"generation": 1}, "spec": {"replicas": r}}

    def _read_runtime_yaml(self) -> str | None:
        return self.state.get("runtime_yaml")

    def _list_pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "name": n,
                "ready": n in self.state.setdefault("ready_pods", set()),
                "ready_condition": True,
                "start_time": True,
            }
            for n in self.state.get("pods", [])
        ]

    def _patch_pods(self, k8s_pods: list[dict[str, Any]]) -> None:
        ready = {p.pod_name for p in self.pods() if p.ready}
        self.state["ready_pods"] = {p["name"] for p in k8s_pods if p["name"] in ready}

    def _patch_deployment_status(self, deployment: dict[str, Any]) -> None:
        self.state["deployment_ready"] = sum(p.ready for p in self.pods())


def wait_for(pred: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def pods(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(KUBECONFIG)
    calls: list[tuple[list[str], dict[str, str]]] = []
    lp = DictPods(
        kc,
        "ns1",
        "svc",
        workdir=tmp_path / "work",
        on_targets=lambda t, labels: calls.append((t, labels)),
        file_sd_path=tmp_path / "sd" / "targets.json",
        report_status=False,
        poll_interval=0.2,
        termination_grace_seconds=5,
        runtime_command=[sys.executable, str(FAKE)],
    )
    lp.state = {}
    lp.calls = calls  # type: ignore[attr-defined]
    yield lp
    lp.stop(timeout=10)


def test_localpods_follow_replicas_config_and_crashes(pods: DictPods, tmp_path: Path) -> None:
    cfg = {"batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.01}, "server": {"port": 8080}}
    pods.state.update(replicas=2, runtime_yaml=yaml.safe_dump(cfg))
    pods.start()
    addrs = pods.wait_ready(2, timeout=20)
    assert len(set(addrs)) == 2
    ports = {p.port for p in pods.pods()}

    # each process got the ConfigMap content with its own port, on loopback
    for p in pods.pods():
        served = yaml.safe_load(httpx.get(f"{p.url}/config").text)
        assert served["server"] == {"host": "127.0.0.1", "port": p.port}
        assert served["batching"]["max_queue_delay_seconds"] == 0.01

    # targets: callback and file_sd carry the two labels the autoscaler selects on
    wait_for(lambda: pods.calls and len(pods.calls[-1][0]) == 2)
    assert pods.calls[-1][1] == {"namespace": "ns1", "inferenceservice": "svc"}
    sd = json.loads((tmp_path / "sd" / "targets.json").read_text())
    assert sd == [{"targets": addrs, "labels": {"namespace": "ns1", "inferenceservice": "svc"}}]

    # ConfigMap change: rewritten in place (same processes, same ports), new batching value
    pids = {p.proc.pid for p in pods.pods() if p.proc}
    cfg["batching"]["max_queue_delay_seconds"] = 0.002
    pods.state["runtime_yaml"] = yaml.safe_dump(cfg)
    wait_for(
        lambda: all(
            yaml.safe_load(httpx.get(f"{p.url}/config").text)["batching"]["max_queue_delay_seconds"] == 0.002
            for p in pods.pods()
        )
    )
    assert {p.proc.pid for p in pods.pods() if p.proc} == pids
    assert {p.port for p in pods.pods()} == ports

    # a crash is restarted (restart count goes up, it becomes ready again)
    victim = pods.pods()[0]
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_for(lambda: victim.restarts == 1 and victim.ready, timeout=20)

    # scale down: one process gets SIGTERM and exits, targets shrink to one
    pods.state["replicas"] = 1
    wait_for(lambda: len(pods.pods()) == 1 and not pods._terminating)
    wait_for(lambda: len(pods.calls[-1][0]) == 1)
    survivors = pods.pods()

    pods.stop(timeout=10)
    assert all(not p.alive() for p in survivors)
    assert pods.calls[-1][0] == []
    assert json.loads((tmp_path / "sd" / "targets.json").read_text()) == []


def test_localpods_waits_for_configmap(pods: DictPods) -> None:
    pods.state.update(replicas=1)
    pods.start()
    time.sleep(0.8)
    assert pods.pods() == []  # no config yet: nothing to run
    pods.state["runtime_yaml"] = "server: {port: 80}\n"
    pods.wait_ready(1, timeout=20)


def test_localpods_pod_mode_runs_one_process_per_pod(pods: DictPods) -> None:
    """With a controller-manager the ReplicaSet's Pods decide: adopt, roll over, mark Ready."""
    pods.report_status = True
    pods.state.update(replicas=1, runtime_yaml="server: {port: 80}\n")
    pods.start()
    pods.wait_ready(1, timeout=20)  # slot mode first: no Pods yet
    wait_for(lambda: pods.state.get("deployment_ready") == 1)
    first = pods.pods()[0]
    # the ReplicaSet made a Pod: the running process is adopted (not restarted) and the Pod gets Ready
    pods.state["pods"] = ["svc-aaa"]
    wait_for(lambda: pods.state.get("ready_pods") == {"svc-aaa"})
    assert pods.pods() == [first] and first.pod_name == "svc-aaa" and first.restarts == 0
    # a rollout: new Pod appears, gets its own process, and only its own readiness
    pods.state["pods"] = ["svc-aaa", "svc-bbb"]
    wait_for(lambda: pods.state.get("ready_pods") == {"svc-aaa", "svc-bbb"})
    assert {p.pod_name for p in pods.pods()} == {"svc-aaa", "svc-bbb"}
    # the old Pod is deleted: its process is terminated, the other keeps running
    pods.state["pods"] = ["svc-bbb"]
    wait_for(lambda: [p.pod_name for p in pods.pods()] == ["svc-bbb"] and not pods._terminating)
    assert not first.alive()
