"""``spec.replicas`` of the Deployment: who owns it, and what the operator applies. Pure: no I/O.

With autoscaling on, the autoscaler (field manager ``kubeinfer-autoscaler``, through the scale
subresource) owns the replica count; the operator then leaves the field out of its apply, so the two
never fight over it.

Scale to zero (``autoscaling.minReplicas: 0``) is in force only where the operator is told that the
activator is installed (``Settings.activator_enabled``): without it a Service at zero has nothing to
hold its requests, so the floor stays 1. With it, 1 -> 0 is the autoscaler's decision (it records
``status.scaledToZeroAt`` before it scales), and 0 -> 1 is the reconciler's, here: when the activator's
demand annotation (:data:`kubeinfer.contract.activator.DEMAND_ANNOTATION`) is newer than that record
(:func:`demand_is_newer`), the apply carries ``replicas: 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.rfc3339 import parse_time

from kubeinfer.contract.activator import DEMAND_ANNOTATION


def scale_to_zero_asked(isvc: api.InferenceService) -> bool:
    """Whether the spec asks for scale to zero: autoscaling on with ``minReplicas: 0``."""
    scaling = isvc.spec.autoscaling
    return bool(scaling.enabled and scaling.min_replicas == 0)


def replica_floor(isvc: api.InferenceService, *, activator: bool) -> int:
    """The fewest replicas the Deployment may have with autoscaling on: 0 only when the spec asks for
    scale to zero and ``activator`` (the operator is told the activator is installed), else
    ``minReplicas`` and at least 1."""
    if scale_to_zero_asked(isvc) and activator:
        return 0
    return max(1, isvc.spec.autoscaling.min_replicas)


def demand_is_newer(demand: str | None, scaled_to_zero_at: str | None) -> bool:
    """Whether the activator's demand (the annotation's RFC 3339 value) asks for a replica after the
    service's scale to zero (``status.scaledToZeroAt``). A demand in the same second counts as newer
    (a replica too many for a moment, never a request lost); so does any demand when the moment of the
    scale to zero is not known. A missing or unreadable demand asks for nothing."""
    asked = parse_time(demand)
    if asked is None:
        return False
    since = parse_time(scaled_to_zero_at)
    return since is None or asked >= since


@dataclass(frozen=True)
class Wake:
    """A demand that takes a Deployment at zero back to one replica: ``demand`` (the annotation's
    value) and ``since`` (``status.scaledToZeroAt``, ``None``: not recorded)."""

    demand: str
    since: str | None

    def message(self) -> str:
        """The Event's words."""
        since = f"the scale to zero at {self.since}" if self.since else "an unrecorded scale to zero"
        return f"a request waits at the activator (demand at {self.demand}, after {since}): replicas 0 → 1"


def wake(
    body: Mapping[str, Any],
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    *,
    activator: bool,
) -> Wake | None:
    """The :class:`Wake` of an InferenceService (``body`` as stored: its demand annotation and
    ``status.scaledToZeroAt``) whose Deployment is at 0 replicas with scale to zero in force; ``None``
    otherwise (no Deployment, replicas above 0, no demand newer than the scale to zero)."""
    if deployment is None or replica_floor(isvc, activator=activator) != 0:
        return None
    if int((deployment.get("spec") or {}).get("replicas", 1)) != 0:
        return None
    demand = ((body.get("metadata") or {}).get("annotations") or {}).get(DEMAND_ANNOTATION)
    since = (body.get("status") or {}).get("scaledToZeroAt")
    since = since if isinstance(since, str) else None
    if not isinstance(demand, str) or not demand_is_newer(demand, since):
        return None
    return Wake(demand, since)


def replicas_managers(deployment: Mapping[str, Any]) -> set[str]:
    """Field managers that own ``spec.replicas`` of a Deployment (from ``metadata.managedFields``)."""
    owners: set[str] = set()
    for entry in (deployment.get("metadata") or {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if "f:replicas" in (fields.get("f:spec") or {}):
            owners.add(str(entry.get("manager", "")))
    return owners


def desired_replicas(
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    *,
    activator: bool = False,
    woken: bool = False,
) -> int | None:
    """``spec.replicas`` for the applied Deployment, or ``None`` to leave it out.

    Autoscaling off: ``spec.replicas``. On: :func:`initial_replicas` when creating; afterwards the
    current value clamped to ``[floor, maxReplicas]`` (:func:`replica_floor`, with ``activator``) — left
    out (``None``) when another manager (the autoscaler, ``kubectl scale``) owns it and it is within
    bounds, so the operator never fights the autoscaler; included while the operator is its only owner
    (so it is not dropped to the default). ``woken`` (:func:`wake` found a demand): 1.
    """
    spec = isvc.spec
    if not spec.autoscaling.enabled:
        fixed: int = spec.replicas
        return fixed
    if woken:
        return 1
    lo = replica_floor(isvc, activator=activator)
    return autoscaled_replicas(deployment, lo, spec.autoscaling.max_replicas, initial_replicas(isvc))


def autoscaled_replicas(deployment: Mapping[str, Any] | None, lo: int, hi: int, initial: int) -> int | None:
    """``spec.replicas`` to apply to a Deployment whose replicas the autoscaler decides (an
    InferenceService's or a ModelPool's), or ``None`` to leave it out: ``initial`` when creating; then the
    current value clamped to ``[lo, hi]``, left out when another manager owns it within bounds, included
    while the operator is its only owner (so that an apply does not drop it to the default)."""
    if deployment is None:
        return initial
    current = int((deployment.get("spec") or {}).get("replicas", 1))
    if current < lo or current > hi:
        return min(max(current, lo), hi)
    if replicas_managers(deployment) - {api.FIELD_MANAGER}:
        return None
    return current


def pool_replicas(pool: api.ModelPool, deployment: Mapping[str, Any] | None) -> int | None:
    """``spec.replicas`` for a ModelPool's applied Deployment, or ``None`` to leave it out: autoscaling off,
    ``spec.replicas``; on, :func:`autoscaled_replicas` within ``[minReplicas, maxReplicas]`` (a pool keeps
    at least 1 replica: no scale to zero), starting at ``minReplicas``."""
    scaling = pool.spec.autoscaling
    if not scaling.enabled:
        return pool.spec.replicas
    lo = max(1, scaling.min_replicas)
    return autoscaled_replicas(deployment, lo, scaling.max_replicas, lo)


def initial_replicas(isvc: api.InferenceService) -> int:
    """Replicas the InferenceService asks for before its Deployment exists: ``minReplicas`` (at least
    1: a new service starts with a replica, scale to zero or not) with autoscaling on, else
    ``spec.replicas``."""
    spec = isvc.spec
    return max(1, spec.autoscaling.min_replicas) if spec.autoscaling.enabled else spec.replicas
