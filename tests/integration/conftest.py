"""Fixtures shared by the integration tests that talk to the API server: the CRDs installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    """The InferenceService, ModelPool and kopf peering CRDs, applied from crds/ and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for name in (
        "inferenceservices.kubeinfer.io",
        "modelpools.kubeinfer.io",
        "kopfpeerings.kopf.dev",
        "clusterkopfpeerings.kopf.dev",
    ):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    # discovery of the new kind by kubectl (cached) can lag the CRD by a moment
    wait_until(
        lambda: cluster.kubectl("get", "kisvc", "-A", check=False).returncode == 0,
        timeout=30,
        message="kubectl knows kisvc",
    )
