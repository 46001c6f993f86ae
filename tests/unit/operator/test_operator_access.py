"""Who may call the model: bearer-token authentication from a Secret (``spec.server.auth``) and the
NetworkPolicy the operator owns (``spec.server.allowFrom``). Builders, the owned-kinds table, the
validation the API server mirrors, and the settings that admit Prometheus to ``/metrics``."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api, k8s
from kubeinfer.operator.builders import (
    build_configmap,
    build_deployment,
    build_networkpolicy,
    config_hash,
    runtime_config,
    scraper_peer,
)
from kubeinfer.operator.builders.common import selector_labels, stable_hash
from kubeinfer.operator.controllers import Controllers, scrapers
from kubeinfer.operator.reconcile import owned
from kubeinfer.operator.settings import Settings
from kubeinfer.runtime.config import CONFIG_FILE, RuntimeConfig

ROOT = Path(__file__).resolve().parents[3]
AUTH = {"bearerTokenSecretRef": {"name": "minilm-token", "key": "api-token"}}
PEERS = [
    {"podSelector": {"matchLabels": {"app": "frontend"}}},
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "search"}}, "podSelector": {}},
]
MONITORING = scraper_peer("monitoring")


def _isvc(**server: Any) -> api.InferenceService:
    spec: dict[str, Any] = {
        "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
        "runtime": {"device": "cpu"},
    }
    spec["server"] = server
    return api.InferenceService.from_body(
        {"metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}, "spec": spec}
    )


def _container(isvc: api.InferenceService) -> dict[str, Any]:
    container: dict[str, Any] = build_deployment(isvc, replicas=1)["spec"]["template"]["spec"]["containers"][
        0
    ]
    return container


# --- bearer token --------------------------------------------------------------------------------


def test_auth_adds_the_secret_key_ref_env_and_names_it_in_runtime_yaml() -> None:
    isvc = _isvc(auth=AUTH)
    env = {e["name"]: e for e in _container(isvc)["env"]}
    assert env[api.BEARER_TOKEN_ENV] == {
        "name": "KUBEINFER_BEARER_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "minilm-token", "key": "api-token", "optional": False}},
    }
    text = build_configmap(isvc, 0.005)["data"][CONFIG_FILE]
    cfg = RuntimeConfig.from_yaml(text)
    # the runtime reads its token from the very variable the pod spec fills from the Secret
    assert cfg.server.bearer_token_env == api.BEARER_TOKEN_ENV
    assert "bearer_token_env: KUBEINFER_BEARER_TOKEN" in text
    assert "minilm-token" not in text and "api-token" not in text  # the ConfigMap names no Secret


def test_auth_key_defaults_to_token() -> None:
    isvc = _isvc(auth={"bearerTokenSecretRef": {"name": "s"}})
    env = {e["name"]: e for e in _container(isvc)["env"]}
    assert env[api.BEARER_TOKEN_ENV]["valueFrom"]["secretKeyRef"] == {
        "name": "s",
        "key": "token",
        "optional": False,
    }


def test_without_auth_nothing_changes() -> None:
    isvc = _isvc()
    names = [e["name"] for e in _container(isvc)["env"]]
    assert api.BEARER_TOKEN_ENV not in names
    text = build_configmap(isvc, 0.005)["data"][CONFIG_FILE]
    assert "bearer_token_env" not in text
    assert RuntimeConfig.from_yaml(text).server.bearer_token_env is None
    assert "bearer_token_env" not in runtime_config(isvc, 0.005).model_dump(exclude_unset=True)["server"]


def test_auth_rolls_the_pods_and_its_hash_ignores_the_field_when_off() -> None:
    off, on = _isvc(), _isvc(auth=AUTH)
    assert config_hash(off) != config_hash(on)
    template = build_deployment(off, replicas=1)["spec"]["template"]
    assert template != build_deployment(on, replicas=1)["spec"]["template"]
    # without auth the hash is that of the configuration without the field: adding the runtime's
    # bearer_token_env did not roll every pod that does not use it
    data = runtime_config(
        off, 0.0
    ).file_data()  # what runtime.yaml holds: optional fields at default left out
    data.pop("batching")
    assert "bearer_token_env" not in data["server"] and "http_workers" not in data["server"]
    data["executors"] = 1  # the instance count, hashed under the file's former key for it (config_hash)
    assert config_hash(off) == stable_hash(data)


def test_user_env_keeps_its_place_after_the_token() -> None:
    isvc = api.InferenceService.from_body(
        {
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {
                "resources": {"gpus": 0},
                "runtime": {"device": "cpu", "env": [{"name": "EXTRA", "value": "1"}]},
                "server": {"auth": AUTH},
            },
        }
    )
    names = [e["name"] for e in _container(isvc)["env"]]
    assert names == ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", api.BEARER_TOKEN_ENV, "EXTRA"]


# --- NetworkPolicy -------------------------------------------------------------------------------


def test_no_allow_from_no_networkpolicy() -> None:
    assert build_networkpolicy(_isvc(), (MONITORING,)) is None
    assert build_networkpolicy(_isvc(auth=AUTH), (MONITORING,)) is None  # auth alone adds no policy
    inputs = owned.BuildInputs(max_queue_delay_seconds=0.005, replicas=1, scrapers=(MONITORING,))
    assert owned.BY_KIND["NetworkPolicy"].build(_isvc(), inputs) is None


def test_networkpolicy_admits_the_peers_to_rest_and_grpc_and_prometheus_to_metrics() -> None:
    isvc = _isvc(allowFrom=PEERS, grpcPort=9001)
    policy = build_networkpolicy(isvc, (MONITORING,))
    assert policy is not None
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "m" and policy["metadata"]["namespace"] == "ns"
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("InferenceService", "m", "u-1", True)
    spec = policy["spec"]
    # the same pods the Service routes to
    assert spec["podSelector"] == {"matchLabels": selector_labels(isvc)}
    assert spec["policyTypes"] == ["Ingress"]  # egress is left alone
    clients, scraper = spec["ingress"]
    assert clients["from"] == PEERS  # in the spec's order, an empty selector kept as {}
    assert clients["ports"] == [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 9001}]
    assert scraper["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert scraper["ports"] == [{"protocol": "TCP", "port": 8080}]  # /metrics, not gRPC


def test_networkpolicy_without_a_known_prometheus_has_only_the_peers_rule() -> None:
    policy = build_networkpolicy(_isvc(allowFrom=PEERS))
    assert policy is not None
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == PEERS


def test_default_deny_without_allow_from_admits_only_the_scrapers_to_metrics() -> None:
    isvc = _isvc(grpcPort=9001)
    policy = build_networkpolicy(isvc, (MONITORING,), default_deny=True)
    assert policy is not None
    assert policy["metadata"]["name"] == "m" and policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": selector_labels(isvc)}
    assert spec["policyTypes"] == ["Ingress"]
    (scraper,) = spec["ingress"]
    assert scraper == {"from": [MONITORING], "ports": [{"protocol": "TCP", "port": 8080}]}  # not gRPC


def test_default_deny_without_a_known_prometheus_admits_no_pod() -> None:
    policy = build_networkpolicy(_isvc(), default_deny=True)
    assert policy is not None
    assert policy["spec"]["ingress"] == [] and policy["spec"]["policyTypes"] == ["Ingress"]


def test_default_deny_with_allow_from_is_the_allow_from_policy() -> None:
    isvc = _isvc(allowFrom=PEERS)
    policy = build_networkpolicy(isvc, (MONITORING,), default_deny=True)
    assert policy is not None
    clients, scraper = policy["spec"]["ingress"]
    assert clients["from"] == PEERS and scraper["from"] == [MONITORING]
    assert policy == build_networkpolicy(isvc, (MONITORING,))  # the setting changes nothing here


def test_default_deny_reaches_the_builder_through_the_build_inputs() -> None:
    kind = owned.BY_KIND["NetworkPolicy"]
    off = owned.BuildInputs(max_queue_delay_seconds=0.005, replicas=1, scrapers=(MONITORING,))
    on = owned.BuildInputs(
        max_queue_delay_seconds=0.005, replicas=1, scrapers=(MONITORING,), default_deny=True
    )
    assert kind.build(_isvc(), off) is None
    built = kind.build(_isvc(), on)
    assert built is not None and built["spec"]["ingress"] == [
        {"from": [MONITORING], "ports": [{"protocol": "TCP", "port": 8080}]}
    ]


def test_networkpolicy_is_deterministic_and_changes_with_the_peers() -> None:
    a = build_networkpolicy(_isvc(allowFrom=PEERS), (MONITORING,))
    assert a == build_networkpolicy(_isvc(allowFrom=copy.deepcopy(PEERS)), (MONITORING,))
    b = build_networkpolicy(_isvc(allowFrom=PEERS[:1]), (MONITORING,))
    assert a is not None and b is not None
    hash_key = "kubeinfer.io/applied-hash"
    assert a["metadata"]["annotations"][hash_key] != b["metadata"]["annotations"][hash_key]


def test_scraper_peer_with_pod_labels() -> None:
    assert scraper_peer("obs", {"b": "2", "a": "1"}) == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
        "podSelector": {"matchLabels": {"a": "1", "b": "2"}},
    }


def test_networkpolicy_is_an_owned_kind_with_a_reason_to_be_deleted() -> None:
    kind = owned.BY_KIND["NetworkPolicy"]
    assert kind.resource is k8s.NETWORK_POLICY
    assert kind.resource.path("ns", "m") == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/m"
    assert kind.name_of("m") == "m"
    assert kind.unwanted == "spec.server.allowFrom unset"
    assert owned.BY_KIND["PodDisruptionBudget"].unwanted == "one replica"
    inputs = owned.BuildInputs(max_queue_delay_seconds=0.005, replicas=1, scrapers=(MONITORING,))
    built = kind.build(_isvc(allowFrom=PEERS), inputs)
    assert built is not None and built["spec"]["ingress"][1]["from"] == [MONITORING]


def test_the_auth_example_renders_a_policy_and_the_secret_ref() -> None:
    body = yaml.safe_load((ROOT / "examples" / "minilm-auth.yaml").read_text())
    isvc = api.InferenceService.from_body({**body, "metadata": {**body["metadata"], "namespace": "ns"}})
    assert isvc.spec.server.auth is not None
    assert isvc.spec.server.auth.bearer_token_secret_ref.name == "minilm-token"
    assert build_networkpolicy(isvc) is not None


# --- validation (the same rules as the CRD's CEL, see tests/integration/operator) -----------------


@pytest.mark.parametrize(
    "server, message",
    [
        ({"allowFrom": []}, "at least 1 item"),
        ({"allowFrom": [{}]}, "each peer sets namespaceSelector, podSelector or both"),
        (
            {"allowFrom": [{"podSelector": {"matchLabels": {"bad key": "x"}}}]},
            "spec.server.allowFrom[].podSelector.matchLabels keys must be label keys",
        ),
        ({"allowFrom": [{"podSelector": {"matchLabels": {"app": "not valid"}}}]}, "should match pattern"),
        (
            {"allowFrom": [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
            "spec.server.allowFrom[].namespaceSelector.matchExpressions: values must be set",
        ),
        (
            {
                "allowFrom": [
                    {
                        "podSelector": {
                            "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                        }
                    }
                ]
            },
            "spec.server.allowFrom[].podSelector.matchExpressions: values must be set",
        ),
        ({"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}, "Extra inputs are not permitted"),
        ({"auth": {}}, "Field required"),
        ({"auth": {"bearerTokenSecretRef": {"name": "Not_A_Name"}}}, "should match pattern"),
        ({"auth": {"bearerTokenSecretRef": {"name": "s", "key": "a/b"}}}, "should match pattern"),
        ({"auth": {"bearerTokenSecretRef": {"name": "s", "token": "literal"}}}, "Extra inputs"),
    ],
)
def test_bad_access_specs_are_refused(server: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        _isvc(**server)


def test_runtime_env_may_not_set_the_token_variable_with_auth() -> None:
    spec: dict[str, Any] = {
        "resources": {"gpus": 0},
        "runtime": {"device": "cpu", "env": [{"name": api.BEARER_TOKEN_ENV, "value": "literal"}]},
    }
    api.InferenceServiceSpec.from_k8s(spec)  # without auth the name is the user's
    with pytest.raises(
        pydantic.ValidationError, match=re.escape("spec.runtime.env must not set KUBEINFER_BEARER_TOKEN")
    ):
        api.InferenceServiceSpec.from_k8s({**spec, "server": {"auth": AUTH}})


def test_the_default_spec_keeps_its_server_default() -> None:
    """The CRD's default of spec.server is unchanged: both new fields are unset by default."""
    assert api.InferenceServiceSpec().model_dump(by_alias=True, exclude_none=True, mode="json")["server"] == {
        "grpcPort": 8081
    }


# --- settings: where Prometheus runs --------------------------------------------------------------


@pytest.mark.parametrize(
    "env, namespace",
    [
        ({}, ""),  # bare `prometheus`, no chart: the operator's namespace is not known
        ({"KUBEINFER_HELM_RELEASE_NAMESPACE": "kubeinfer-system"}, "kubeinfer-system"),
        ({"KUBEINFER_PROMETHEUS_URL": "http://prometheus-operated.monitoring.svc:9090"}, "monitoring"),
        ({"KUBEINFER_PROMETHEUS_URL": "https://prom.obs.svc.cluster.local:9091/x"}, "obs"),
        ({"KUBEINFER_PROMETHEUS_URL": "http://10.244.0.1:9090"}, ""),
        ({"KUBEINFER_PROMETHEUS_URL": "http://[fd00::1]:9090"}, ""),
        ({"KUBEINFER_PROMETHEUS_URL": "https://prometheus.example.com"}, ""),
        (
            {"KUBEINFER_PROMETHEUS_URL": "http://10.0.0.5:9090", "KUBEINFER_PROMETHEUS_NAMESPACE": "mon"},
            "mon",
        ),
    ],
)
def test_prometheus_namespace_in_force(env: dict[str, str], namespace: str) -> None:
    assert Settings.from_env(env).prometheus_namespace_in_force() == namespace


def test_prometheus_pod_labels_from_env_and_flag() -> None:
    env = {"KUBEINFER_PROMETHEUS_POD_LABELS": "app.kubernetes.io/name=prometheus, prometheus=k8s"}
    assert Settings.from_env(env).prometheus_pod_labels == {
        "app.kubernetes.io/name": "prometheus",
        "prometheus": "k8s",
    }
    flagged = Settings.from_args(["--prometheus-pod-labels", "a=1"], env)
    assert flagged.prometheus_pod_labels == {"a": "1"}
    with pytest.raises(pydantic.ValidationError, match="key=value"):
        Settings.from_env({"KUBEINFER_PROMETHEUS_POD_LABELS": "justakey"})


def test_default_deny_setting_is_off_by_default_and_reaches_the_reconciler() -> None:
    assert Settings.from_env({}).network_policy_default_deny is False
    on = Settings.from_env({"KUBEINFER_NETWORK_POLICY_DEFAULT_DENY": "true", "KUBEINFER_PEERING": ""})
    assert on.network_policy_default_deny is True
    flagged = Settings.from_args(["--network-policy-default-deny", "false"], {"KUBEINFER_PEERING": ""})
    assert flagged.network_policy_default_deny is False
    with pytest.raises(pydantic.ValidationError, match="network_policy_default_deny"):
        Settings.from_env({"KUBEINFER_NETWORK_POLICY_DEFAULT_DENY": "sometimes"})
    kube: Any = object()  # creating the controllers makes no request
    assert Controllers.create(kube, on).reconciler.default_deny is True
    assert Controllers.create(kube, flagged).reconciler.default_deny is False


def test_scrapers_from_settings() -> None:
    known = Settings.from_env(
        {"KUBEINFER_PROMETHEUS_NAMESPACE": "monitoring", "KUBEINFER_PROMETHEUS_POD_LABELS": "app=prometheus"}
    )
    assert scrapers(known) == (scraper_peer("monitoring", {"app": "prometheus"}),)
    assert scrapers(Settings.from_env({"KUBEINFER_PROMETHEUS_URL": "http://10.0.0.5:9090"})) == ()
