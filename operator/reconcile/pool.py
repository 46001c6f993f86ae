"""What a ModelPool serves and what its status and its InferenceServices' say. Pure: no I/O.

- :func:`pool_members`: the InferenceServices of a namespace that name the pool (``spec.pool``), those
  being deleted or failing their own validation left out, sorted by name; a served model name is the
  first one's (by InferenceService name), the others are left out of the pool (``ModelNameTaken``).
- :func:`pinned_in_force`: the pool's ``pinned`` models that it serves (the runtime refuses to start with
  a pinned model it does not have).
- :func:`pool_status`: the ModelPool's status (Ready, ``models``, the counts, and from its replicas'
  model repository indexes the loaded models, bytes and evictions: :mod:`poolindex`).
- :func:`pooled_status`: the status of an InferenceService on a pool (Ready from the pool's and from its
  model's loads on the pool's replicas, ``status.model``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from kubeinfer.operator import api, conditions, status
from kubeinfer.operator.builders.common import pool_selector_labels
from kubeinfer.operator.reconcile.diagnosis import stalled_state
from kubeinfer.operator.reconcile.poolindex import PoolIndex, load_failure, pool_usage, pooled_model_status
from kubeinfer.operator.reconcile.report import ready_conditions
from kubeinfer.operator.status import ConditionState

from kubeinfer.contract.pool import POOL_LABEL


@dataclass(frozen=True)
class PoolMembers:
    """The InferenceServices a pool serves (``models``, sorted by name, served names distinct) and those
    left out because another took their served name (``taken``: InferenceService name -> the other's)."""

    models: tuple[api.InferenceService, ...] = ()
    taken: Mapping[str, str] = field(default_factory=dict)

    def served_names(self) -> list[str]:
        """The served model names, in the order of :attr:`models`."""
        return [m.spec.served_model_name(m.name) for m in self.models]


def pool_members(pool: str, namespace: str, bodies: Iterable[Mapping[str, Any]]) -> PoolMembers:
    """The members of the pool ``pool`` of ``namespace`` among the InferenceService ``bodies`` (as
    watched; any namespace): those whose ``spec.pool`` names it, not being deleted, whose spec passes
    validation (an invalid one shows ``InvalidSpec`` on its own), the first by name keeping a served
    model name."""
    found: list[api.InferenceService] = []
    for body in bodies:
        meta = body.get("metadata") or {}
        if meta.get("namespace") != namespace or meta.get("deletionTimestamp"):
            continue
        if (body.get("spec") or {}).get("pool") != pool:
            continue
        try:
            found.append(api.InferenceService.from_body(body))
        except pydantic.ValidationError:
            continue
    models: list[api.InferenceService] = []
    owner: dict[str, str] = {}
    taken: dict[str, str] = {}
    for isvc in sorted(found, key=lambda i: i.name):
        served = isvc.spec.served_model_name(isvc.name)
        if served in owner:
            taken[isvc.name] = owner[served]
            continue
        owner[served] = isvc.name
        models.append(isvc)
    return PoolMembers(tuple(models), taken)


def pinned_in_force(pool: api.ModelPool, members: PoolMembers) -> list[str]:
    """``spec.pinned`` without the models the pool does not serve (no InferenceService names the pool
    with that served name yet), in the spec's order."""
    served = set(members.served_names())
    return [name for name in pool.spec.pinned if name in served]


def is_pool_deployment(deployment: Mapping[str, Any] | None, pool: str) -> bool:
    """Whether ``deployment`` (as watched) is the pool ``pool``'s: it carries the pool's label."""
    labels = ((deployment or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(POOL_LABEL) == pool)


def _ready_counts(deployment: Mapping[str, Any] | None) -> tuple[int, int]:
    dstatus = (deployment or {}).get("status") or {}
    desired = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
    return int(dstatus.get("readyReplicas") or 0), desired


def pool_ready(
    pool: api.ModelPool, deployment: Mapping[str, Any] | None, *, name_taken: bool
) -> ConditionState:
    """The ModelPool's Ready: ``PoolNameTaken`` when a Deployment of its name is not its own, True
    ``PoolReady`` when every one of ``spec.replicas`` is ready, else ``PoolNotReady`` with the counts."""
    if name_taken:
        return ConditionState(
            "False",
            conditions.POOL_NAME_TAKEN,
            f"Deployment {pool.name} exists and is not this pool's: nothing of the pool was applied",
        )
    ready, desired = _ready_counts(deployment)
    # with autoscaling on, the autoscaler's count (the Deployment's) is the one to be ready
    wanted = desired if pool.spec.autoscaling.enabled and deployment is not None else pool.spec.replicas
    words = f"{ready}/{wanted} replicas ready"
    if deployment is not None and ready >= wanted:
        return ConditionState("True", conditions.POOL_READY, words)
    return ConditionState("False", conditions.POOL_NOT_READY, words)


def _with_stalled(
    conds: list[dict[str, Any]], ready: ConditionState, now: str, generation: int
) -> list[dict[str, Any]]:
    """``conds`` with Stalled set as Ready's reason says (:func:`diagnosis.stalled_state`)."""
    return status.put_condition(conds, conditions.CONDITION_STALLED, stalled_state(ready), now, generation)


def pool_status(
    pool: api.ModelPool,
    deployment: Mapping[str, Any] | None,
    members: PoolMembers,
    current_status: Mapping[str, Any],
    now: str,
    *,
    name_taken: bool = False,
    index: PoolIndex | None = None,
) -> dict[str, Any]:
    """The ModelPool's status fields (camelCase): ``observedGeneration``, ``conditions`` (Ready,
    :func:`pool_ready`), ``models`` (InferenceServices it serves), ``replicas`` and ``readyReplicas``
    (its Deployment's, 0 without one), ``observed`` and ``lastDecision`` removed and AutoscalingActive
    with them while autoscaling is off (the autoscaler writes them), and from ``index`` (its ready
    replicas' model repository indexes) :func:`poolindex.pool_usage`'s fields (removed while no replica
    answered)."""
    counts = status.counts(None if name_taken else deployment)
    ready = pool_ready(pool, deployment, name_taken=name_taken)
    conds = _with_stalled(
        ready_conditions(current_status, ready, now, pool.generation), ready, now, pool.generation
    )
    # the autoscaler's fields (``observed``, ``lastDecision``, AutoscalingActive) go with autoscaling off
    autoscaled: dict[str, Any] = {}
    if not pool.spec.autoscaling.enabled:
        conds = status.remove_condition(conds, conditions.CONDITION_AUTOSCALING_ACTIVE)
        autoscaled = {"observed": None, "lastDecision": None}
    return {
        "observedGeneration": pool.generation,
        "conditions": conds,
        "models": len(members.models),
        "replicas": counts["replicas"],
        "readyReplicas": counts["readyReplicas"],
        **autoscaled,
        **pool_usage(None if name_taken else index, str(pool.spec.memory_budget)),
    }


def pooled_ready(
    isvc: api.InferenceService,
    pool_body: Mapping[str, Any] | None,
    deployment: Mapping[str, Any] | None,
    taken_by: str | None,
    index: PoolIndex | None = None,
) -> ConditionState:
    """Ready of an InferenceService on the pool ``spec.pool``: ``PoolNotFound`` without the ModelPool
    ``pool_body``, ``ModelNameTaken`` when ``taken_by`` (another InferenceService) serves its model name,
    ``PoolNotReady`` while the pool's ``deployment`` has no ready replica, ``ModelLoadFailed`` when
    ``index`` (the pool's replicas' repository indexes) says its latest load on a pod failed (naming the
    pod and the runtime's cause), else True ``PoolReady``."""
    pool = isvc.spec.pool
    if pool_body is None:
        return ConditionState(
            "False", conditions.POOL_NOT_FOUND, f"ModelPool {pool} not found in namespace {isvc.namespace}"
        )
    served = isvc.spec.served_model_name(isvc.name)
    if taken_by is not None:
        return ConditionState(
            "False",
            conditions.MODEL_NAME_TAKEN,
            f"InferenceService {taken_by} serves the model {served!r} on ModelPool {pool}",
        )
    ready, desired = _ready_counts(deployment if is_pool_deployment(deployment, str(pool)) else None)
    words = f"ModelPool {pool}: {ready}/{desired} replicas ready"
    if ready == 0:
        return ConditionState("False", conditions.POOL_NOT_READY, words)
    failed = load_failure(served, index)
    if failed is not None:
        pod, cause = failed
        return ConditionState(
            "False",
            conditions.MODEL_LOAD_FAILED,
            f"model {served!r} failed to load on pod {pod} of ModelPool {pool}: {cause}",
        )
    return ConditionState(
        "True", conditions.POOL_READY, f"{words}; model {served!r} loads on its first request"
    )


def pooled_status(
    isvc: api.InferenceService,
    ready: ConditionState,
    current_status: Mapping[str, Any],
    now: str,
    index: PoolIndex | None = None,
) -> dict[str, Any]:
    """The status fields of a pooled InferenceService: ``observedGeneration``, Ready (``ready``, from
    :func:`pooled_ready`; the conditions of an InferenceService with pods of its own removed), the URL,
    the selector of the pool's pods, ``model`` (its model on the pool's replicas from ``index``:
    :func:`poolindex.pooled_model_status`; removed while no replica answered); the counts and the max
    queue delay of its own pods removed (and the fields an older operator wrote under another name)."""
    conds = _with_stalled(
        ready_conditions(current_status, ready, now, isvc.generation), ready, now, isvc.generation
    )
    for type_ in (
        conditions.CONDITION_SERVING,
        conditions.CONDITION_RECONCILING,
        conditions.CONDITION_SCALE_TO_ZERO,
        conditions.CONDITION_AUTOSCALING_ACTIVE,
    ):
        conds = status.remove_condition(conds, type_)
    labels = pool_selector_labels(str(isvc.spec.pool))
    # without its pool, or with its model name another's, the pool's indexes say nothing of it
    serves = ready.reason not in (conditions.POOL_NOT_FOUND, conditions.MODEL_NAME_TAKEN)
    return {
        "observedGeneration": isvc.generation,
        "conditions": conds,
        "url": api.service_url(isvc.name, isvc.namespace),
        "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "replicas": None,
        "readyReplicas": None,
        "updatedReplicas": None,
        "updatedReady": None,
        "maxQueueDelay": None,
        **dict.fromkeys(api.RENAMED_STATUS_FIELDS),
        "model": pooled_model_status(isvc.spec.served_model_name(isvc.name), index if serves else None),
    }
