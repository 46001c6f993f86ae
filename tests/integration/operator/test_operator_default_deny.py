"""NetworkPolicy default-deny (``KUBEINFER_NETWORK_POLICY_DEFAULT_DENY``, the chart's
``networkPolicy.defaultDeny``) against a real API server: an InferenceService without
``spec.server.allowFrom`` gets the operator's NetworkPolicy, admitting only the Prometheus the
operator reads to /metrics; a resync does not rewrite it; allowFrom added joins its peers, allowFrom
removed leaves the scraper-only policy in place (not deleted). One operator process for the module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.integration.operator.test_operator_access import PEERS, _manifest, _policy
from tests.support.cluster import Cluster, get_object, wait_until

SCRAPER = {
    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    "ports": [{"port": 8080, "protocol": "TCP"}],
}


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One ``kubeinfer-operator`` for ``op_namespace`` (resync 2 s), default-deny on, Prometheus in
    ``monitoring``."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=2.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env={
            **TEST_ENV,
            "KUBEINFER_PROMETHEUS_NAMESPACE": "monitoring",
            "KUBEINFER_NETWORK_POLICY_DEFAULT_DENY": "true",
        },
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])


def test_default_deny_gives_a_policy_without_allow_from(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "closed"
    cluster.apply(_manifest(name), "-n", ns)
    isvc = wait_until(lambda: get_object(cluster, ns, "kisvc", name), timeout=10, message="isvc")
    dep = wait_until(lambda: get_object(cluster, ns, "deployment", name), timeout=30, message="Deployment")
    policy = _policy(cluster, ns, name)
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("InferenceService", isvc["metadata"]["uid"], True)
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [SCRAPER]  # the scraper only, to /metrics

    # a resync changes nothing: the policy is not written again
    time.sleep(6.0)  # three resyncs at 2 s
    assert _policy(cluster, ns, name)["metadata"]["resourceVersion"] == policy["metadata"]["resourceVersion"]

    # allowFrom added: its peers join the same object
    cluster.apply(_manifest(name, allowFrom=PEERS), "-n", ns)
    wait_until(
        lambda: (
            (get_object(cluster, ns, "networkpolicy", name) or {}).get("spec", {}).get("ingress")
            == [
                {
                    "from": PEERS,
                    "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}],
                },
                SCRAPER,
            ]
        ),
        timeout=30,
        message="allowFrom's peers in the policy",
    )

    # allowFrom removed: the policy stays, the scraper only again (never deleted)
    patch = json.dumps({"spec": {"server": {"allowFrom": None}}})
    cluster.kubectl("patch", "kisvc", name, "-n", ns, "--type=merge", "-p", patch)
    back = wait_until(
        lambda: (
            (p := get_object(cluster, ns, "networkpolicy", name)) and p["spec"]["ingress"] == [SCRAPER] and p
        ),
        timeout=30,
        message="scraper-only policy again",
    )
    assert back["metadata"]["uid"] == policy["metadata"]["uid"]
