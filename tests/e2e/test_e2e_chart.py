"""The chart's operator on the real node: a pod from the locally built image, under the chart's
ServiceAccount and RBAC, non-root, read-only root filesystem, Ready."""

from __future__ import annotations

from kubeinfer import __version__
from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE
from tests.support.cluster import Cluster


def test_operator_runs_as_a_non_root_pod_with_the_charts_service_account(
    cluster: Cluster, operator_release: str
) -> None:
    dep = cluster.get_json("deployment", RELEASE, "-n", OPERATOR_NAMESPACE)
    assert dep["status"].get("readyReplicas") == 1
    (pod,) = cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=kubeinfer")[
        "items"
    ]
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["image"] == f"ghcr.io/kubeinfer/operator:{__version__}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["ready"] is True and cs["restartCount"] == 0
    name = pod["metadata"]["name"]
    uid = cluster.kubectl("exec", "-n", OPERATOR_NAMESPACE, name, "--", "id", "-u").stdout.strip()
    assert uid == "65532"
    touch = cluster.kubectl("exec", "-n", OPERATOR_NAMESPACE, name, "--", "touch", "/probe", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    # it talks to the API server with its ServiceAccount token through the kubernetes Service
    log = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, name).stdout
    assert "403" not in log and "Forbidden" not in log
