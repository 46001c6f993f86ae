"""Fixtures of the robustness tests: the operator team's (CRDs, a module namespace, one operator)."""

from tests.integration.operator.conftest import crds, op_namespace, operator

__all__ = ["crds", "op_namespace", "operator"]
