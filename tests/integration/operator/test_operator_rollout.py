"""Rollouts as GitOps tools read them, on the real API server and controller-manager.

Pods get their status as a kubelet would set it (``kubectl patch --subresource=status``): Ready, or
waiting in ImagePullBackOff. The ReplicaSet and Deployment controllers count them as in a cluster
with nodes. Checked: ``Ready`` false during a rollout and true after it; a broken update
``Ready=False`` with the pull error within seconds while ``Serving`` stays true; the counts
mid-rollout (``updatedReady`` "0/1" while ``replicas`` is 2); kstatus's reading of the object
(Reconciling/Stalled/observedGeneration); Events Normal for a healthy start and rollout, Warning for
the fault only; AutoscalingActive and ``status.observed`` gone after autoscaling is turned off; and
the Argo CD health check of docs/status-and-gitops.md (Lua, run with lupa) on these objects in each state.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api, rfc3339

from hack.devtools.operator_proc import OperatorProcess
from tests.support.cluster import Cluster, wait_until
from tests.support.kstatus import compute as kstatus_compute

ROOT = Path(__file__).resolve().parents[3]


def _isvc(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.get_json("kisvc", name, "-n", ns)
    return obj


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def _pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "pods", "-n", ns, "-l", f"kubeinfer.io/inferenceservice={name}"
    )["items"]
    return items


def _set_pod_status(cluster: Cluster, ns: str, pod: str, status: dict[str, Any]) -> None:
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


def _mark_ready(cluster: Cluster, ns: str, pod: dict[str, Any]) -> None:
    """What a kubelet reports for a started runtime container whose readiness probe passes."""
    now = rfc3339.now()
    image = pod["spec"]["containers"][0]["image"]
    _set_pod_status(
        cluster,
        ns,
        pod["metadata"]["name"],
        {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": "runtime",
                    "image": image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        },
    )


def _mark_pull_error(cluster: Cluster, ns: str, pod: dict[str, Any]) -> None:
    image = pod["spec"]["containers"][0]["image"]
    waiting = {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
    _set_pod_status(
        cluster,
        ns,
        pod["metadata"]["name"],
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "runtime",
                    "image": image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": waiting},
                }
            ],
        },
    )


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _ready_all_pods(cluster: Cluster, ns: str, name: str) -> None:
    for pod in _pods(cluster, ns, name):
        if not _is_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            _mark_ready(cluster, ns, pod)


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's reading of the object (the real sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute,
    as Flux reads it): InProgress while ``status.observedGeneration`` lags or Reconciling is True,
    Failed while Stalled is True, else Current."""
    return kstatus_compute(obj)[0]


def argocd_health_script() -> str:
    """The Lua health check of docs/status-and-gitops.md's "Argo CD health check" section (its only
    ```lua block)."""
    doc = (ROOT / "docs" / "status-and-gitops.md").read_text()
    blocks = re.findall(r"```lua\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 1, (
        "docs/status-and-gitops.md must carry exactly one ```lua block: the Argo CD health check"
    )
    return blocks[0]


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the documented script as Argo CD does: the object in the global ``obj``, the script's
    return value the health (``status``, ``message``)."""
    lupa = pytest.importorskip("lupa")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(argocd_health_script())
    return {"status": str(hs["status"]), "message": str(hs["message"] or "")}


def _manifest(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
        "runtime": {"device": "cpu", "image": "registry.example/kubeinfer-runtime:1"},
        "replicas": 1,
    }
    base.update(spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": base}


def _events(cluster: Cluster, ns: str, name: str) -> list[tuple[str, str]]:
    """The InferenceService's Events, oldest first. Only its own: its Service shares its name, and the API
    server's IP allocator repair loop may post a Warning ``ClusterIPNotAllocated`` on that Service when
    the machine is busy."""
    selector = f"involvedObject.name={name},involvedObject.kind={api.KIND}"
    items = cluster.get_json("events", "-n", ns, "--field-selector", selector)["items"]
    return [(e["type"], e["reason"]) for e in sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])]


def _wait_healthy(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    def healthy() -> dict[str, Any] | None:
        _ready_all_pods(cluster, ns, name)
        obj = _isvc(cluster, ns, name)
        ready = _cond(obj, "Ready")
        return obj if ready is not None and ready["status"] == "True" else None

    return wait_until(healthy, timeout=60, interval=0.5, message=f"{name} Ready=True")


def test_rollout_ready_false_during_true_after_and_broken_update_keeps_serving(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "rollout"
    cluster.apply(_manifest(name), "-n", ns)
    # a healthy start-up: Progressing (no Warning), then Ready once the pod is ready
    starting = wait_until(
        lambda: (o := _isvc(cluster, ns, name)) and _cond(o, "Ready") and o, timeout=30, message="status"
    )
    assert _cond(starting, "Ready")["status"] == "False"  # type: ignore[index]
    assert argocd_health(starting)["status"] == "Progressing"
    healthy = _wait_healthy(cluster, ns, name)
    assert healthy["status"]["updatedReady"] == "1/1" and healthy["status"]["replicas"] == 1
    assert _cond(healthy, "Serving")["status"] == "True"  # type: ignore[index]
    assert _cond(healthy, "Reconciling") is None and _cond(healthy, "Stalled") is None
    assert kstatus(healthy) == "Current"
    assert argocd_health(healthy) == {"status": "Healthy", "message": "1/1 replicas ready"}
    generation = healthy["metadata"]["generation"]
    assert all(c["observedGeneration"] == generation for c in healthy["status"]["conditions"])
    wait_until(
        lambda: ("Normal", "RolloutFinished") in _events(cluster, ns, name), timeout=15, message="Events"
    )
    start_events = _events(cluster, ns, name)
    assert [e for e in start_events if e[0] == "Warning"] == [], start_events
    assert ("Normal", "Created") in start_events

    # a spec change that rolls the pods: the old pod keeps serving, the new one is not ready yet
    cluster.kubectl(
        "patch", "kisvc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"model":{"uri":"/models/v2"}}}'
    )

    def mid_rollout() -> dict[str, Any] | None:
        obj = _isvc(cluster, ns, name)
        rec = _cond(obj, "Reconciling")
        ok = rec is not None and rec["status"] == "True" and obj["status"].get("replicas") == 2
        return obj if ok and obj["status"]["observedGeneration"] == generation + 1 else None

    mid = wait_until(mid_rollout, timeout=30, message="Reconciling=True with the surge pod")
    ready = _cond(mid, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "Progressing")
    assert ready["message"].startswith("0/1 replicas updated and ready"), ready
    assert _cond(mid, "Serving")["status"] == "True"  # type: ignore[index]
    assert mid["status"]["updatedReady"] == "0/1"
    assert (mid["status"]["replicas"], mid["status"]["readyReplicas"], mid["status"]["updatedReplicas"]) == (
        2,
        1,
        1,
    )
    assert kstatus(mid) == "InProgress"
    assert argocd_health(mid)["status"] == "Progressing"
    assert all(c["observedGeneration"] == generation + 1 for c in mid["status"]["conditions"])

    # posted in the background as the rollout starts: waited for, not read once
    wait_until(
        lambda: ("Normal", "RolloutStarted") in _events(cluster, ns, name), timeout=15, message="the Event"
    )
    # the new pod becomes ready: the old one goes, Ready=True, Reconciling removed
    done = _wait_healthy(cluster, ns, name)
    assert done["status"]["updatedReady"] == "1/1" and _cond(done, "Reconciling") is None
    wait_until(lambda: _pods(cluster, ns, name).__len__() == 1, timeout=30, message="old pod gone")
    assert kstatus(_isvc(cluster, ns, name)) == "Current"

    _check_broken_update(cluster, ns, name)


def _check_broken_update(cluster: Cluster, ns: str, name: str) -> None:
    """A broken update: the new pod cannot pull its image. Ready=False with the pull error within
    seconds (not after progressDeadlineSeconds), Serving stays true (the old pod serves)."""
    old_pods = {p["metadata"]["name"] for p in _pods(cluster, ns, name)}
    bad_image = "registry.invalid/kubeinfer-runtime:missing"
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"runtime": {"image": bad_image}}}),
    )
    new_pod = wait_until(
        lambda: next((p for p in _pods(cluster, ns, name) if p["metadata"]["name"] not in old_pods), None),
        timeout=30,
        message="the new pod",
    )
    _mark_pull_error(cluster, ns, new_pod)
    broken = wait_until(
        lambda: (
            (o := _isvc(cluster, ns, name))
            and (c := _cond(o, "Ready"))
            and c["reason"] == "ImagePullBackOff"
            and o
        ),
        timeout=10,
        message="Ready=False ImagePullBackOff",
    )
    ready = _cond(broken, "Ready")
    assert ready is not None and ready["status"] == "False" and bad_image in ready["message"]
    assert _cond(broken, "Serving")["status"] == "True"  # type: ignore[index]
    stalled = _cond(broken, "Stalled")
    assert stalled is not None and (stalled["status"], stalled["reason"]) == ("True", "ImagePullBackOff")
    assert kstatus(broken) == "Failed"
    health = argocd_health(broken)
    assert health["status"] == "Degraded" and "ImagePullBackOff" in health["message"]
    wait_until(
        lambda: ("Warning", "ImagePullBackOff") in _events(cluster, ns, name), timeout=15, message="Warning"
    )
    warnings = [e for e in _events(cluster, ns, name) if e[0] == "Warning"]
    assert warnings == [("Warning", "ImagePullBackOff")], warnings


def test_scale_and_max_queue_delay_changes_are_normal_events(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "scaleevents"
    cluster.apply(_manifest(name, batching={"maxQueueDelay": "5ms"}), "-n", ns)
    _wait_healthy(cluster, ns, name)
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"replicas":2,"batching":{"maxQueueDelay":"9ms"}}}',
    )
    wait_until(
        lambda: {("Normal", "Scaled"), ("Normal", "MaxQueueDelayChanged")} <= set(_events(cluster, ns, name)),
        timeout=30,
        message="Scaled and MaxQueueDelayChanged Events",
    )
    done = _wait_healthy(cluster, ns, name)
    assert done["status"]["updatedReady"] == "2/2" and done["status"]["replicas"] == 2
    assert [e for e in _events(cluster, ns, name) if e[0] == "Warning"] == []


def test_autoscaling_condition_and_observed_removed_when_turned_off(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    """With Prometheus unreachable (TEST_ENV) the autoscaler writes AutoscalingActive=False; turning
    autoscaling off removes that condition and ``status.observed``."""
    ns, name = op_namespace, "autooff"
    cluster.apply(
        _manifest(name, autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 2}), "-n", ns
    )
    on = wait_until(
        lambda: (
            (o := _isvc(cluster, ns, name))
            and _cond(o, "AutoscalingActive")
            and o.get("status", {}).get("observed")
            and o
        ),
        timeout=30,
        message="AutoscalingActive and observed",
    )
    active = _cond(on, "AutoscalingActive")
    assert active is not None and active["reason"] == "PrometheusUnavailable"
    # quiet failure: a short message naming the signal, not the URL-encoded query and the exception
    assert "query=" not in active["message"] and len(active["message"]) < 200, active["message"]
    assert "Prometheus unavailable at http://127.0.0.1:9" in active["message"]
    time.sleep(8.0)  # four autoscaler periods of 2 s: one WARNING for the outage, no retry noise
    mine = [ln for ln in operator.log().splitlines() if f"autoscale {ns}/{name}:" in ln]
    assert len([ln for ln in mine if " WARNING " in ln]) == 1, "\n".join(mine)
    assert "Retrying (Retry(" not in operator.log() and "urllib3" not in operator.log()
    cluster.kubectl(
        "patch", "kisvc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"autoscaling":{"enabled":false}}}'
    )
    off = wait_until(
        lambda: (
            (o := _isvc(cluster, ns, name))
            and _cond(o, "AutoscalingActive") is None
            and "observed" not in o["status"]
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
            and o
        ),
        timeout=30,
        message="AutoscalingActive and observed removed",
    )
    generation = off["metadata"]["generation"]
    assert all(c["observedGeneration"] == generation for c in off["status"]["conditions"])
