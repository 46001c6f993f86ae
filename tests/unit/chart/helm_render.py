"""Render the kubeinfer chart with the real ``helm`` built by ``make setup`` (``.cache/bin/helm``)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from kubeinfer.contract.activator import COMPONENT_LABEL

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "kubeinfer"
HELM = ROOT / ".cache" / "bin" / "helm"
GO_MOD = ROOT / "hack" / "go.mod"


def pinned_kube_version() -> tuple[int, int]:
    """(major, minor) of the Kubernetes that hack/go.mod pins, from its ``k8s.io/client-go v0.X.Y``
    (the line helm's own build reads). ``make setup`` links that into helm as its default
    Kubernetes version for renders without a cluster."""
    m = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", GO_MOD.read_text(), re.MULTILINE)
    assert m, f"no k8s.io/client-go v0.X.Y requirement in {GO_MOD}"
    return 1, int(m.group(1))


def helm_env(home: Path) -> dict[str, str]:
    """Environment isolating helm's cache/config/data dirs under ``home``."""
    import os

    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(*args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``helm`` with isolated home dirs; raises ``AssertionError`` with stderr on failure if check."""
    with tempfile.TemporaryDirectory(prefix="helm-") as home:
        cp = subprocess.run(
            [str(HELM), *args], capture_output=True, text=True, timeout=timeout, env=helm_env(Path(home))
        )
    if check and cp.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {cp.returncode}:\n{cp.stderr}")
    return cp


def render(
    *set_args: str,
    values: dict[str, Any] | None = None,
    api_versions: tuple[str, ...] = (),
    namespace: str = "kubeinfer-system",
) -> list[dict[str, Any]]:
    """``helm template`` the chart; returns the documents (CRDs excluded unless asked by the caller).

    ``set_args`` are ``--set`` expressions, ``values`` a values mapping passed as a file.
    """
    args = ["template", "kubeinfer", str(CHART), "--namespace", namespace]
    for s in set_args:
        args += ["--set", s]
    for v in api_versions:
        args += ["--api-versions", v]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        if values is not None:
            yaml.safe_dump(values, f)
            f.flush()
            args += ["-f", f.name]
        out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of one kind."""
    return [d for d in docs if d.get("kind") == kind]


def of_component(docs: list[dict[str, Any]], kind: str, component: str = "operator") -> list[dict[str, Any]]:
    """The documents of one kind that belong to ``component``: the chart's objects carry the contract's
    ``COMPONENT_LABEL``, ``operator`` or ``activator`` (``ACTIVATOR_COMPONENT``)."""
    return [
        d
        for d in by_kind(docs, kind)
        if (d["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == component
    ]
