"""The chart's rendered manifests: RBAC exactly as reviewed (no wildcard), pod hardening, options.

Needs ``.cache/bin/helm`` (``make setup``); skipped with that reason when it is absent, and the
integration tests (tests/integration/chart) run the same renders against the API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.api import DEFAULT_IMAGE
from kubeinfer.operator.autoscale.signals import POOL_TARGET_LABEL

from kubeinfer import __version__
from kubeinfer.contract.pool import POOL_LABEL
from tests.unit.chart.helm_render import CHART, HELM, by_kind, of_component, render

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="helm not built: run `make setup`")

# (apiGroup, resource, verb) the operator needs in each watched namespace; see
# charts/kubeinfer/templates/rbac.yaml for which code uses each.
NAMESPACED = {
    *(("kubeinfer.io", "inferenceservices", v) for v in ("get", "list", "watch", "patch")),
    *(("kubeinfer.io", "inferenceservices/status", v) for v in ("get", "patch")),
    ("kubeinfer.io", "inferenceservices/finalizers", "update"),
    *(("kubeinfer.io", "modelpools", v) for v in ("get", "list", "watch")),
    ("kubeinfer.io", "modelpools/status", "patch"),
    ("kubeinfer.io", "modelpools/finalizers", "update"),
    *(("apps", "deployments", v) for v in ("get", "list", "watch", "create", "patch")),
    *(("apps", "deployments/scale", v) for v in ("get", "patch")),
    *(("", r, v) for r in ("services", "configmaps") for v in ("get", "list", "watch", "create", "patch")),
    *(("policy", "poddisruptionbudgets", v) for v in ("get", "list", "watch", "create", "patch", "delete")),
    *(
        ("networking.k8s.io", "networkpolicies", v)
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ),
    *(
        ("discovery.k8s.io", "endpointslices", v)
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ),
    ("", "persistentvolumeclaims", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("apps", "replicasets", "list"),
    ("", "events", "create"),
}
CRD_SCAN = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
CLUSTER_PEERING = {
    ("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch", "create")
}
NS_PEERING = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch", "create")}
NS_SCAN = {("", "namespaces", v) for v in ("list", "watch")}


def triples(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Expand a Role/ClusterRole's rules into (apiGroup, resource, verb) triples."""
    out = set()
    for rule in role.get("rules") or []:
        assert not rule.get("nonResourceURLs"), rule
        assert not rule.get("resourceNames"), rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    out.add((g, r, v))
    return out


def assert_no_wildcards(docs: list[dict[str, Any]]) -> None:
    """Fail on any "*" in a Role or ClusterRole rule (apiGroups, resources, verbs, names)."""
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        for rule in role.get("rules") or []:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                for item in rule.get(key) or []:
                    assert "*" not in item, f"wildcard in {role['kind']} {role['metadata']['name']}: {rule}"


def test_chart_rbac_clusterwide_is_exactly_what_the_operator_uses() -> None:
    docs = render()
    assert_no_wildcards(docs)
    (cr,) = of_component(docs, "ClusterRole")
    assert by_kind(docs, "Role") == []
    assert triples(cr) == NAMESPACED | CRD_SCAN | CLUSTER_PEERING
    (crb,) = of_component(docs, "ClusterRoleBinding")
    assert crb["roleRef"]["name"] == cr["metadata"]["name"]
    (sa,) = of_component(docs, "ServiceAccount")
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kubeinfer-system"}
    ]
    (peering,) = by_kind(docs, "ClusterKopfPeering")
    (dep,) = of_component(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KUBEINFER_PEERING"] == peering["metadata"]["name"]
    assert env["KUBEINFER_NAMESPACES"] == ""


def test_chart_rbac_namespaced_mode_grants_only_listed_namespaces() -> None:
    # without the activator (whose namespace the operator then handles too: test_chart_activator.py)
    docs = render(values={"watchNamespaces": ["team-a", "team-b"], "activator": {"enabled": False}})
    assert_no_wildcards(docs)
    (cr,) = of_component(docs, "ClusterRole")
    assert triples(cr) == CRD_SCAN | NS_SCAN
    roles = of_component(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for r in roles:
        assert triples(r) == NAMESPACED | NS_PEERING
    bindings = of_component(docs, "RoleBinding")
    assert sorted(rb["metadata"]["namespace"] for rb in bindings) == ["team-a", "team-b"]
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == ["team-a", "team-b"]
    (dep,) = of_component(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KUBEINFER_NAMESPACES"] == "team-a,team-b"


def test_chart_wildcard_detector_catches_a_wildcard() -> None:
    bad = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "x"},
            "rules": [{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}],
        }
    ]
    with pytest.raises(AssertionError, match="wildcard"):
        assert_no_wildcards(bad)


def test_chart_operator_pod_is_hardened_and_probed() -> None:
    (dep,) = of_component(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # ready on the same endpoint (kopf serves it once the startup handler ran), checked more often
    # than liveness so that a rollout does not wait on it
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["periodSeconds"] <= c["livenessProbe"]["periodSeconds"]
    assert c["readinessProbe"]["timeoutSeconds"] and c["readinessProbe"]["failureThreshold"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KUBEINFER_HEALTH_PORT"] == str(ports["health"])
    assert env["KUBEINFER_METRICS_PORT"] == str(ports["metrics"])
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    assert c["image"] == f"ghcr.io/kubeinfer/operator:{__version__}"
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_chart_prometheus_auth_values_become_files() -> None:
    (dep,) = of_component(
        render(
            "prometheus.url=https://prom.monitoring:9090",
            "prometheus.bearerTokenSecret.name=prom-token",
            "prometheus.caSecret.name=prom-ca",
            "image.digest=sha256:" + "a" * 64,
        ),
        "Deployment",
    )
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KUBEINFER_PROMETHEUS_URL"] == "https://prom.monitoring:9090"
    token_file, ca_file = env["KUBEINFER_PROMETHEUS_BEARER_TOKEN_FILE"], env["KUBEINFER_PROMETHEUS_CA_FILE"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert token_file == mounts["prometheus-token"] + "/token"
    assert ca_file == mounts["prometheus-ca"] + "/ca.crt"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"prometheus-token": "prom-token", "prometheus-ca": "prom-ca"}
    assert c["image"] == "ghcr.io/kubeinfer/operator@sha256:" + "a" * 64


def test_chart_monitoring_objects_only_when_asked_or_available() -> None:
    assert by_kind(render(), "PodMonitor") == []
    assert (
        by_kind(render("monitoring.enabled=false", api_versions=("monitoring.coreos.com/v1",)), "PodMonitor")
        == []
    )
    for docs in (render(api_versions=("monitoring.coreos.com/v1",)), render("monitoring.enabled=true")):
        (pm,) = by_kind(docs, "PodMonitor")
        (sm,) = by_kind(docs, "ServiceMonitor")
        relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
        assert {r["targetLabel"] for r in relabel} == {"namespace", "inferenceservice", POOL_TARGET_LABEL}
        # a pool's pods: the label its Deployment sets, under the name the autoscaler's queries select on
        (pool,) = [r for r in relabel if r["targetLabel"] == POOL_TARGET_LABEL]
        assert pool["sourceLabels"] == [
            "__meta_kubernetes_pod_label_" + POOL_LABEL.replace(".", "_").replace("/", "_")
        ]
        assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "kubeinfer-runtime"
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_chart_peering_off_renders_no_peering_and_no_peering_rbac() -> None:
    docs = render("peering.enabled=false")
    assert by_kind(docs, "ClusterKopfPeering") == []
    (cr,) = of_component(docs, "ClusterRole")
    assert triples(cr) == NAMESPACED | CRD_SCAN


def test_chart_refuses_kubernetes_older_than_1_28() -> None:
    from tests.unit.chart.helm_render import CHART, helm

    r = helm("template", "kubeinfer", str(CHART), "--kube-version", "v1.27.9", check=False)
    assert r.returncode != 0 and ">=1.28.0-0" in r.stderr


def test_chart_helm_template_without_kube_version_assumes_the_pinned_kubernetes(tmp_path: Path) -> None:
    """`helm template t charts/kubeinfer` as a new user types it: no cluster, no --kube-version.
    helm's default Kubernetes version is set at link time (v1.20 otherwise, below the chart's
    kubeVersion >=1.28); `make setup` derives it from hack/go.mod's client-go."""
    from tests.unit.chart.helm_render import CHART, helm, pinned_kube_version

    r = helm("template", "t", str(CHART), check=False)
    assert r.returncode == 0, r.stderr
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= {
        d["kind"] for d in yaml.safe_load_all(r.stdout) if d
    }
    probe = tmp_path / "probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (probe / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  version: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    (doc,) = [d for d in yaml.safe_load_all(helm("template", "p", str(probe)).stdout) if d]
    major, minor = pinned_kube_version()
    assert doc["data"]["version"] == f"v{major}.{minor}.0"


def test_chart_env_is_operator_settings_only() -> None:
    """Every KUBEINFER_* variable the chart sets is a setting the operator reads, with a valid value."""
    from kubeinfer.operator.settings import Settings, env_var

    (dep,) = of_component(render(values={"prometheus": {"timeoutSeconds": 2.5}}), "Deployment")
    env = {
        e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e
    }
    ours = {k: v for k, v in env.items() if k.startswith("KUBEINFER_")}
    read = {env_var(name) for name in Settings.model_fields}
    # The operator's setting of the activator's Service comes with its Service-at-zero wiring, written
    # beside the chart's activator: until it is a field, it is the one variable the operator ignores.
    pending = {"KUBEINFER_ACTIVATOR_SERVICE"} - read
    assert set(ours) - pending <= read
    settings = Settings.from_env(ours)
    assert settings.prometheus_timeout_seconds == 2.5
    assert settings.activator_enabled is True  # the chart installs the activator by default


def test_chart_app_version_is_the_package_version() -> None:
    """Chart.yaml stays literal (Helm reads it as data): it must say the version pyproject.toml says,
    which also tags the images (hack/images.py) and the operator's default runtime image."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["version"] == __version__  # the chart is released with the code it deploys
    assert f"ghcr.io/kubeinfer/runtime:{__version__}" == DEFAULT_IMAGE


def test_chart_rbac_has_no_secret_access_in_any_mode() -> None:
    """The operator never reads a Secret (the runtime pod references the bearer token's Secret): no
    Role or ClusterRole of the chart names secrets, clusterwide or namespaced."""
    for values in ({}, {"watchNamespaces": ["team-a"]}):
        docs = render(values=values)
        roles = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        assert roles
        for role in roles:
            assert not {t for t in triples(role) if t[1] == "secrets"}, role["metadata"]["name"]


def test_chart_prometheus_namespace_and_pod_labels_reach_the_operator_settings() -> None:
    """prometheus.namespace and prometheus.podLabels become the settings that admit Prometheus to the
    runtime pods' /metrics in their NetworkPolicy; unset, neither variable is set (the operator
    derives the namespace from prometheus.url)."""
    from kubeinfer.operator.settings import Settings

    def env_of(values: dict[str, Any]) -> dict[str, str]:
        (dep,) = of_component(render(values=values), "Deployment")
        return {
            e["name"]: e["value"]
            for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
            if "value" in e
        }

    labels = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
    env = env_of({"prometheus": {"namespace": "monitoring", "podLabels": labels}})
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})
    assert settings.prometheus_namespace_in_force() == "monitoring"
    assert settings.prometheus_pod_labels == labels
    plain = env_of({"prometheus": {"url": "http://prometheus-operated.obs.svc:9090"}})
    assert "KUBEINFER_PROMETHEUS_NAMESPACE" not in plain and "KUBEINFER_PROMETHEUS_POD_LABELS" not in plain
    derived = Settings.from_env({k: v for k, v in plain.items() if k.startswith("KUBEINFER_")})
    assert derived.prometheus_namespace_in_force() == "obs"
    default = Settings.from_env({k: v for k, v in env_of({}).items() if k.startswith("KUBEINFER_")})
    assert default.prometheus_namespace_in_force() == "kubeinfer-system"  # bare `prometheus`: the release's
