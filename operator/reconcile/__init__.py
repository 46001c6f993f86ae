"""Reconciliation: the pure planning modules (``diff``, ``replicas``, ``rollout``, ``diagnosis``,
``report``, ``events``, ``backoff``) and the reconciler, which applies the plan through
``kubeinfer.operator.k8s`` and writes status through ``kubeinfer.operator.status``."""

from kubeinfer.operator.reconcile.reconciler import Reconciler, apply_if_changed

__all__ = ["Reconciler", "apply_if_changed"]
