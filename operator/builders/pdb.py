"""``build_pdb``: the PodDisruptionBudget of an InferenceService (only with more than one replica)."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import metadata, selector_labels, with_applied_hash


def wants_pdb(isvc: api.InferenceService) -> bool:
    """True when the InferenceService may run more than one replica.

    Autoscaling off: ``spec.replicas > 1``; on: ``autoscaling.maxReplicas > 1``.
    """
    spec = isvc.spec
    wanted: bool = spec.autoscaling.max_replicas > 1 if spec.autoscaling.enabled else spec.replicas > 1
    return wanted


def build_pdb(isvc: api.InferenceService) -> dict[str, Any] | None:
    """A ``policy/v1`` PodDisruptionBudget with ``maxUnavailable: 1``, or ``None`` if not wanted.

    ``maxUnavailable: 1`` lets a node drain proceed one replica at a time, keeping the rest serving.
    """
    if not wants_pdb(isvc):
        return None
    obj: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, isvc.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(isvc)}},
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
