"""The status fields the reconciler owns, computed from a :class:`~diagnosis.Health`: the conditions
(Ready first, Serving, Reconciling and Stalled while true), ``observedGeneration``, the counts, the
selector, the URL and the max queue delay in force. Pure: no I/O (the write is
:class:`kubeinfer.operator.status.StatusWriter`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator import api, conditions, status
from kubeinfer.operator.builders.common import selector_string
from kubeinfer.operator.reconcile import replicas
from kubeinfer.operator.reconcile.diagnosis import Health, stalled_state
from kubeinfer.operator.reconcile.replicas import initial_replicas
from kubeinfer.operator.reconcile.rollout import Rollout
from kubeinfer.operator.reconcile.routing import route_words
from kubeinfer.operator.status import ConditionState


def ready_conditions(
    current_status: Mapping[str, Any], ready: ConditionState, now: str, generation: int
) -> list[dict[str, Any]]:
    """``status.conditions`` with the Ready condition set to ``ready`` (first), the other types kept
    as they are (:func:`status.set_condition`: ``lastTransitionTime``, ``now`` when it changes, is
    kept unless the status changes)."""
    conds = [c for c in current_status.get("conditions") or [] if isinstance(c, Mapping)]
    out = status.put_condition(conds, conditions.CONDITION_READY, ready, now, generation)
    return sorted(out, key=lambda c: c.get("type") != conditions.CONDITION_READY)


def scale_to_zero_state(
    isvc: api.InferenceService, *, activator: bool, routed: bool | None = None
) -> ConditionState | None:
    """The ``ScaleToZero`` condition: ``None`` (absent) unless the spec asks for scale to zero
    (:func:`replicas.scale_to_zero_asked`); True ``ScaleToZeroEnabled`` with ``activator`` (the operator
    is told the activator is installed), its message ending with where the Service routes (``routed``:
    ``True`` to the activator, ``False`` to the pods, ``None`` not known), else False
    ``ScaleToZeroUnavailable``: the service keeps a replica, and says why."""
    if not replicas.scale_to_zero_asked(isvc):
        return None
    if activator:
        idle = isvc.spec.autoscaling.scale_to_zero_in_force.idle_after
        route = "" if routed is None else f"; {route_words(routed)}"
        return ConditionState(
            "True",
            conditions.SCALE_TO_ZERO_ENABLED,
            f"scales to zero after {idle} without requests; a request brings a replica back{route}",
        )
    return ConditionState(
        "False",
        conditions.SCALE_TO_ZERO_UNAVAILABLE,
        "minReplicas 0 needs the activator, and this operator is not told it is installed "
        "(KUBEINFER_ACTIVATOR_ENABLED=true with KUBEINFER_ACTIVATOR_SERVICE): the service keeps 1 replica",
    )


def at_zero_words(isvc: api.InferenceService, *, activator: bool) -> str | None:
    """The Ready message of a service scaled to zero on purpose, ``None`` when scale to zero is not in
    force (:func:`replicas.replica_floor` above 0)."""
    if replicas.replica_floor(isvc, activator=activator) != 0:
        return None
    idle = isvc.spec.autoscaling.scale_to_zero_in_force.idle_after
    return f"no replica: no requests for {idle}; a request brings one back"


def conditions_for(
    current_status: Mapping[str, Any],
    state: Health,
    now: str,
    generation: int,
    *,
    autoscaling: bool,
    scale_to_zero: ConditionState | None = None,
) -> list[dict[str, Any]]:
    """``status.conditions``: Ready (first), Serving, Reconciling and Stalled (removed when false)
    set from ``state``; ScaleToZero set to ``scale_to_zero`` (removed when ``None``); AutoscalingActive
    (the autoscaler's) kept while autoscaling is on, removed when it is off; every condition the
    operator sets carries ``generation``."""
    conds = ready_conditions(current_status, state.ready, now, generation)
    for type_, value in (
        (conditions.CONDITION_SERVING, state.serving),
        (conditions.CONDITION_RECONCILING, state.reconciling),
        (conditions.CONDITION_STALLED, state.stalled),
        (conditions.CONDITION_SCALE_TO_ZERO, scale_to_zero),
    ):
        conds = status.put_condition(conds, type_, value, now, generation)
    if not autoscaling:
        conds = status.remove_condition(conds, conditions.CONDITION_AUTOSCALING_ACTIVE)
    return conds


def fault_conditions(
    current_status: Mapping[str, Any], ready: ConditionState, now: str, generation: int
) -> list[dict[str, Any]]:
    """``status.conditions`` for a fault found before the Deployment is looked at (an invalid spec, a
    reference the policy refuses): Ready and Stalled with its reason (:func:`stalled_state`: ``True``
    for each of those faults), Reconciling removed, the other types kept."""
    conds = ready_conditions(current_status, ready, now, generation)
    conds = status.remove_condition(conds, conditions.CONDITION_RECONCILING)
    return status.put_condition(conds, conditions.CONDITION_STALLED, stalled_state(ready), now, generation)


def desired_status(
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    state: Health,
    current_status: Mapping[str, Any],
    now: str,
    *,
    activator: bool = False,
    routed: bool | None = None,
) -> dict[str, Any]:
    """The status fields the operator owns (camelCase), given the current status (for transitions).
    ``activator``: the operator is told the activator is installed, ``routed``: where the Service routes
    (the ScaleToZero condition, :func:`scale_to_zero_state`).

    Conditions from :func:`conditions_for` (``now``: RFC 3339; a condition keeps its
    ``lastTransitionTime`` unless its status changes). Counts mirror the Deployment's
    (:func:`status.counts`: ``replicas`` counts old and surge pods too; ``updatedReplicas``,
    ``readyReplicas``); ``updatedReady`` is ``updated-ready/desired`` (the Replicas printer column).
    ``maxQueueDelay``: with autoscaling off the spec's maxQueueDelay; with it on, only filled in when
    the autoscaler has not set one yet (the value in force, so the printer column is never empty). The
    fields an older operator wrote under another name (``batchTimeout``) are deleted.
    With autoscaling off, the autoscaler's ``observed`` and ``quantization`` are removed (``None`` in a
    merge patch deletes the field): nothing keeps them current then.
    """
    autoscaling = isvc.spec.autoscaling.enabled
    rollout = state.rollout or Rollout(desired=initial_replicas(isvc))
    out: dict[str, Any] = {
        "observedGeneration": isvc.generation,
        "conditions": conditions_for(
            current_status,
            state,
            now,
            isvc.generation,
            autoscaling=autoscaling,
            scale_to_zero=scale_to_zero_state(isvc, activator=activator, routed=routed),
        ),
        **status.counts(deployment),
        "updatedReady": rollout.summary(),
        "selector": selector_string(isvc),
        "url": api.service_url(isvc.name, isvc.namespace),
    }
    if not autoscaling:
        out["observed"] = None
        out["quantization"] = None
    if not autoscaling or isvc.status.max_queue_delay is None:
        out["maxQueueDelay"] = api.format_duration(
            isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay)
        )
    out.update(dict.fromkeys(api.RENAMED_STATUS_FIELDS))  # what an older operator wrote, deleted
    return out
