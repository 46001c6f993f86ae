"""The ColdStart Event's stages, from pod JSON as the API server returns it (``reconcile.coldstart``)."""

from __future__ import annotations

import copy
from typing import Any

from kubeinfer.operator.reconcile.coldstart import cold_start_due, first_ready, pod_stages, woken_demand

from kubeinfer.contract.activator import DEMAND_ANNOTATION


def pod(name: str = "minilm-7d9c-abcde", **times: str) -> dict[str, Any]:
    """A runtime pod as the API server returns it after a start on a kubelet that reports the sandbox;
    ``times`` overrides a moment by its key (``created``, ``scheduled``, ``sandbox``, ``initialized``,
    ``started``, ``ready``)."""
    t = {
        "created": "2026-12-05T20:00:01Z",
        "scheduled": "2026-12-05T20:00:01Z",
        "sandbox": "2026-12-05T20:00:02Z",
        "initialized": "2026-12-05T20:00:02Z",
        "started": "2026-12-05T20:00:03Z",
        "ready": "2026-12-05T20:00:09Z",
        **times,
    }
    return {
        "metadata": {"name": name, "creationTimestamp": t["created"]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t["sandbox"]},
                {"type": "Initialized", "status": "True", "lastTransitionTime": t["initialized"]},
                {"type": "Ready", "status": "True", "lastTransitionTime": t["ready"]},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": t["ready"]},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t["scheduled"]},
            ],
            "containerStatuses": [
                {"name": "runtime", "ready": True, "state": {"running": {"startedAt": t["started"]}}}
            ],
        },
    }


def test_the_stages_count_from_the_demand_when_it_came_before_the_pod() -> None:
    stages = pod_stages(pod(), demand="2026-12-05T20:00:00Z")
    assert stages is not None and stages.origin == "demand" and stages.ready_seconds == 9.0
    assert stages.stages == (
        ("pod created", 1.0),
        ("scheduled", 1.0),
        ("sandbox ready", 2.0),
        ("initialized", 2.0),
        ("container started", 3.0),
        ("Ready", 9.0),
    )
    assert stages.message() == (
        "first replica Ready 9 s after the demand at 2026-12-05T20:00:00Z (pod minilm-7d9c-abcde): pod "
        "created 1 s, scheduled 1 s, sandbox ready 2 s, initialized 2 s, container started 3 s, Ready 9 s "
        "(from the pod's timestamps, whole seconds)"
    )


def test_without_a_demand_before_it_the_stages_count_from_the_pod_s_creation() -> None:
    for demand in (None, "not a time", "2026-12-05T20:00:05Z"):  # none, unreadable, after the pod
        stages = pod_stages(pod(), demand)
        assert stages is not None and stages.origin == "pod creation"
        assert stages.origin_time == "2026-12-05T20:00:01Z" and stages.stages[0] == ("scheduled", 0.0)
        assert stages.ready_seconds == 8.0


def test_a_stage_the_pod_does_not_report_is_left_out_and_a_pod_not_ready_has_none() -> None:
    older = pod()
    older["status"]["conditions"] = [
        c for c in older["status"]["conditions"] if c["type"] != "PodReadyToStartContainers"
    ]
    older["status"]["containerStatuses"][0]["name"] = "sidecar"  # not the runtime's
    stages = pod_stages(older)
    assert stages is not None and [w for w, _ in stages.stages] == ["scheduled", "initialized", "Ready"]
    starting = pod()
    starting["status"]["conditions"][2]["status"] = "False"
    assert pod_stages(starting) is None
    assert pod_stages({"metadata": {"name": "x"}, "status": pod()["status"]}) is None


def test_the_first_ready_pod_since_the_scale_to_zero_is_read() -> None:
    old = pod("old", created="2026-12-05T19:00:00Z", ready="2026-12-05T19:00:05Z")  # before the scale to zero
    late = pod("late", ready="2026-12-05T20:00:20Z")
    first = pod("first", ready="2026-12-05T20:00:09Z")
    going = copy.deepcopy(first)
    going["metadata"].update(name="going", deletionTimestamp="2026-12-05T20:00:30Z")
    starting = pod("starting")
    starting["status"]["conditions"][2]["status"] = "False"
    since = "2026-12-05T19:30:00Z"
    assert first_ready([late, old, going, starting, first], since) is first
    assert first_ready([old], since) is None and first_ready([old], None) is old
    assert first_ready([starting], since) is None


def body(demand: str | None, since: str | None) -> dict[str, Any]:
    annotations = {} if demand is None else {DEMAND_ANNOTATION: demand}
    status = {} if since is None else {"scaledToZeroAt": since}
    return {"metadata": {"name": "minilm", "annotations": annotations}, "status": status}


def serving(status: str) -> list[dict[str, Any]]:
    return [{"type": "Ready", "status": "True"}, {"type": "Serving", "status": status}]


def test_the_event_is_due_when_serving_turns_true_after_a_demand_newer_than_the_scale_to_zero() -> None:
    woken = body("2026-12-05T20:00:00Z", "2026-12-05T19:50:00Z")
    assert woken_demand(woken) == "2026-12-05T20:00:00Z"
    assert cold_start_due(serving("False"), serving("True"), woken)
    assert cold_start_due([], serving("True"), woken)  # no Serving condition before: not serving
    assert not cold_start_due(serving("True"), serving("True"), woken)  # already serving: a rollout
    assert not cold_start_due(serving("False"), serving("False"), woken)
    # a demand older than the scale to zero (answered by the last replica), or none: a plain start
    for other in (body("2026-12-05T19:40:00Z", "2026-12-05T19:50:00Z"), body(None, "2026-12-05T19:50:00Z")):
        assert woken_demand(other) is None and not cold_start_due(serving("False"), serving("True"), other)
