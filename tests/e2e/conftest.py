"""Fixtures of the end-to-end tests: a one-node cluster whose pods really run.

- ``cluster`` (session; overrides the control-plane-only one of tests/conftest.py for tests/e2e):
  ``make images`` (hack/images.py, a no-op when nothing changed), then ``hack/cluster.py`` with a node
  (kubelet, containerd, kube-proxy, CoreDNS on the pod bridge). At the end the cluster is stopped
  and the test session fails when anything was left behind on the machine (processes, mounts,
  network namespaces, the bridge, nftables rules, cgroups): ``hack.cluster.leftovers``.
- ``namespace`` (tests/conftest.py) then makes namespaces on this cluster.
- ``node_prometheus`` (session): Prometheus (built by ``make setup``: Debian's has no kubernetes_sd) on
  the node address, discovering pods with
  kubernetes_sd and the relabelling of the chart's PodMonitor (translated as the Prometheus Operator
  would), 1 s scrape interval.
- ``operator_release`` (session): ``helm install`` of charts/kubeinfer into ``kubeinfer-system``
  (the operator runs as a pod from the locally built image, reading ``node_prometheus``).
- ``graph_cache`` (session): one directory on the node that every module's MiniLM services use as
  their graph cache (``spec.server.graphCache``, as a user with many replicas of one model would): the
  first pod of the session exports and quantizes the model, every later one loads those graphs (a
  250m replica Ready in about 10 s instead of about 40). Its ``claim(namespace)`` makes the claim.
- ``quiet_node`` (a marker of test files): files whose assertions time the node's CPU (the autoscaler's
  closed loop, a burst learned and met, bounds in seconds on what the node does) run after every other
  file of the session, and first wait for the lock named by ``KUBEINFER_QUIET_NODE_LOCK``: the lock that
  the tier `make test` runs beside this one holds while it runs (``hack/test.sh``). Unset (this tier
  alone), nothing waits.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.builders.deployment import RUNTIME_UID

from hack import images
from hack.cluster import ClusterError, check_binaries, leftovers, start, stop
from hack.devtools.prom import (
    NODE_PROMETHEUS_BIN,
    PrometheusServer,
    podmonitor_scrape_config,
    servicemonitor_scrape_config,
)
from hack.podnetwork import NODE_IP
from tests.support.cluster import Cluster, wait_until
from tests.support.tierlock import wait_for_quiet_node

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeinfer"
OPERATOR_NAMESPACE = "kubeinfer-system"
RELEASE = "kubeinfer"
#: The label selector of the chart's operator pods (the activator's pods share the name, not the component).
OPERATOR_PODS = "app.kubernetes.io/name=kubeinfer,app.kubernetes.io/component=operator"
#: The environment variable that names the lock of a tier running beside this one (``hack/test.sh``).
QUIET_NODE_LOCK_ENV = "KUBEINFER_QUIET_NODE_LOCK"
#: Seconds the ``quiet_node`` files wait for that lock before they run anyway: the integration tier's
#: budget, twice.
QUIET_NODE_WAIT_SECONDS = 1440.0
#: ``helm install`` flags of the tests' releases: the operator's readiness probed every 2 s from 1 s
#: (the chart's default, 5 s then every 10 s, keeps a started operator un-Ready for up to 10 s more;
#: the tests start one several times: installs, a rollout restart, a scale back to 1). Same endpoint.
FAST_READINESS = (
    "--set", "readinessProbe.initialDelaySeconds=1",
    "--set", "readinessProbe.periodSeconds=2",
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "quiet_node: the file times the node's CPU: it runs after the others, once no tier runs beside "
        f"this one (the lock ${QUIET_NODE_LOCK_ENV} names)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``quiet_node`` files after every other (a stable sort: each part keeps its order)."""
    items.sort(key=lambda item: item.get_closest_marker("quiet_node") is not None)


_QUIET_NODE_HELD = pytest.StashKey[Any]()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before the first ``quiet_node`` test (outside pytest-timeout's timer, which starts inside this
    wrapper): the node to this tier alone (see the module docstring). Held shared to the session's end;
    past ``QUIET_NODE_WAIT_SECONDS`` the tests run anyway, with a line saying so."""
    lock = os.environ.get(QUIET_NODE_LOCK_ENV)
    config = item.config
    if lock and item.get_closest_marker("quiet_node") is not None and _QUIET_NODE_HELD not in config.stash:
        capture = config.pluginmanager.getplugin("capturemanager")

        def say(line: str) -> None:  # past the capture: the run's log shows why it pauses
            with capture.global_and_fixture_disabled():
                print(f"\n{item.nodeid}: {line}", flush=True)

        t0 = time.monotonic()
        try:
            config.stash[_QUIET_NODE_HELD] = wait_for_quiet_node(
                Path(lock), timeout=QUIET_NODE_WAIT_SECONDS, say=say
            )
        except TimeoutError as e:
            config.stash[_QUIET_NODE_HELD] = None
            say(f"{e}: the quiet_node files run beside it")
        else:
            if (waited := time.monotonic() - t0) >= 1.0:
                say(f"waited {waited:.0f} s")
    yield


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("the e2e tests run a kubelet and containerd: they need root", pytrace=False)
    try:
        check_binaries()
        images.build(log=print)
    except (ClusterError, images.ImageError) as e:
        pytest.fail(f"{e}\n(run `make setup` first)", pytrace=False)
    workdir = tmp_path_factory.mktemp("node-cluster")
    try:
        info = start(workdir, node=True, die_with_parent=True, timeout=180.0)
    except ClusterError as e:
        pytest.fail(f"could not start the local one-node cluster: {e}", pytrace=False)
    try:
        yield Cluster(info.kubeconfig, info=info, bin_dir=info.bin_dir, scratch=workdir / "client")
    finally:
        stop(info, log=lambda _msg: None)
        left = leftovers(workdir)
        assert not left, "cluster-down left behind:\n  " + "\n  ".join(left)


def chart_monitors(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's runtime PodMonitor and operator ServiceMonitor, rendered by helm (monitoring
    enabled)."""
    out = cluster.helm(
        "template", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE, "--set", "monitoring.enabled=true"
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    (pm,) = [d for d in docs if d.get("kind") == "PodMonitor"]
    (sm,) = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    return pm, sm


@pytest.fixture(scope="session")
def node_prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    assert cluster.info is not None
    pki = cluster.info.workdir / "pki"
    tls = {
        "ca_file": str(pki / "ca.crt"),
        "cert_file": str(pki / "admin.crt"),
        "key_file": str(pki / "admin.key"),
    }
    podmonitor, servicemonitor = chart_monitors(cluster)
    runtime_job = podmonitor_scrape_config(podmonitor, api_server=cluster.server, tls_config=tls)
    # The operator's own metrics too (its per-InferenceService state series: the dashboard's panels).
    operator_job = servicemonitor_scrape_config(servicemonitor, api_server=cluster.server, tls_config=tls)
    server = PrometheusServer(
        tmp_path_factory.mktemp("node-prometheus"),
        host=NODE_IP,
        scrape_configs=[runtime_job, operator_job],
        binary=NODE_PROMETHEUS_BIN,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def operator_release(cluster: Cluster, node_prometheus: PrometheusServer) -> Iterator[str]:
    """The chart installed (``helm install --wait``); yields the operator's namespace."""
    cluster.helm(
        "install", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE, "--create-namespace",
        "--set", f"prometheus.url={node_prometheus.url}",
        "--set", "autoscaleIntervalSeconds=5",
        "--set", "logFormat=plain",
        # the node has 2 cores and the modules size their pods to fit them: the activator's two pods
        # request little (the chart's 100m each left a model-sources replica Unschedulable)
        "--set", "activator.resources.requests.cpu=10m",
        *FAST_READINESS,
        "--wait", "--timeout=300s",
        timeout=330,
    )  # fmt: skip
    try:
        yield OPERATOR_NAMESPACE
    finally:
        cluster.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", check=False, timeout=120)


def hostpath_claim(
    namespace: str,
    claim: str,
    volume: str,
    path: Path,
    access_mode: str,
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A PersistentVolume ``volume`` on the node's directory ``path`` (hostPath, kept when released:
    the caller deletes it) and the claim ``claim`` of ``namespace`` bound to it, with ``access_mode``
    (``ReadWriteOnce``, ``ReadOnlyMany``); the node has no provisioner."""
    storage = {"storage": "2Gi"}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume, **({"labels": labels} if labels else {})},
            "spec": {
                "capacity": storage,
                "accessModes": [access_mode],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": [access_mode],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": storage},
            },
        },
    ]


class GraphCache:
    """The session's graph cache directory on the node; :meth:`claim` binds a claim to it in a namespace
    (a PersistentVolume binds one claim: one hostPath volume per namespace, all on the same directory;
    the runtime names its partial files per write, so pods sharing it never read a half-written graph)."""

    CLAIM = "graph-cache"
    LABEL = "kubeinfer-e2e/graph-cache"

    def __init__(self, cluster: Cluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory

    def claim(self, namespace: str) -> str:
        """A claim named :attr:`CLAIM` in ``namespace`` bound to the cache directory; returns its name
        (for ``spec.server.graphCache.claimName``). Its volume is deleted with the session."""
        volume = f"graph-cache-{secrets.token_hex(4)}"
        labels = {self.LABEL: "true"}
        self.cluster.apply(
            hostpath_claim(namespace, self.CLAIM, volume, self.directory, "ReadWriteOnce", labels)
        )
        return self.CLAIM


@pytest.fixture(scope="session")
def graph_cache(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GraphCache]:
    directory = tmp_path_factory.mktemp("graph-cache")
    os.chown(directory, RUNTIME_UID, RUNTIME_UID)  # the runtime's user writes the graphs
    try:
        yield GraphCache(cluster, directory)
    finally:
        cluster.kubectl(
            "delete", "persistentvolumes", "-l", f"{GraphCache.LABEL}=true", "--wait=false", check=False
        )


def isvc_condition(cluster: Cluster, namespace: str, name: str, ctype: str = "Ready") -> dict[str, Any]:
    """The InferenceService's condition ``ctype`` ({} when absent)."""
    obj = cluster.get_json("inferenceservice", name, "-n", namespace)
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == ctype), {})


def wait_isvc(
    cluster: Cluster,
    namespace: str,
    name: str,
    status: str,
    *,
    reason: str | None = None,
    timeout: float = 240,
) -> dict[str, Any]:
    """Wait until the Ready condition has ``status`` (and ``reason``); returns the condition."""

    def check() -> dict[str, Any] | None:
        c = isvc_condition(cluster, namespace, name)
        if c.get("status") == status and (reason is None or c.get("reason") == reason):
            return c
        return None

    return wait_until(
        check, timeout=timeout, interval=1.0, message=f"{namespace}/{name} Ready={status} {reason or ''}"
    )


def runtime_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The runtime pods of InferenceService ``name`` (not terminating)."""
    items = cluster.get_json("pods", "-n", namespace, "-l", f"kubeinfer.io/inferenceservice={name}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def accepting(address: str, timeout: float = 60.0) -> str:
    """``address`` (``IP:port``, a Service's ClusterIP) once a TCP connection to it is accepted;
    raises ``TimeoutError`` after ``timeout`` seconds. A Service's endpoints reach kube-proxy's rules a
    moment after its pods turn Ready (the EndpointSlice, then kube-proxy's next sync; until then a
    connection is refused), so a test that calls through the ClusterIP right after the
    InferenceService is Ready waits for this first, as a client with a retry would."""
    host, port = address.rsplit(":", 1)

    def accepts() -> bool:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return True
        except OSError:
            return False

    wait_until(accepts, timeout=timeout, interval=0.5, message=f"{address} accepting connections")
    return address
