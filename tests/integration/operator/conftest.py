"""Fixtures of the operator's integration tests: a module namespace (the CRDs installed: ``crds`` in
tests/integration/conftest.py), one operator."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.support.cluster import Cluster


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
