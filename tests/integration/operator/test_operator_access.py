"""Who may call the model, against a real API server: an InferenceService with ``spec.server.auth`` (a
Secret created here with a known token) and ``spec.server.allowFrom``. The Deployment references the
Secret and no object, Event, status or operator log line holds the token; the operator never requests
a Secret; the NetworkPolicy is server-side applied, owned, follows the spec (update, removal, return),
is put back after a hand edit, is not rewritten by a resync, and goes with its InferenceService. The
API server refuses bad specs with a message naming the field. One operator process for the module.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubeinfer.operator import api

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.integration.operator.test_operator_validation import BASE, _merge
from tests.support.cluster import Cluster, get_object, wait_until

PEERS: list[dict[str, Any]] = [
    {"podSelector": {"matchLabels": {"app": "frontend"}}},
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "search"}}},
]
#: Where this module's operator is told Prometheus runs (KUBEINFER_PROMETHEUS_NAMESPACE).
PROMETHEUS_NAMESPACE = "monitoring"


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One ``kubeinfer-operator`` for ``op_namespace`` (resync 2 s) that knows where Prometheus runs,
    behind a proxy whose log records every request it sends."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=2.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env={
            **TEST_ENV,
            "KUBEINFER_PROMETHEUS_NAMESPACE": PROMETHEUS_NAMESPACE,
            "KUBEINFER_PROMETHEUS_POD_LABELS": "app.kubernetes.io/name=prometheus",
        },
        proxy=True,
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])


def _manifest(name: str, **server: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "runtime": {"device": "cpu"},
            "replicas": 1,
            "server": server,
        },
    }


def _secret(cluster: Cluster, ns: str, name: str, token: str) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"token": token}},
        "-n",
        ns,
    )


def _policy(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return wait_until(
        lambda: get_object(cluster, ns, "networkpolicy", name), timeout=30, message="NetworkPolicy"
    )


def _events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def test_auth_and_allow_from_become_a_secret_ref_and_a_policy_and_the_token_is_nowhere(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "guarded"
    token = f"kubeinfer-test-{secrets.token_hex(20)}"
    _secret(cluster, ns, "guarded-token", token)
    cluster.apply(
        _manifest(name, auth={"bearerTokenSecretRef": {"name": "guarded-token"}}, allowFrom=PEERS), "-n", ns
    )
    isvc = wait_until(lambda: get_object(cluster, ns, "kisvc", name), timeout=10, message="isvc")
    dep = wait_until(lambda: get_object(cluster, ns, "deployment", name), timeout=30, message="Deployment")
    cm = wait_until(
        lambda: get_object(cluster, ns, "configmap", api.configmap_name(name)),
        timeout=30,
        message="ConfigMap",
    )
    policy = _policy(cluster, ns, name)

    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["KUBEINFER_BEARER_TOKEN"] == {
        "name": "KUBEINFER_BEARER_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "guarded-token", "key": "token", "optional": False}},
    }
    runtime_yaml = yaml.safe_load(cm["data"]["runtime.yaml"])
    assert runtime_yaml["server"]["bearer_token_env"] == "KUBEINFER_BEARER_TOKEN"

    # the policy: owned, applied server-side by the operator's field manager, on the runtime pods
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("InferenceService", isvc["metadata"]["uid"], True)
    shown = cluster.get_json("networkpolicy", name, "-n", ns, "--show-managed-fields")
    managers = {(m["manager"], m["operation"]) for m in shown["metadata"]["managedFields"]}
    assert ("kubeinfer", "Apply") in managers
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    clients, scraper = policy["spec"]["ingress"]
    assert clients["from"] == PEERS
    assert clients["ports"] == [{"port": 8080, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]
    assert scraper["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    assert scraper["ports"] == [{"port": 8080, "protocol": "TCP"}]
    wait_until(
        lambda: any(
            e["reason"] == "Created" and f"NetworkPolicy {name}" in e["message"]
            for e in _events(cluster, ns, name)
        ),
        timeout=30,
        message="the Created Event names the NetworkPolicy",
    )
    wait_until(
        lambda: ((get_object(cluster, ns, "kisvc", name) or {}).get("status") or {}).get("url"),
        timeout=30,
        message="status written",
    )

    # the token, as given and as the API stores it, in nothing the operator wrote, logged or requested
    encoded = base64.b64encode(token.encode()).decode()
    written = {
        "InferenceService (status)": get_object(cluster, ns, "kisvc", name),
        "Deployment": get_object(cluster, ns, "deployment", name),
        "ConfigMap": get_object(cluster, ns, "configmap", api.configmap_name(name)),
        "NetworkPolicy": get_object(cluster, ns, "networkpolicy", name),
        "Service": get_object(cluster, ns, "service", name),
        "Events": _events(cluster, ns, name),
    }
    for what, obj in written.items():
        text = json.dumps(obj)
        assert token not in text and encoded not in text, f"the token is in the {what}"
    assert token not in operator.log() and encoded not in operator.log(), "the token is in the operator's log"
    assert token not in operator.proxy_log() and encoded not in operator.proxy_log()
    # the operator never asked for a Secret (it runs as admin here: it could have)
    assert "/secrets" not in operator.proxy_log(), "the operator requested a Secret"


def test_networkpolicy_follows_allow_from_and_goes_with_the_inferenceservice(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "fenced"
    cluster.apply(_manifest(name, allowFrom=PEERS[:1]), "-n", ns)
    first = _policy(cluster, ns, name)
    assert first["spec"]["ingress"][0]["from"] == PEERS[:1]
    uid = first["metadata"]["uid"]

    # a resync changes nothing: the policy is not written again
    time.sleep(6.0)  # three resyncs at 2 s
    assert _policy(cluster, ns, name)["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    # an edit of allowFrom updates the same object
    cluster.apply(_manifest(name, allowFrom=PEERS), "-n", ns)
    updated = wait_until(
        lambda: (
            (p := get_object(cluster, ns, "networkpolicy", name))
            and p["spec"]["ingress"][0]["from"] == PEERS
            and p
        ),
        timeout=30,
        message="NetworkPolicy updated",
    )
    assert updated["metadata"]["uid"] == uid

    # a hand edit that admits everyone is put back
    everyone = json.dumps({"spec": {"ingress": [{}]}})
    cluster.kubectl("patch", "networkpolicy", name, "-n", ns, "--type=merge", "-p", everyone)
    wait_until(
        lambda: (
            (p := get_object(cluster, ns, "networkpolicy", name))
            and p["spec"]["ingress"][0].get("from") == PEERS
        ),
        timeout=30,
        message="hand-edited NetworkPolicy put back",
    )

    # allowFrom removed: the policy is deleted, with an Event saying why
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"server": {"allowFrom": None}}}),
    )
    wait_until(
        lambda: get_object(cluster, ns, "networkpolicy", name) is None,
        timeout=30,
        message="NetworkPolicy deleted",
    )
    wait_until(
        lambda: any(
            e["reason"] == "Deleted"
            and e["message"] == f"deleted NetworkPolicy {name} (spec.server.allowFrom unset)"
            for e in _events(cluster, ns, name)
        ),
        timeout=30,
        message="the Deleted Event",
    )
    assert get_object(cluster, ns, "deployment", name) is not None  # nothing else went

    # allowFrom back: a new policy; the InferenceService deleted: the policy goes with it
    cluster.apply(_manifest(name, allowFrom=PEERS[1:]), "-n", ns)
    again = _policy(cluster, ns, name)
    assert again["metadata"]["uid"] != uid and again["spec"]["ingress"][0]["from"] == PEERS[1:]
    cluster.kubectl("delete", "kisvc", name, "-n", ns, "--timeout=60s")
    wait_until(
        lambda: get_object(cluster, ns, "networkpolicy", name) is None,
        timeout=60,
        message="NetworkPolicy garbage-collected with its owner",
    )


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("empty-allow-from", {"server": {"allowFrom": []}}, "spec.server.allowFrom"),
    ("peer-without-selectors", {"server": {"allowFrom": [{}]}}, "spec.server.allowFrom[0]"),
    (
        "ip-block",
        {"server": {"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}},
        "spec.server.allowFrom[0]",
    ),
    (
        "bad-label-key",
        {"server": {"allowFrom": [{"podSelector": {"matchLabels": {"bad key": "x"}}}]}},
        "spec.server.allowFrom[0].podSelector.matchLabels",
    ),
    (
        "bad-label-value",
        {"server": {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "a b"}}}]}},
        "spec.server.allowFrom[0].namespaceSelector.matchLabels.team",
    ),
    (
        "in-without-values",
        {
            "server": {
                "allowFrom": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}]
            }
        },
        "spec.server.allowFrom[0].podSelector.matchExpressions",
    ),
    (
        "exists-with-values",
        {
            "server": {
                "allowFrom": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]
                        }
                    }
                ]
            }
        },
        "spec.server.allowFrom[0].namespaceSelector.matchExpressions",
    ),
    ("auth-without-ref", {"server": {"auth": {}}}, "spec.server.auth.bearerTokenSecretRef"),
    (
        "bad-secret-name",
        {"server": {"auth": {"bearerTokenSecretRef": {"name": "Not_A_Name"}}}},
        "spec.server.auth.bearerTokenSecretRef.name",
    ),
    (
        "bad-secret-key",
        {"server": {"auth": {"bearerTokenSecretRef": {"name": "s", "key": "a/b"}}}},
        "spec.server.auth.bearerTokenSecretRef.key",
    ),
    (
        "env-overrides-token",
        {
            "server": {"auth": {"bearerTokenSecretRef": {"name": "s"}}},
            "runtime": {"device": "cpu", "env": [{"name": "KUBEINFER_BEARER_TOKEN", "value": "literal"}]},
        },
        "spec.runtime.env",
    ),
]


@pytest.mark.parametrize("spec_patch, field", [(p, f) for _, p, f in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_bad_access_spec_is_refused_naming_the_field(
    cluster: Cluster, crds: None, namespace: str, spec_patch: dict[str, Any], field: str
) -> None:
    manifest = _merge(BASE, {"spec": spec_patch})
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr, result.stderr


def test_good_access_spec_is_accepted(cluster: Cluster, crds: None, namespace: str) -> None:
    peers = [
        *PEERS,
        {"podSelector": {}},
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]
            },
            "podSelector": {"matchExpressions": [{"key": "kubeinfer.io/client", "operator": "Exists"}]},
        },
    ]
    manifest = _merge(
        BASE,
        {
            "spec": {
                "server": {
                    "auth": {"bearerTokenSecretRef": {"name": "tok", "key": "api.token"}},
                    "allowFrom": peers,
                }
            }
        },
    )
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode == 0, result.stderr
