"""The Argo CD health check of docs/status-and-gitops.md (its ```lua block), run with a Lua
interpreter (lupa) on the status the operator computes in each state; the same script runs against
the API server's objects in tests/integration/operator/test_operator_rollout.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.reconcile import diagnosis, report

from tests.unit.operator.test_operator_health import deployment, health, pod, replicaset

lupa = pytest.importorskip("lupa")
GITOPS_DOC = Path(__file__).resolve().parents[3] / "docs" / "status-and-gitops.md"


def argocd(obj: dict[str, Any]) -> tuple[str, str]:
    (script,) = re.findall(r"```lua\n(.*?)```", GITOPS_DOC.read_text(), flags=re.S)
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(script)
    return str(hs["status"]), str(hs["message"])


def isvc(state: diagnosis.Health | None, *, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed}
    if state is not None:
        status["conditions"] = report.conditions_for({}, state, "T", generation, autoscaling=False)
    return {"metadata": {"name": "m", "generation": generation}, "status": status}


def test_argocd_health_of_each_state() -> None:
    assert argocd({"metadata": {"generation": 1}})[0] == "Progressing"  # no status yet
    stale = isvc(health(deployment(replicas=1, updated=1, ready=1)), generation=3, observed=2)
    assert argocd(stale)[0] == "Progressing"  # the operator has not seen the new spec
    rolling = isvc(health(deployment(replicas=2, updated=1, ready=1)))
    assert argocd(rolling) == (
        "Progressing",
        "Progressing: 0/1 replicas updated and ready (1 updated, 1 ready, 2 pods)",
    )
    rs = [replicaset("1", "old", 1), replicaset("2", "new", 0)]
    broken = isvc(
        health(deployment(replicas=2, updated=1, ready=1), [pod("b", "new", "ImagePullBackOff")], rs)
    )
    status, message = argocd(broken)
    assert status == "Degraded" and message.startswith("ImagePullBackOff: pod b")
    assert argocd(isvc(health(deployment(replicas=1, updated=1, ready=1)))) == (
        "Healthy",
        "1/1 replicas ready",
    )
