"""The chart against the real local control plane: lint, template, server-side dry run, install,
bad values refused. (RBAC sufficiency with the real operator: test_chart_rbac_operator.py.)"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer.contract.activator import ACTIVATOR_COMPONENT, COMPONENT_LABEL
from tests.support.cluster import Cluster, wait_until
from tests.unit.chart.helm_render import CHART, of_component

CRDS_DIR = CHART / "crds"

# Representative non-default values: namespaced mode, Prometheus with auth, digest-pinned image,
# peering name, scheduling knobs, extra env.
NON_DEFAULT: dict[str, Any] = {
    "replicas": 2,
    "image": {"repository": "registry.example.com/kubeinfer/operator", "digest": "sha256:" + "b" * 64},
    "serviceAccount": {"name": "kubeinfer-op", "annotations": {"example.com/team": "ml"}},
    "peering": {"name": "kubeinfer-prod"},
    "prometheus": {
        "url": "https://prometheus.monitoring.svc:9090",
        "bearerTokenSecret": {"name": "prom-token", "key": "token"},
        "caSecret": {"name": "prom-ca", "key": "ca.crt"},
    },
    "logFormat": "plain",
    "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "priorityClassName": "system-cluster-critical",
    "extraEnv": [{"name": "EXTRA", "value": "1"}],
    "podAnnotations": {"example.com/scrape": "true"},
    # one replica (the PodDisruptionBudget's other form), its own spread, a short hold
    "activator": {
        "replicas": 1,
        "coldStartTimeoutSeconds": 12.5,
        "maxHeldBytes": 3 * 1024**3,
        "serviceAccount": {"name": "kubeinfer-edge"},
        "topologySpreadConstraints": [
            {
                "maxSkew": 2,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "activator"}},
            }
        ],
        "priorityClassName": "system-cluster-critical",
    },
}


def _release() -> str:
    return f"ki-{secrets.token_hex(3)}"


def _template(
    cluster: Cluster, release: str, namespace: str, values: dict[str, Any] | None, tmp: Path
) -> list[Any]:
    args: list[str | Path] = [
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
    ]
    if values is not None:
        vf = tmp / f"values-{release}.yaml"
        vf.write_text(yaml.safe_dump(values))
        args += ["-f", vf]
    out = cluster.helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _apply_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", CRDS_DIR)
    for crd in ("inferenceservices.kubeinfer.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


def test_chart_helm_lint(cluster: Cluster, tmp_path: Path) -> None:
    out = cluster.helm("lint", "--strict", CHART).stdout
    assert "0 chart(s) failed" in out
    vf = tmp_path / "v.yaml"
    vf.write_text(yaml.safe_dump({**NON_DEFAULT, "watchNamespaces": ["team-a"]}))
    out = cluster.helm("lint", "--strict", CHART, "-f", vf).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("variant", ["default", "non-default"])
def test_chart_rendered_manifests_pass_server_side_dry_run(
    cluster: Cluster, namespace: str, tmp_path: Path, variant: str
) -> None:
    _apply_crds(cluster)
    release = _release()
    values = None if variant == "default" else {**NON_DEFAULT, "watchNamespaces": [namespace]}
    docs = _template(cluster, release, namespace, values, tmp_path)
    kinds = sorted({d["kind"] for d in docs})
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= set(kinds)
    assert "PodDisruptionBudget" in kinds  # the activator's
    if variant == "non-default":
        assert {"Role", "RoleBinding", "KopfPeering"} <= set(kinds)
        (dep,) = of_component(docs, "Deployment")
        assert dep["spec"]["replicas"] == 2
        (pdb,) = of_component(docs, "PodDisruptionBudget", ACTIVATOR_COMPONENT)
        assert pdb["spec"]["maxUnavailable"] == 1
    else:
        assert "ClusterKopfPeering" in kinds
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs)).stdout
    # every object went through the API server's validation and admission
    assert out.count("(server dry run)") == len(docs), out


def test_chart_helm_install_succeeds_and_uninstalls(cluster: Cluster, namespace: str) -> None:
    release = _release()
    cluster.helm("install", release, CHART, "--namespace", namespace, "--set", f"peering.name={release}")
    try:
        status = cluster.helm("status", release, "--namespace", namespace, "-o", "yaml").stdout
        assert yaml.safe_load(status)["info"]["status"] == "deployed"
        deps = cluster.get_json("deployment", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}")
        accounts = {
            d["metadata"]["labels"][COMPONENT_LABEL]: d["spec"]["template"]["spec"]["serviceAccountName"]
            for d in deps["items"]
        }
        assert accounts == {
            "operator": f"{release}-kubeinfer",
            ACTIVATOR_COMPONENT: f"{release}-kubeinfer-activator",
        }
        cluster.get_json("clusterrole", f"{release}-kubeinfer")
        cluster.get_json("clusterrole", f"{release}-kubeinfer-activator")
        cluster.get_json("poddisruptionbudget", f"{release}-kubeinfer-activator", "-n", namespace)
        cluster.get_json("clusterkopfpeering", release)
        # the kube-controller-manager turns the operator Deployment into a ReplicaSet and a Pod
        wait_until(
            lambda: cluster.get_json("pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}")[
                "items"
            ],
            timeout=30,
            message="the operator's Pod",
        )
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
    for name in (f"{release}-kubeinfer", f"{release}-kubeinfer-activator"):
        r = cluster.kubectl("get", "clusterrole", name, check=False)
        assert r.returncode != 0 and "NotFound" in r.stderr


@pytest.mark.parametrize(
    ("set_arg", "named"),
    [
        ("replicas=-1", "replicas"),
        ("logFormat=xml", "logFormat"),
        ("prometheus.url=ftp://prometheus", "prometheus.url"),
        ("image.pullPolicy=Sometimes", "image.pullPolicy"),
        ("watchNamespaces[0]=Not_A_Namespace", "watchNamespaces"),
        ("monitoring.enabled=maybe", "monitoring.enabled"),
        ("replicaCount=2", "replicaCount"),
        ("healthPort=80", "healthPort"),
    ],
)
def test_chart_bad_values_are_refused_naming_the_value(
    cluster: Cluster, namespace: str, set_arg: str, named: str
) -> None:
    release = _release()
    r = cluster.helm("install", release, CHART, "--namespace", namespace, "--set", set_arg, check=False)
    try:
        assert r.returncode != 0, f"helm install --set {set_arg} was accepted"
        err = r.stderr
        assert "values don't meet the specifications of the schema" in err, err
        # helm names the field as a JSON pointer-ish path (e.g. "/prometheus/url" or "prometheus.url")
        leaf = named.split(".")[-1]
        assert leaf in err, err
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)


def test_chart_clusterwide_rbac_grants_exactly_the_reviewed_rules(cluster: Cluster, namespace: str) -> None:
    """Installed cluster-wide, the ServiceAccount can do what the operator needs in any namespace
    (asked of the API server's authorizer with `kubectl auth can-i`), and nothing beside it; the
    activator's ServiceAccount what the activator needs, and not what the operator does."""
    from tests.unit.chart.test_chart_activator import ACTIVATOR_RULES
    from tests.unit.chart.test_chart_render import CLUSTER_PEERING, CRD_SCAN, NAMESPACED

    release = _release()
    cluster.helm("install", release, CHART, "--namespace", namespace, "--set", "replicas=0")
    try:
        operator = f"system:serviceaccount:{namespace}:{release}-kubeinfer"
        activator = f"system:serviceaccount:{namespace}:{release}-kubeinfer-activator"

        def can(verb: str, group: str, resource: str, ns: str | None, who: str = operator) -> bool:
            res = resource if not group else f"{resource.split('/')[0]}.{group}"
            args = ["auth", "can-i", verb, res, "--as", who]
            if "/" in resource:
                args += ["--subresource", resource.split("/", 1)[1]]
            args += ["-n", ns] if ns else []
            r = cluster.kubectl(*args, check=False)
            return r.stdout.strip() == "yes"

        for group, resource, verb in sorted(NAMESPACED):
            assert can(verb, group, resource, "some-other-namespace"), (verb, group, resource)
        for group, resource, verb in sorted(CRD_SCAN | CLUSTER_PEERING):
            assert can(verb, group, resource, None), (verb, group, resource)
        for verb, group, resource in [
            ("get", "", "secrets"),
            ("get", "", "pods"),  # listed and watched by label (NAMESPACED), never read one by one
            ("delete", "apps", "deployments"),
            ("update", "apps", "deployments"),
            ("create", "rbac.authorization.k8s.io", "clusterroles"),
            ("delete", "kubeinfer.io", "inferenceservices"),
            ("create", "apiextensions.k8s.io", "customresourcedefinitions"),
            ("list", "", "namespaces"),
        ]:
            assert not can(verb, group, resource, "some-other-namespace"), (verb, group, resource)
        for group, resource, verb in sorted(ACTIVATOR_RULES):
            assert can(verb, group, resource, "some-other-namespace", activator), (verb, group, resource)
        for verb, group, resource in [
            ("get", "", "secrets"),
            ("update", "kubeinfer.io", "inferenceservices"),  # a merge patch of one annotation only
            ("patch", "kubeinfer.io", "inferenceservices/status"),
            ("patch", "apps", "deployments/scale"),  # it asks for a replica, the reconciler decides
            ("create", "", "pods"),
            ("patch", "", "services"),
        ]:
            assert not can(verb, group, resource, "some-other-namespace", activator), (verb, group, resource)
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
