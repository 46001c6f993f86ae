"""Scale to zero, the operator's side: the API's rules, the policy's mapping with and without the
activator setting, the demand comparison, the reconciler's replicas (0 -> 1 on demand, never 0 without
the activator), and the status at zero (Ready=True ScaledToZero, nothing in flight)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from kubeinfer.operator import api, conditions
from kubeinfer.operator.autoscale import loop
from kubeinfer.operator.autoscale.policy import Decision, Observation, State
from kubeinfer.operator.reconcile import diagnosis, replicas, report
from kubeinfer.operator.settings import Settings

from kubeinfer.contract.activator import DEMAND_ANNOTATION
from tests.unit.operator.test_operator_health import deployment

ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 3}


def body(
    autoscaling: dict[str, Any], *, demand: str | None = None, since: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "m", "namespace": "ns", "generation": 2}
    if demand is not None:
        meta["annotations"] = {DEMAND_ANNOTATION: demand}
    status = {"scaledToZeroAt": since} if since is not None else {}
    spec = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, "autoscaling": autoscaling}
    return {"metadata": meta, "spec": spec, "status": status}


def isvc(autoscaling: dict[str, Any]) -> api.InferenceService:
    return api.InferenceService.from_body(body(autoscaling))


def at(n: int, *, managers: tuple[str, ...] = (api.AUTOSCALER_FIELD_MANAGER,)) -> dict[str, Any]:
    dep = deployment(desired=n, replicas=n, updated=n, ready=n)
    dep["metadata"]["managedFields"] = [
        {"manager": m, "fieldsV1": {"f:spec": {"f:replicas": {}}}} for m in managers
    ]
    return dep


def test_api_allows_min_replicas_zero_only_with_autoscaling_and_scale_to_zero_only_with_it() -> None:
    spec = api.AutoscalingSpec.model_validate(ZERO)
    assert spec.min_replicas == 0 and spec.scale_to_zero is None
    assert spec.scale_to_zero_in_force.idle_after == 300.0
    assert spec.scale_to_zero_in_force.cold_start_timeout == 120.0
    tuned = api.AutoscalingSpec.model_validate({**ZERO, "scaleToZero": {"idleAfter": "90s"}})
    assert (
        tuned.scale_to_zero_in_force.idle_after == 90.0
        and str(tuned.scale_to_zero_in_force.idle_after) == "90s"
    )
    with pytest.raises(pydantic.ValidationError, match=r"minReplicas 0 needs spec\.autoscaling\.enabled"):
        api.AutoscalingSpec.model_validate({"minReplicas": 0})
    with pytest.raises(pydantic.ValidationError, match="scaleToZero applies only with"):
        api.AutoscalingSpec.model_validate({"enabled": True, "scaleToZero": {}})
    with pytest.raises(pydantic.ValidationError, match="idleAfter must be greater than 0"):
        api.AutoscalingSpec.model_validate({**ZERO, "scaleToZero": {"idleAfter": "0s"}})


def test_policy_scales_to_zero_only_with_the_activator_setting() -> None:
    spec = api.AutoscalingSpec.model_validate({**ZERO, "scaleToZero": {"idleAfter": "2m"}})
    on = loop.policy_from_spec(spec, stale_after_seconds=60.0, activator=True)
    assert (on.min_replicas, on.idle_after_seconds) == (1, 120.0)
    off = loop.policy_from_spec(spec, stale_after_seconds=60.0, activator=False)
    assert (off.min_replicas, off.idle_after_seconds) == (1, None)
    two = api.AutoscalingSpec.model_validate({"enabled": True, "minReplicas": 2, "maxReplicas": 3})
    assert loop.policy_from_spec(two, stale_after_seconds=60.0, activator=True).idle_after_seconds is None
    assert Settings.from_env({}).activator_enabled is False
    env = {"KUBEINFER_ACTIVATOR_ENABLED": "true", "KUBEINFER_ACTIVATOR_SERVICE": "kubeinfer/activator"}
    assert Settings.from_env(env).activator_enabled is True


@pytest.mark.parametrize(
    ("demand", "since", "newer"),
    [
        ("2026-12-05T17:30:05Z", "2026-12-05T17:30:00Z", True),
        ("2026-12-05T17:30:00Z", "2026-12-05T17:30:00Z", True),  # a tie favours the held request
        ("2026-12-05T17:29:59Z", "2026-12-05T17:30:00Z", False),
        ("2026-12-05T17:29:59Z", None, True),  # the moment of the scale to zero is not known
        (None, "2026-12-05T17:30:00Z", False),
        ("not a time", None, False),
    ],
)
def test_demand_is_newer(demand: str | None, since: str | None, newer: bool) -> None:
    assert replicas.demand_is_newer(demand, since) is newer


def test_wake_only_at_zero_with_a_newer_demand_and_the_activator() -> None:
    newer = body(ZERO, demand="2026-12-05T17:31:00Z", since="2026-12-05T17:30:00Z")
    older = body(ZERO, demand="2026-12-05T17:29:00Z", since="2026-12-05T17:30:00Z")
    woken = replicas.wake(newer, isvc(ZERO), at(0), activator=True)
    assert woken == replicas.Wake("2026-12-05T17:31:00Z", "2026-12-05T17:30:00Z")
    assert "0 → 1" in woken.message() and "17:30:00Z" in woken.message()
    assert replicas.wake(older, isvc(ZERO), at(0), activator=True) is None
    assert replicas.wake(newer, isvc(ZERO), at(1), activator=True) is None
    assert replicas.wake(newer, isvc(ZERO), None, activator=True) is None
    assert replicas.wake(newer, isvc(ZERO), at(0), activator=False) is None
    assert replicas.wake(body(ZERO), isvc(ZERO), at(0), activator=True) is None  # no demand


def test_replicas_never_zero_without_the_activator_and_one_on_demand() -> None:
    service = isvc(ZERO)
    assert replicas.desired_replicas(service, None, activator=True) == 1  # a new service starts with one
    assert replicas.initial_replicas(service) == 1
    assert replicas.desired_replicas(service, at(0), activator=False) == 1  # clamped back up
    assert replicas.desired_replicas(service, at(0), activator=True) is None  # the autoscaler's zero stays
    assert replicas.desired_replicas(service, at(0), activator=True, woken=True) == 1
    assert replicas.replica_floor(service, activator=True) == 0
    assert replicas.replica_floor(service, activator=False) == 1
    assert replicas.replica_floor(isvc({"enabled": True, "minReplicas": 2}), activator=True) == 2


def test_status_at_zero_is_ready_and_healthy_for_kstatus_and_argo_cd() -> None:
    words = report.at_zero_words(isvc(ZERO), activator=True)
    assert words == "no replica: no requests for 5m; a request brings one back"
    zero = deployment(desired=0, replicas=0, updated=0, ready=0)
    zero["status"]["conditions"] = [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}
    ]
    h = diagnosis.health(zero, missing_pvcs=[], error=None, namespace="ns", at_zero=words)
    assert (h.ready.status, h.ready.reason, h.ready.message) == ("True", conditions.SCALED_TO_ZERO, words)
    assert (h.serving.status, h.serving.reason) == ("False", conditions.SCALED_TO_ZERO)
    assert h.reconciling is None and h.stalled is None  # kstatus: Current
    assert h.rollout is not None and h.rollout.summary() == "0/0"  # the Replicas printer column
    # without scale to zero in force the same Deployment reads as before
    assert report.at_zero_words(isvc(ZERO), activator=False) is None
    plain = diagnosis.health(zero, missing_pvcs=[], error=None, namespace="ns")
    assert plain.ready.reason == conditions.MINIMUM_REPLICAS_AVAILABLE
    # waking: a replica starting reads as any scale-up
    waking = diagnosis.health(
        deployment(desired=1, replicas=1, updated=1, ready=0),
        missing_pvcs=[],
        error=None,
        namespace="ns",
        at_zero=words,
    )
    assert (waking.ready.reason, waking.reconciling is not None) == (conditions.PROGRESSING, True)

    lupa = pytest.importorskip("lupa")
    assert lupa is not None
    from tests.unit.operator.test_operator_argocd_health import argocd

    conds = report.conditions_for({}, h, "T", 2, autoscaling=True)
    obj = {
        "metadata": {"name": "m", "generation": 2},
        "status": {"observedGeneration": 2, "conditions": conds},
    }
    assert argocd(obj) == ("Healthy", words)


def test_the_scale_to_zero_condition_says_why_it_is_unavailable() -> None:
    off = report.scale_to_zero_state(isvc(ZERO), activator=False)
    assert off is not None and (off.status, off.reason) == ("False", conditions.SCALE_TO_ZERO_UNAVAILABLE)
    assert "activator" in off.message and "keeps 1 replica" in off.message
    on = report.scale_to_zero_state(isvc(ZERO), activator=True)
    assert on is not None and (on.status, on.reason) == ("True", conditions.SCALE_TO_ZERO_ENABLED)
    assert report.scale_to_zero_state(isvc({"enabled": True}), activator=True) is None
    h = diagnosis.health(at(1), missing_pvcs=[], error=None, namespace="ns")
    status = report.desired_status(isvc(ZERO), at(1), h, {}, "T", activator=False)
    types = {c["type"]: c for c in status["conditions"]}
    assert types[conditions.CONDITION_SCALE_TO_ZERO]["reason"] == conditions.SCALE_TO_ZERO_UNAVAILABLE
    plain = report.desired_status(isvc({"enabled": True}), at(1), h, {}, "T", activator=True)
    assert conditions.CONDITION_SCALE_TO_ZERO not in {c["type"] for c in plain["conditions"]}


def test_a_decision_to_zero_records_the_moment_first() -> None:
    obs = Observation(p99_seconds=None, gpu_utilization=None)
    to_zero = Decision(
        0, 0.005, "idle", replicas_changed=True, max_queue_delay_changed=False, known=True, state=State()
    )
    fields = loop.decision_status(to_zero, obs, "2026-12-05T17:30:00Z")
    assert fields["scaledToZeroAt"] == "2026-12-05T17:30:00Z"
    to_two = Decision(
        2, 0.005, "busy", replicas_changed=True, max_queue_delay_changed=False, known=True, state=State()
    )
    assert "scaledToZeroAt" not in loop.decision_status(to_two, obs, "2026-12-05T17:30:00Z")
