"""``spec.replicas`` of the Deployment: who owns it, and what the operator applies. Pure: no I/O.

With autoscaling on, the autoscaler (field manager ``kubeinfer-autoscaler``, through the scale
subresource) owns the replica count; the operator then leaves the field out of its apply, so the two
never fight over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator import api


def replicas_managers(deployment: Mapping[str, Any]) -> set[str]:
    """Field managers that own ``spec.replicas`` of a Deployment (from ``metadata.managedFields``)."""
    owners: set[str] = set()
    for entry in (deployment.get("metadata") or {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if "f:replicas" in (fields.get("f:spec") or {}):
            owners.add(str(entry.get("manager", "")))
    return owners


def desired_replicas(isvc: api.InferenceService, deployment: Mapping[str, Any] | None) -> int | None:
    """``spec.replicas`` for the applied Deployment, or ``None`` to leave it out.

    Autoscaling off: ``spec.replicas``. On: ``minReplicas`` when creating; afterwards the current
    value clamped to ``[minReplicas, maxReplicas]`` — left out (``None``) when another manager (the
    autoscaler, ``kubectl scale``) owns it and it is within bounds, so the operator never fights the
    autoscaler; included while the operator is its only owner (so it is not dropped to the default).
    """
    spec = isvc.spec
    if not spec.autoscaling.enabled:
        fixed: int = spec.replicas
        return fixed
    lo: int = spec.autoscaling.min_replicas
    hi: int = spec.autoscaling.max_replicas
    if deployment is None:
        return lo
    current = int((deployment.get("spec") or {}).get("replicas", 1))
    if current < lo or current > hi:
        return min(max(current, lo), hi)
    if replicas_managers(deployment) - {api.FIELD_MANAGER}:
        return None
    return current


def initial_replicas(isvc: api.InferenceService) -> int:
    """Replicas the InferenceService asks for before its Deployment exists: ``minReplicas`` with
    autoscaling on, else ``spec.replicas``."""
    spec = isvc.spec
    return spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas
