"""Fixtures of the operator's integration tests: CRDs installed, a module namespace, one operator."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    """The InferenceService and kopf peering CRDs, applied from crds/ and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for name in ("inferenceservices.kubeinfer.io", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    # discovery of the new kind by kubectl (cached) can lag the CRD by a moment
    wait_until(
        lambda: cluster.kubectl("get", "kisvc", "-A", check=False).returncode == 0,
        timeout=30,
        message="kubectl knows kisvc",
    )


@pytest.fixture(scope="module")
def op_namespace(cluster: Cluster, crds: None) -> Iterator[str]:
    """A namespace for the whole module (the operator watches only it)."""
    name = f"kisvc-op-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    try:
        yield name
    finally:
        cluster.release_finalizers(name)
        cluster.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One standalone ``kubeinfer-operator`` watching ``op_namespace``, resync every 2 s."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=2.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env=dict(TEST_ENV),
        proxy=True,  # its write requests are counted apart from other processes'
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])
