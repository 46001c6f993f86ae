"""Reconciliation: plan (pure) and the reconciler (applies the plan through ``kubeinfer.operator.k8s``)."""

from kubeinfer.operator.reconcile.reconciler import Reconciler, apply_if_changed, isvc_path

__all__ = ["Reconciler", "apply_if_changed", "isvc_path"]
