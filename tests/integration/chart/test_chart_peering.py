"""The kopf peering object and the chart, in both orders, with the real helm binary and API server
(issue 9 item 5): an operator run locally first (it creates the peering object, without Helm's
ownership metadata) must not break a later ``helm install`` of the chart; a chart installed first
must not keep a local operator from starting on its peering object."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, wait_until
from tests.support.operator_proc import TEST_ENV, OperatorProcess
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
