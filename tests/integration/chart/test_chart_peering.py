"""The kopf peering object and the chart, in both orders, with the real helm binary and API server:
an operator run locally first (it creates the peering object, without Helm's
ownership metadata) must not break a later ``helm install`` of the chart; a chart installed first
must not keep a local operator from starting on its peering object."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.support.cluster import Cluster, wait_until
from tests.unit.chart.helm_render import CHART

CRDS_DIR = CHART / "crds"


def _apply_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", CRDS_DIR)
    for crd in ("inferenceservices.kubeinfer.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


def _peering(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    r = cluster.kubectl("get", "kopfpeering", name, "-n", ns, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(r.stdout)
    return obj


def _install(cluster: Cluster, release: str, ns: str, peering: str) -> None:
    cluster.helm(
        "install",
        release,
        CHART,
        "--namespace",
        ns,
        "--skip-crds",
        "--set",
        f"peering.name={peering}",
        "--set",
        f"watchNamespaces={{{ns}}}",
    )


def _operator(cluster: Cluster, ns: str, peering: str, log_dir: Path, name: str) -> OperatorProcess:
    return OperatorProcess(
        cluster.kubeconfig,
        namespaces=[ns],
        peering=peering,
        log_dir=log_dir,
        extra_env=dict(TEST_ENV),
        name=name,
    )


def test_helm_install_after_a_local_operator_run(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    _apply_crds(cluster)
    release = f"ki-{secrets.token_hex(3)}"
    peering = f"peer-{release}"
    with _operator(cluster, namespace, peering, tmp_path, "local") as local:
        local.wait_ready()
        created = wait_until(
            lambda: _peering(cluster, namespace, peering), timeout=30, message="the operator's KopfPeering"
        )
    assert "meta.helm.sh/release-name" not in (created["metadata"].get("annotations") or {})
    try:
        _install(cluster, release, namespace, peering)  # used to fail: "exists and cannot be imported"
        status = cluster.helm("status", release, "--namespace", namespace).stdout
        assert "STATUS: deployed" in status
        kept = _peering(cluster, namespace, peering)
        assert kept is not None and kept["metadata"]["uid"] == created["metadata"]["uid"]
        cluster.helm("upgrade", release, CHART, "--namespace", namespace, "--skip-crds", "--reuse-values")
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
    # not the release's object: uninstall leaves it to whoever created it
    assert _peering(cluster, namespace, peering) is not None


def test_local_operator_after_helm_install(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    _apply_crds(cluster)
    release = f"ki-{secrets.token_hex(3)}"
    peering = f"peer-{release}"
    try:
        _install(cluster, release, namespace, peering)
        owned = _peering(cluster, namespace, peering)
        assert owned is not None
        assert owned["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        with _operator(cluster, namespace, peering, tmp_path, "local") as local:
            local.wait_ready()
            # it peers through the chart's object (the chart's pod never runs here: no node) and acts
            cluster.apply(
                {
                    "apiVersion": "kubeinfer.io/v1alpha1",
                    "kind": "InferenceService",
                    "metadata": {"name": "peered"},
                    "spec": {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}},
                },
                "-n",
                namespace,
            )
            wait_until(
                lambda: (
                    cluster.get_json("kisvc", "peered", "-n", namespace).get("status", {}).get("conditions")
                ),
                timeout=30,
                message="status written by the local operator",
            )
            assert local.reconciles() > 0, local.log()[-3000:]
            cluster.kubectl("delete", "kisvc", "peered", "-n", namespace, "--timeout=60s")
        after = _peering(cluster, namespace, peering)
        assert after is not None and after["metadata"]["uid"] == owned["metadata"]["uid"]
        # the release still owns it: an upgrade keeps it, an uninstall removes it
        cluster.helm("upgrade", release, CHART, "--namespace", namespace, "--skip-crds", "--reuse-values")
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
    wait_until(
        lambda: _peering(cluster, namespace, peering) is None, timeout=30, message="peering uninstalled"
    )


def _chart_pod(
    cluster: Cluster, ns: str, tmp_path: Path, wait_seconds: float
) -> tuple[str, str, OperatorProcess]:
    """``(release, peering, operator)``: the operator as the chart's pod runs it (Helm's release in
    its environment), with the peering wait of the test; the CRDs applied, the object not created."""
    _apply_crds(cluster)
    release = f"ki-{secrets.token_hex(3)}"
    peering = f"peer-{release}"
    env = {
        **TEST_ENV,
        "KUBEINFER_HELM_RELEASE": release,
        "KUBEINFER_HELM_RELEASE_NAMESPACE": ns,
        "KUBEINFER_PEERING_WAIT_SECONDS": str(wait_seconds),
    }
    op = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[ns],
        peering=peering,
        log_dir=tmp_path,
        extra_env=env,
        name="chart-pod",
    )
    return release, peering, op


def test_chart_deployed_operator_waits_for_the_charts_peering(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Helm creates the peering object after the operator's Deployment: an operator pod that starts
    in between must leave it to Helm (CI saw `helm install` fail with "already exists")."""
    _, peering, operator = _chart_pod(cluster, namespace, tmp_path, 60)
    with operator as op:
        wait_until(lambda: "waiting up to 60 s" in op.log(), timeout=60, message="the operator waiting")
        assert _peering(cluster, namespace, peering) is None  # it did not create the chart's object
        cluster.apply(  # what Helm does next
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": peering}},
            "-n",
            namespace,
        )
        created = _peering(cluster, namespace, peering)
        assert created is not None
        op.wait_ready()
        kept = _peering(cluster, namespace, peering)
        assert kept is not None and kept["metadata"]["uid"] == created["metadata"]["uid"]
        assert "meta.helm.sh/release-name" not in (kept["metadata"].get("annotations") or {})


def test_chart_deployed_operator_creates_a_missing_peering_after_the_wait(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A peering object still missing after the wait (deleted by hand) is created, adoptable by Helm."""
    release, peering, operator = _chart_pod(cluster, namespace, tmp_path, 2)
    with operator as op:
        op.wait_ready()
        created = _peering(cluster, namespace, peering)
        assert created is not None, op.log()[-3000:]
        annotations = created["metadata"]["annotations"]
        assert annotations["meta.helm.sh/release-name"] == release
        assert annotations["meta.helm.sh/release-namespace"] == namespace
