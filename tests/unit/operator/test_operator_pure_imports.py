"""The pure modules load without the API-server client: importing a builder or a planner (in a fresh
interpreter) leaves ``kubernetes_asyncio``, ``kopf`` and the operator's client module out of
``sys.modules``. import-linter checks the modules' own imports; this also catches what a package's
``__init__`` pulls in on the way (a re-export of the reconciler made ``reconcile.diff`` load the
client)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules that must import without the API-server client.
PURE = (
    "kubeinfer.operator.builders",
    "kubeinfer.operator.reconcile.diff",
    "kubeinfer.operator.reconcile.diagnosis",
    "kubeinfer.operator.reconcile.events",
    "kubeinfer.operator.reconcile.report",
    "kubeinfer.operator.reconcile.pool",
    "kubeinfer.operator.autoscale.policy",
)
#: What none of them may load.
CLIENT = ("kubernetes_asyncio", "kopf", "kubeinfer.operator.k8s", "kubeinfer.operator.reconcile.reconciler")

PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(" ".join(m for m in sys.argv[2:] if m in sys.modules))
"""


def loaded_by(module: str, watched: tuple[str, ...] = CLIENT) -> list[str]:
    """The modules of ``watched`` that importing ``module`` in a fresh interpreter loads."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module, *watched],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.split()


@pytest.mark.parametrize("module", PURE)
def test_pure_module_does_not_load_the_api_client(module: str) -> None:
    assert loaded_by(module) == []


def test_the_probe_sees_the_client_where_it_is_loaded() -> None:
    assert "kubernetes_asyncio" in loaded_by("kubeinfer.operator.reconcile.reconciler")
