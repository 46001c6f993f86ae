"""diagnosis.health: Ready (serving the current generation), Serving, Reconciling, Stalled, the counts, and
the Events of their transitions; kstatus semantics (Reconciling/Stalled present only while true)."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap, build_deployment
from kubeinfer.operator.reconcile import diagnosis, report, rollout
from kubeinfer.operator.reconcile import events as reconcile_events

AVAILABLE = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}


def deployment(
    *, desired: int = 1, replicas: int, updated: int, ready: int, generation: int = 2, observed: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation, "annotations": {rollout.REVISION_ANNOTATION: "2"}},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [AVAILABLE] if ready else [],
        },
    }


def replicaset(revision: str, template_hash: str, ready: int) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {rollout.REVISION_ANNOTATION: revision},
            "labels": {rollout.POD_TEMPLATE_HASH_LABEL: template_hash},
        },
        "status": {"readyReplicas": ready},
    }


def pod(name: str, template_hash: str, waiting: str | None = None) -> dict[str, Any]:
    statuses = []
    if waiting:
        statuses = [
            {"name": "runtime", "state": {"waiting": {"reason": waiting, "message": f"{waiting} msg"}}}
        ]
    return {
        "metadata": {"name": name, "labels": {rollout.POD_TEMPLATE_HASH_LABEL: template_hash}},
        "status": {"containerStatuses": statuses},
    }


def health(
    dep: dict[str, Any], pods: list[dict[str, Any]] | None = None, rs: list[Any] | None = None
) -> diagnosis.Health:
    return diagnosis.health(dep, missing_pvcs=[], error=None, namespace="ns", pods=pods, replicasets=rs)


def test_rollout_in_flight_is_not_ready_but_serving_with_counts() -> None:
    # one replica, maxSurge 1: the old pod serves, the new one is not ready yet
    dep = deployment(replicas=2, updated=1, ready=1)
    rs = [replicaset("1", "old", 1), replicaset("2", "new", 0)]
    h = health(dep, [pod("a", "old"), pod("b", "new")], rs)
    assert (h.ready.status, h.ready.reason) == ("False", "Progressing")
    assert h.ready.message == "0/1 replicas updated and ready (1 updated, 1 ready, 2 pods)"
    assert (h.serving.status, h.serving.reason) == ("True", "ReadyReplicas")
    assert h.reconciling is not None and h.reconciling.status == "True"
    assert h.reconciling.message == h.ready.message and h.stalled is None
    assert h.rollout is not None and h.rollout.summary() == "0/1"


def test_broken_rollout_names_the_new_pods_reason_while_old_pods_serve() -> None:
    dep = deployment(replicas=2, updated=1, ready=1)
    rs = [replicaset("1", "old", 1), replicaset("2", "new", 0)]
    h = health(dep, [pod("a", "old"), pod("b", "new", "ImagePullBackOff")], rs)
    assert (h.ready.status, h.ready.reason) == ("False", "ImagePullBackOff")
    assert "pod b" in h.ready.message and "ImagePullBackOff msg" in h.ready.message
    assert h.stalled is not None and (h.stalled.status, h.stalled.reason) == ("True", "ImagePullBackOff")
    assert h.reconciling is None  # kstatus: Stalled wins only when Reconciling is not true
    assert h.serving.status == "True"


def test_a_crashing_old_pod_is_not_the_new_rollouts_fault() -> None:
    dep = deployment(replicas=2, updated=1, ready=0)
    rs = [replicaset("1", "old", 0), replicaset("2", "new", 0)]
    h = health(dep, [pod("a", "old", "CrashLoopBackOff"), pod("b", "new")], rs)
    assert (h.ready.reason, h.stalled) == ("Progressing", None)
    assert (h.serving.status, h.serving.reason) == ("False", "NoReadyReplicas")


def test_complete_only_when_observed_updated_available_and_no_old_pod() -> None:
    done = health(deployment(replicas=1, updated=1, ready=1))
    assert (done.ready.status, done.ready.reason, done.ready.message) == (
        "True",
        "MinimumReplicasAvailable",
        "1/1 replicas ready",
    )
    assert done.reconciling is None and done.stalled is None and done.serving.status == "True"
    # the template changed, the Deployment controller has not seen it yet: old counts look complete
    unseen = health(deployment(replicas=1, updated=1, ready=1, generation=3, observed=2))
    assert unseen.ready.reason == "Progressing" and "has not seen the new template" in unseen.ready.message
    # the new pod is ready, the old one not gone yet
    surge = health(deployment(replicas=2, updated=1, ready=2))
    assert surge.ready.status == "False" and surge.rollout is not None and surge.rollout.summary() == "1/1"
    zero = health(deployment(desired=0, replicas=0, updated=0, ready=0))
    assert zero.ready.status == "True" and zero.serving.status == "False"


def test_conditions_remove_the_abnormal_true_ones_when_false() -> None:
    rolling = health(deployment(replicas=2, updated=1, ready=1))
    conds = report.conditions_for({}, rolling, "T1", 2, autoscaling=False)
    assert [c["type"] for c in conds] == ["Ready", "Serving", "Reconciling"]
    assert all(c["observedGeneration"] == 2 for c in conds)
    done = report.conditions_for(
        {"conditions": conds}, health(deployment(replicas=1, updated=1, ready=1)), "T2", 2, autoscaling=False
    )
    assert [c["type"] for c in done] == ["Ready", "Serving"]
    serving = next(c for c in done if c["type"] == "Serving")
    assert serving["lastTransitionTime"] == "T1"  # it served throughout


def test_events_normal_for_a_healthy_start_and_rollout_warning_for_faults() -> None:
    def conds(h: diagnosis.Health, before: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return report.conditions_for({"conditions": before}, h, "T", 1, autoscaling=False)

    creating = conds(diagnosis.health(None, missing_pvcs=[], error=None, namespace="ns"), [])
    assert (
        reconcile_events.transition_events([], creating) == []
    )  # Progressing/Creating: no Event (Created is the apply's)
    pending = conds(health(deployment(replicas=1, updated=1, ready=0)), creating)
    assert reconcile_events.transition_events(creating, pending) == []  # still rolling out: nothing new
    done = conds(health(deployment(replicas=1, updated=1, ready=1)), pending)
    assert reconcile_events.transition_events(pending, done) == [
        ("Normal", "RolloutFinished", "Ready=True: 1/1 replicas ready")
    ]
    rolling = conds(health(deployment(replicas=2, updated=1, ready=1)), done)
    assert reconcile_events.transition_events(done, rolling) == []  # Ready True -> Progressing: expected
    rs = [replicaset("1", "old", 1), replicaset("2", "new", 0)]
    broken = conds(
        health(deployment(replicas=2, updated=1, ready=1), [pod("b", "new", "ErrImagePull")], rs), rolling
    )
    assert [(t, r) for t, r, _ in reconcile_events.transition_events(rolling, broken)] == [
        ("Warning", "ImagePullBackOff")  # ErrImagePull and ImagePullBackOff alternate: one reason
    ]
    fixed = conds(health(deployment(replicas=1, updated=1, ready=1)), broken)
    assert [(t, r) for t, r, _ in reconcile_events.transition_events(broken, fixed)] == [
        ("Normal", "MinimumReplicasAvailable")
    ]


def _isvc(**spec: Any) -> api.InferenceService:
    base: dict[str, Any] = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, **spec}
    return api.InferenceService.from_body(
        {"metadata": {"name": "m", "namespace": "ns", "generation": 3}, "spec": base}
    )


def test_update_events_tell_a_rollout_from_a_scale_and_a_max_queue_delay_change() -> None:
    isvc = _isvc()
    dep = build_deployment(isvc, replicas=1)
    same = (0.005, 0.005)  # status.maxQueueDelay before, the value in force now (seconds): unchanged

    def events_of(
        desired: dict[str, Any], current: dict[str, Any] | None, of: api.InferenceService, timeout=same
    ) -> list[reconcile_events.Event]:
        return reconcile_events.update_events(desired, current, of, max_queue_delay=timeout)

    assert events_of(build_deployment(isvc, replicas=3), dep, isvc) == [
        ("Normal", "Scaled", "replicas 1 → 3")
    ]
    other = _isvc(model={"uri": "/models/v2"})
    events = events_of(build_deployment(other, replicas=1), dep, other)
    assert [(t, r) for t, r, _ in events] == [("Normal", "RolloutStarted")] and "generation 3" in events[0][2]
    assert events_of(dep, dep, isvc) == []
    old_cm, new_cm = build_configmap(isvc, 0.005), build_configmap(isvc, 0.009)
    assert events_of(new_cm, old_cm, isvc, (0.005, 0.009)) == [
        ("Normal", "MaxQueueDelayChanged", "max queue delay 5ms → 9ms")
    ]
    # the ConfigMap changed for another reason (the timeout as before), or the value before is unknown
    assert events_of(new_cm, old_cm, isvc, (0.009, 0.009)) == []
    # values compared, not text: a status written "0.009s" is the 9ms in force
    assert events_of(new_cm, old_cm, isvc, (api.Seconds("0.009s"), 0.009)) == []
    assert events_of(new_cm, old_cm, isvc, (None, 0.009)) == []
    auto = _isvc(autoscaling={"enabled": True})  # the autoscaler posts Autoscaled for its own changes
    assert events_of(build_configmap(auto, 0.009), build_configmap(auto, 0.005), auto, (0.005, 0.009)) == []
    assert events_of(dep, None, isvc) == []  # a creation: the Created Event
