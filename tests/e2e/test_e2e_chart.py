"""The chart's operator on the real node: a pod from the locally built image, under the chart's
ServiceAccount and RBAC, non-root, read-only root filesystem, Ready; and its activator, from the same
image, Ready (every kind it watches listed with its own ServiceAccount and RBAC)."""

from __future__ import annotations

import re

from kubeinfer import __version__
from tests.e2e.conftest import OPERATOR_NAMESPACE, OPERATOR_PODS, RELEASE
from tests.support.cluster import Cluster


def test_operator_runs_as_a_non_root_pod_with_the_charts_service_account(
    cluster: Cluster, operator_release: str
) -> None:
    dep = cluster.get_json("deployment", RELEASE, "-n", OPERATOR_NAMESPACE)
    assert dep["status"].get("readyReplicas") == 1
    (pod,) = cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS)["items"]
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
    assert not forbidden(log), forbidden(log)


def test_activator_pods_are_ready_from_the_operator_image_with_their_own_service_account(
    cluster: Cluster, operator_release: str
) -> None:
    """The chart's default: two activator replicas, Ready on /activator/readyz (every InferenceService,
    Service and pod listed cluster-wide under the activator's ClusterRole), non-root, never restarted."""
    name = f"{RELEASE}-activator"
    dep = cluster.get_json("deployment", name, "-n", OPERATOR_NAMESPACE)
    assert dep["status"].get("readyReplicas") == 2
    selector = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
    pods = cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", selector)["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == name
        (container,) = pod["spec"]["containers"]
        assert container["image"] == f"ghcr.io/kubeinfer/operator:{__version__}"
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["ready"] is True and cs["restartCount"] == 0
        log = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, pod["metadata"]["name"]).stdout
        assert "listening on http://0.0.0.0:8080" in log and not forbidden(log), log[-2000:]
    # the operator is told where the activator is
    (op,) = cluster.get_json("deployment", RELEASE, "-n", OPERATOR_NAMESPACE)["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("value") for e in op["env"]}
    assert env["KUBEINFER_ACTIVATOR_SERVICE"] == f"{OPERATOR_NAMESPACE}/{name}"


#: An API server's 403 as kopf and the kubernetes client log it: reason Forbidden, "... is forbidden:
#: User ...", "(403)", "'code': 403", "status=403". A bare "403" is not one: a log line's timestamp has
#: milliseconds ("16:11:43,403").
_FORBIDDEN = re.compile(r"forbidden|\(403\)|code['\"]?:\s*403\b|status=403\b", re.IGNORECASE)


#: The NamespaceLifecycle admission plugin's 403: new objects (an Event) in a namespace being deleted.
#: It is no missing permission: another test's namespace going away while the operator reconciles.
_TERMINATING = "because it is being terminated"


def forbidden(log: str) -> list[str]:
    """The lines of ``log`` that report an API request refused with 403 Forbidden for want of a
    permission (not NamespaceLifecycle's refusal of new objects in a namespace being deleted)."""
    return [line for line in log.splitlines() if _FORBIDDEN.search(line) and _TERMINATING not in line]


def test_forbidden_is_a_403_not_a_timestamp() -> None:
    """No cluster: the check above finds the API's refusals and not the milliseconds of a timestamp."""
    ok = '2026-12-01 16:11:43,403 INFO aiohttp.access: 10.244.0.1 "GET /healthz HTTP/1.1" 200 179'
    assert forbidden(ok) == []
    kopf = (
        "APIForbiddenError: ('pods is forbidden: User \"system:serviceaccount:x:y\" cannot list', "
        "{'code': 403})"
    )
    client = "kubernetes.client.exceptions.ApiException: (403)\nReason: Forbidden"
    terminating = (
        "WARNING kubeinfer.operator.k8s: posting Event ReconcileFailed failed: POST "
        '/api/v1/namespaces/x/events: 403 events "m." is forbidden: unable to create new content in '
        "namespace x because it is being terminated"
    )
    assert forbidden(terminating) == []
    for line in (kopf, client, "HTTP status=403 for PATCH"):
        assert forbidden(line), line
