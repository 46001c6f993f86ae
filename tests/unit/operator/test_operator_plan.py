"""The reconciler's pure planning: compare, replicas ownership, readiness, status patches."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator import api, status
from kubeinfer.operator.builders import build_service
from kubeinfer.operator.reconcile import diagnosis, diff, replicas, report
from kubeinfer.operator.status import ConditionState as ReadyState


def _isvc(**spec: Any) -> api.InferenceService:
    base: dict[str, Any] = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}}
    base.update(spec)
    return api.InferenceService.from_body(
        {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 2}, "spec": base}
    )


def test_is_subset_ignores_server_defaults_and_normalizes_quantities() -> None:
    desired = {"a": {"cpu": "1", "list": [{"x": 1}], "empty": []}, "b": "8Gi"}
    current = {"a": {"cpu": "1000m", "list": [{"x": 1, "default": True}], "extra": 3}, "b": "8Gi", "c": 1}
    assert diff.is_subset(desired, current)
    assert not diff.is_subset({"a": {"cpu": "2"}}, current)
    assert not diff.is_subset({"a": {"list": [{"x": 1}, {"x": 2}]}}, current)


def test_plan_apply_create_update_revert_none() -> None:
    desired = build_service(_isvc())
    assert diff.plan_apply(desired, None) == "create"
    current = {**desired, "spec": {**desired["spec"], "clusterIP": "10.0.0.1", "sessionAffinity": "None"}}
    assert diff.plan_apply(desired, current) == "none"
    edited = {**current, "spec": {**current["spec"], "type": "NodePort"}}
    assert diff.plan_apply(desired, edited) == "revert"
    changed = build_service(_isvc(model={"uri": "/m"}))  # same Service: the hash is of the Service itself
    assert diff.plan_apply(changed, current) == "none"
    stale = {
        **current,
        "metadata": {**current["metadata"], "annotations": {"kubeinfer.io/applied-hash": "old"}},
    }
    assert diff.plan_apply(desired, stale) == "update"


def _dep(replicas: int, managers: list[str]) -> dict[str, Any]:
    fields = [{"manager": m, "fieldsV1": {"f:spec": {"f:replicas": {}}}} for m in managers]
    return {"metadata": {"managedFields": fields}, "spec": {"replicas": replicas}}


def test_desired_replicas_never_fights_the_autoscaler() -> None:
    off = _isvc(replicas=3)
    assert replicas.desired_replicas(off, _dep(7, ["kubeinfer-autoscaler"])) == 3
    on = _isvc(autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 5})
    assert replicas.desired_replicas(on, None) == 2  # create at minReplicas
    assert replicas.desired_replicas(on, _dep(4, ["kubeinfer"])) == 4  # sole owner: keep the value
    assert replicas.desired_replicas(on, _dep(4, ["kubeinfer-autoscaler"])) is None  # leave it alone
    assert replicas.desired_replicas(on, _dep(9, ["kubeinfer-autoscaler"])) == 5  # clamp into bounds
    assert replicas.desired_replicas(on, _dep(1, ["kubectl"])) == 2


def _deployment(*conds: dict[str, str], ready: int = 0, replicas: int = 1) -> dict[str, Any]:
    """A Deployment of 1 replica whose controller has seen its template; ``ready`` pods of it are ready."""
    status = {
        "conditions": list(conds),
        "readyReplicas": ready,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "availableReplicas": ready,
        "observedGeneration": 1,
    }
    return {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": status}


def test_ready_state_from_deployment_conditions() -> None:
    ok = diagnosis.ready_state(
        _deployment({"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}, ready=1),
        missing_pvcs=[],
        error=None,
        namespace="ns",
    )
    assert (ok.status, ok.reason, ok.message) == ("True", "MinimumReplicasAvailable", "1/1 replicas ready")
    failed = diagnosis.ready_state(
        _deployment(
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"},
        ),
        missing_pvcs=[],
        error=None,
        namespace="ns",
    )
    assert (failed.status, failed.reason, failed.message) == ("False", "FailedCreate", "quota")
    stuck = diagnosis.ready_state(
        _deployment({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}),
        missing_pvcs=[],
        error=None,
        namespace="ns",
    )
    assert stuck.reason == "ProgressDeadlineExceeded"
    pvc = diagnosis.ready_state(None, missing_pvcs=["models"], error=None, namespace="ns")
    assert (pvc.status, pvc.reason) == ("False", "PersistentVolumeClaimNotFound")
    assert "models" in pvc.message


def test_pod_problems_surface_while_unavailable() -> None:
    pod = {
        "metadata": {"name": "p1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "runtime",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "bad image x"}},
                }
            ]
        },
    }
    unavailable = _deployment(
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"}
    )
    state = diagnosis.ready_state(unavailable, missing_pvcs=[], error=None, namespace="ns", pods=[pod])
    assert (state.status, state.reason) == ("False", "ImagePullBackOff")
    assert "bad image x" in state.message
    pending = {"metadata": {"name": "p2"}, "status": {"phase": "Pending"}}
    assert diagnosis.pod_problem([pending]) is None
    unschedulable = {
        "metadata": {"name": "p3"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    }
    assert diagnosis.pod_problem([unschedulable]) == ReadyState("False", "Unschedulable", "pod p3: ")
    gpu = {
        **unschedulable,
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}}
            ],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        },
    }
    gpu["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
            }
        ]
    }
    state = diagnosis.pod_problem([gpu])
    assert state is not None and state.reason == "Unschedulable"
    assert state.message == (
        "pod p3: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
        "(the pod asks for nvidia.com/gpu: 1; nodeSelector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)"
    )


def test_status_keeps_transition_time_and_other_conditions() -> None:
    isvc = _isvc(autoscaling={"enabled": True})
    ready = ReadyState("False", "MinimumReplicasUnavailable", "m")
    other = {"type": "AutoscalingActive", "status": "True", "reason": "X", "message": ""}
    previous = {
        "type": "Ready",
        "status": "False",
        "reason": "Creating",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    current = {"conditions": [previous, other]}
    desired = report.desired_status(
        isvc, _deployment(), diagnosis.Health(ready), current, now="2026-02-02T00:00:00Z"
    )
    assert desired["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert other in desired["conditions"]
    off = report.desired_status(_isvc(), _deployment(), diagnosis.Health(ready), current, now="T")
    assert [c["type"] for c in off["conditions"]] == ["Ready", "Serving"]  # AutoscalingActive removed
    assert off["observed"] is None  # a merge patch's None deletes the autoscaler's observed signals
    assert desired["maxQueueDelay"] == "5ms"
    # what an older operator wrote as status.batchTimeout is deleted (a merge patch's None)
    assert status.status_patch(desired, {**desired, "batchTimeout": "5ms"}) == {"batchTimeout": None}
    assert desired["url"] == "http://m.ns.svc.cluster.local:8080"
    assert status.status_patch(desired, desired) == {}
    patch = status.status_patch(desired, {**desired, "replicas": 9})
    assert patch == {"replicas": desired["replicas"]}


def _crashing_pod(terminated: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"name": "p4"},
        "status": {
            "containerStatuses": [
                {
                    "name": "runtime",
                    "state": {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": "back-off 40s restarting failed container=runtime",
                        }
                    },
                    "lastState": {"terminated": terminated},
                }
            ]
        },
    }


def test_crash_loop_carries_exit_code_and_termination_message() -> None:
    pod = _crashing_pod(
        {
            "exitCode": 2,
            "reason": "Error",
            "message": "invalid configuration: calibration file\n/models/c.txt\n",
        }
    )
    assert diagnosis.pod_problem([pod]) == ReadyState(
        "False",
        "CrashLoopBackOff",
        "pod p4 container runtime: exit code 2 (Error): invalid configuration: calibration file "
        "/models/c.txt",
    )


def test_termination_message_is_one_line_cut_to_a_bound() -> None:
    cause = "model load failed: OSError: " + "x" * 1000
    state = diagnosis.pod_problem([_crashing_pod({"exitCode": 1, "message": cause})])
    assert state is not None and state.reason == "ModelLoadFailed"
    prefix = "pod p4 container runtime: exit code 1: "
    assert state.message.startswith(prefix + "model load failed: OSError: xxx") and state.message.endswith(
        "..."
    )
    assert len(state.message) == len(prefix) + diagnosis.TERMINATION_MESSAGE_CHARS


def test_crash_loop_without_message_still_gives_exit_code() -> None:
    state = diagnosis.pod_problem([_crashing_pod({"exitCode": 139, "reason": "Error"})])
    assert state == ReadyState("False", "CrashLoopBackOff", "pod p4 container runtime: exit code 139 (Error)")
