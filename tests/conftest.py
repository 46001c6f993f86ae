"""Shared pytest fixtures (owned by the control-plane team).

- ``cluster`` (session): :class:`tests.support.cluster.Cluster` for a real etcd + kube-apiserver +
  kube-controller-manager started once per session (``hack/cluster.py``), or for the cluster of
  ``$KUBEINFER_TEST_KUBECONFIG`` when set. Fails with "run make setup" if the binaries are missing.
- ``namespace`` (function): name of a fresh namespace (its ``default`` ServiceAccount exists),
  deleted after the test.
- ``prometheus`` (function): a started :class:`hack.devtools.prom.PrometheusServer`, 1 s scrape
  interval, file_sd targets (``.set_targets``), stopped after the test.
- ``prometheus_factory`` (function): ``factory(scrape_interval=1.0, **kwargs) -> PrometheusServer``
  (started); every server it made is stopped after the test.

Timing facts of the real control plane worth knowing when writing tests: the cluster starts in ~5 s;
Deployment -> ReplicaSet -> Pods and their garbage collection take about a second; but the garbage
collector discovers NEW resource types (a CRD just installed) only on its 30 s discovery resync, so
the first deletion of a custom-resource owner after its CRD was created may take up to ~40 s to
cascade (later ones are prompt). Pods never run on this control plane (no kubelet, no scheduler): the
tests that need running pods are in tests/e2e, on a one-node cluster (tests/e2e/conftest.py).

See the docstrings of tests/support/cluster.py and hack/devtools/prom.py for the APIs.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.cluster import DEFAULT_BIN_DIR, ClusterError, check_binaries, start, stop
from hack.devtools.prom import PrometheusServer
from tests.support.cluster import Cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    scratch = tmp_path_factory.mktemp("cluster-client")
    external = os.environ.get("KUBEINFER_TEST_KUBECONFIG")
    if external:
        yield Cluster(Path(external), bin_dir=DEFAULT_BIN_DIR, scratch=scratch)
        return
    try:
        check_binaries(DEFAULT_BIN_DIR)
    except ClusterError as e:
        pytest.fail(f"{e}\n(run `make setup` first)", pytrace=False)
    workdir = tmp_path_factory.mktemp("cluster")
    try:
        info = start(workdir, die_with_parent=True, timeout=120.0)
    except ClusterError as e:
        pytest.fail(f"could not start the local control plane: {e}", pytrace=False)
    try:
        yield Cluster(info.kubeconfig, info=info, bin_dir=info.bin_dir, scratch=scratch)
    finally:
        stop(info, log=lambda _msg: None)


def _namespace_name(node_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", node_name.lower()).strip("-")[:40].strip("-") or "t"
    return f"{base}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    cluster.create_namespace(name)
    try:
        yield name
    finally:
        cluster.delete_namespace(name)
        cluster.release_finalizers(name)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    servers: list[PrometheusServer] = []

    def factory(scrape_interval: float = 1.0, **kwargs: Any) -> PrometheusServer:
        server = PrometheusServer(
            tmp_path / f"prometheus-{len(servers)}", scrape_interval=scrape_interval, **kwargs
        )
        servers.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def prometheus(prometheus_factory: Callable[..., PrometheusServer]) -> PrometheusServer:
    return prometheus_factory()
