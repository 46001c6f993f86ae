"""The chart's activator (templates/activator.yaml): its Deployment, Service, PodDisruptionBudget,
ServiceAccount and RBAC; the operator's settings that point at it; none of it with activator.enabled false.

The names both sides must agree on come from kubeinfer/contract/activator.py, and the command line and
environment the chart renders are read by the activator's own ``parse_args``: a setting the activator does
not read, or a port the contract does not name, fails here. (The RBAC against a real API server and the
activator process: tests/integration/chart/test_chart_activator.py.)
"""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

import pytest
from kubeinfer.activator import cli
from kubeinfer.activator.kube import KINDS
from kubeinfer.operator.settings import Settings

from kubeinfer.contract.activator import (
    ACTIVATOR_COMPONENT,
    ACTIVATOR_GRPC_PORT,
    ACTIVATOR_PORT,
    COMPONENT_LABEL,
    GRPC_PORT_NAME,
    RUNTIME_PORT_NAME,
)
from tests.unit.chart.helm_render import CHART, HELM, by_kind, helm, of_component, render
from tests.unit.chart.test_chart_render import triples

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="helm not built: run `make setup`")

#: (apiGroup, resource, verb) activator/kube.py uses: lists and watches its four kinds, merge-patches the
#: demand annotation.
ACTIVATOR_RULES = {
    *(("kubeinfer.io", "inferenceservices", v) for v in ("get", "list", "watch", "patch")),
    *(("", r, v) for r in ("services", "pods") for v in ("get", "list", "watch")),
    *(("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")),
}


def test_the_activator_rules_cover_every_kind_it_watches() -> None:
    for kind in KINDS:
        parts = kind.path.split("/")
        group = "" if parts[1] == "api" else parts[2]
        assert {(group, kind.name, v) for v in ("get", "list", "watch")} <= ACTIVATOR_RULES, kind


def _activator(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = of_component(docs, kind, ACTIVATOR_COMPONENT)
    return doc


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def _parsed(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The activator's settings from the container's command line and environment, as its process reads
    them."""
    for name in [n for n in os.environ if n.startswith("KUBEINFER_ACTIVATOR_")]:
        monkeypatch.delenv(name)
    for name, value in _env(container).items():
        monkeypatch.setenv(name, value)
    assert container["command"] == ["kubeinfer-activator"]
    return cli.parse_args(container["args"])


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_activator_objects_by_default_and_the_contract_names(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(namespace="infra", values={"image": {"tag": "v9"}})
    dep, svc = _activator(docs, "Deployment"), _activator(docs, "Service")
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == "kubeinfer-activator"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"][COMPONENT_LABEL] == ACTIVATOR_COMPONENT
    c = _container(dep)
    # the operator's image, another command
    assert (
        c["image"]
        == _container(of_component(docs, "Deployment")[0])["image"]
        == "ghcr.io/kubeinfer/operator:v9"
    )
    args = _parsed(c, monkeypatch)
    assert args.targets_from == "kubernetes" and args.namespaces == ""
    assert (args.port, args.grpc_port) == (ACTIVATOR_PORT, ACTIVATOR_GRPC_PORT)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {RUNTIME_PORT_NAME: ACTIVATOR_PORT, GRPC_PORT_NAME: ACTIVATOR_GRPC_PORT}
    assert c["readinessProbe"]["httpGet"] == {"path": "/activator/readyz", "port": RUNTIME_PORT_NAME}
    assert c["livenessProbe"]["httpGet"] == {"path": "/activator/healthz", "port": RUNTIME_PORT_NAME}
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    # hardened like the operator
    op_pod = of_component(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["spec"]["securityContext"] == op_pod["securityContext"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert pod["spec"]["serviceAccountName"] == _activator(docs, "ServiceAccount")["metadata"]["name"]
    # the Service: ClusterIP, both ports by name, gRPC as cleartext HTTP/2
    assert svc["metadata"]["namespace"] == "infra" and svc["spec"]["type"] == "ClusterIP"
    assert _matches(svc["spec"]["selector"], pod["metadata"]["labels"])
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    assert by_name[RUNTIME_PORT_NAME]["port"] == ACTIVATOR_PORT
    assert by_name[RUNTIME_PORT_NAME]["targetPort"] == RUNTIME_PORT_NAME
    assert by_name[GRPC_PORT_NAME]["port"] == ACTIVATOR_GRPC_PORT
    assert by_name[GRPC_PORT_NAME]["targetPort"] == GRPC_PORT_NAME
    assert by_name[GRPC_PORT_NAME]["appProtocol"] == "kubernetes.io/h2c"
    # soft spread across nodes, over this Deployment's pods
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert _matches(spread["labelSelector"]["matchLabels"], pod["metadata"]["labels"])


def test_operator_points_at_the_activator_service() -> None:
    docs = render(namespace="infra")
    svc = _activator(docs, "Service")
    env = _env(_container(of_component(docs, "Deployment")[0]))
    assert env["KUBEINFER_ACTIVATOR_ENABLED"] == "true"
    assert env["KUBEINFER_ACTIVATOR_SERVICE"] == f"infra/{svc['metadata']['name']}"
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})
    assert settings.activator_enabled and settings.activator_service == f"infra/{svc['metadata']['name']}"


def test_a_namespaced_operator_also_handles_the_activators_namespace() -> None:
    """With watchNamespaces the operator's list gains the release's namespace (it watches the activator's
    EndpointSlices there; its settings refuse an activator outside its namespaces), with its Role and
    peering object there; without the activator the list is watchNamespaces alone."""
    for activator, handled in ((True, ["a", "b", "infra"]), (False, ["a", "b"])):
        docs = render(
            "watchNamespaces={a,b}", f"activator.enabled={str(activator).lower()}", namespace="infra"
        )
        env = _env(_container(of_component(docs, "Deployment")[0]))
        assert env["KUBEINFER_NAMESPACES"].split(",") == handled
        Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})  # accepted
        roles = {r["metadata"]["namespace"] for r in of_component(docs, "Role")}
        assert set(handled) <= roles
        peerings = {p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")}
        assert peerings == set(handled)


def test_no_selector_of_one_component_matches_the_other_components_pods() -> None:
    """The operator's Deployment and metrics Service select only the operator's pods, the activator's
    Deployment, Service, PodDisruptionBudget and spread only the activator's."""
    docs = render()
    pods = {
        d["metadata"]["labels"][COMPONENT_LABEL]: d["spec"]["template"]["metadata"]["labels"]
        for d in by_kind(docs, "Deployment")
    }
    assert set(pods) == {"operator", ACTIVATOR_COMPONENT}
    selectors: list[tuple[str, dict[str, str]]] = []
    for d in by_kind(docs, "Deployment") + by_kind(docs, "PodDisruptionBudget"):
        selectors.append((d["metadata"]["labels"][COMPONENT_LABEL], d["spec"]["selector"]["matchLabels"]))
    for s in by_kind(docs, "Service"):
        selectors.append((s["metadata"]["labels"][COMPONENT_LABEL], s["spec"]["selector"]))
    assert len(selectors) == 5
    for component, selector in selectors:
        assert {c for c, labels in pods.items() if _matches(selector, labels)} == {component}, selector


def test_activator_settings_reach_its_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-default values (a large byte count: no float notation) are what the activator reads; every
    KUBEINFER_ACTIVATOR_* variable the chart sets is one the activator reads."""
    values = {
        "watchNamespaces": ["team-a", "team-b"],
        "activator": {
            "coldStartTimeoutSeconds": 12.5,
            "maxHeldRequests": 7,
            "maxHeldBytes": 3 * 1024**3,
            "retryAfterSeconds": 3,
            "upstreamTimeoutSeconds": 30,
            "clusterDomain": "corp.internal",
            "logLevel": "DEBUG",
            "preStopSleepSeconds": 2,
        },
    }
    dep = _activator(render(values=values), "Deployment")
    c = _container(dep)
    read = set(re.findall(r'_env\("(KUBEINFER_ACTIVATOR_\w+)"', inspect.getsource(cli)))
    assert set(_env(c)) <= read
    args = _parsed(c, monkeypatch)
    assert args.namespaces == "team-a,team-b"
    assert args.cold_start_timeout == 12.5
    assert args.max_held_requests == 7
    assert args.max_held_bytes == 3 * 1024**3
    assert args.retry_after == 3
    assert args.upstream_timeout == 30
    assert args.cluster_domain == "corp.internal"
    assert args.log_level == "DEBUG"
    # time to drain: preStop, then the longest hold, then the gRPC grace
    spec = dep["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 2 + 13 + 15
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "2"]
    explicit = _activator(
        render(values={"activator": {"terminationGracePeriodSeconds": 200, "preStopSleepSeconds": 0}}),
        "Deployment",
    )
    assert explicit["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 200
    assert "lifecycle" not in _container(explicit)


def test_activator_rbac_clusterwide() -> None:
    docs = render()
    cr, crb = _activator(docs, "ClusterRole"), _activator(docs, "ClusterRoleBinding")
    assert triples(cr) == ACTIVATOR_RULES
    assert crb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cr["metadata"]["name"],
    }
    sa = _activator(docs, "ServiceAccount")
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kubeinfer-system"}
    ]
    assert sa["automountServiceAccountToken"] is True
    assert of_component(docs, "Role", ACTIVATOR_COMPONENT) == []
    # the operator's ServiceAccount is another one
    assert sa["metadata"]["name"] != of_component(docs, "ServiceAccount")[0]["metadata"]["name"]


def test_activator_rbac_namespaced_grants_only_the_listed_namespaces() -> None:
    docs = render(values={"watchNamespaces": ["team-a", "team-b"]})
    assert of_component(docs, "ClusterRole", ACTIVATOR_COMPONENT) == []
    assert of_component(docs, "ClusterRoleBinding", ACTIVATOR_COMPONENT) == []
    roles = of_component(docs, "Role", ACTIVATOR_COMPONENT)
    bindings = of_component(docs, "RoleBinding", ACTIVATOR_COMPONENT)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    sa = _activator(docs, "ServiceAccount")["metadata"]["name"]
    for role in roles:
        assert triples(role) == ACTIVATOR_RULES
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role" and b["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "kubeinfer-system"}]


def test_activator_pdb_keeps_one_replica_or_lets_a_single_one_go() -> None:
    pdb = _activator(render(), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    pods = _activator(render(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], pods)
    # one replica: a budget of minAvailable 1 would block every drain of its node
    single = _activator(render("activator.replicas=1"), "PodDisruptionBudget")
    assert single["spec"]["maxUnavailable"] == 1 and "minAvailable" not in single["spec"]


def test_activator_disabled_renders_none_of_it() -> None:
    docs = render("activator.enabled=false")
    assert [
        d for d in docs if (d["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == ACTIVATOR_COMPONENT
    ] == []
    assert by_kind(docs, "PodDisruptionBudget") == []
    assert {d["kind"] for d in docs} >= {"Deployment", "ServiceAccount", "ClusterRole"}
    env = _env(_container(of_component(docs, "Deployment")[0]))
    assert not [k for k in env if k.startswith("KUBEINFER_ACTIVATOR_")]
    assert (
        Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")}).activator_enabled
        is False
    )


def test_activator_service_account_of_the_user() -> None:
    docs = render(values={"activator": {"serviceAccount": {"create": False, "name": "edge"}}})
    assert of_component(docs, "ServiceAccount", ACTIVATOR_COMPONENT) == []
    assert _activator(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "edge"
    assert _activator(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "edge"
    r = helm(
        "template", "kubeinfer", str(CHART), "--set", "activator.serviceAccount.create=false", check=False
    )
    assert r.returncode != 0 and "activator.serviceAccount.name is required" in r.stderr


@pytest.mark.parametrize(
    "arg",
    [
        "activator.replicas=0",
        "activator.coldStartTimeoutSeconds=0",
        "activator.maxHeldBytes=-1",
        "activator.logLevel=LOUD",
        "activator.clusterDomain=Not_A_Domain",
        "activator.replica=2",
    ],
)
def test_schema_refuses_bad_activator_values(arg: str) -> None:
    out = helm("template", "kubeinfer", str(CHART), "--set", arg, check=False)
    assert out.returncode != 0 and "activator" in out.stderr, out.stderr


def test_no_pod_of_the_chart_gets_docker_link_variables() -> None:
    """A Service named ``<release>-activator`` sets ``KUBEINFER_ACTIVATOR_PORT=tcp://IP:8080`` in every pod
    of its namespace that takes service links, which the activator reads as its ``--port``: the chart's
    pods take none."""
    for docs in (render(), render("watchNamespaces={a}", namespace="infra")):
        for dep in by_kind(docs, "Deployment"):
            assert dep["spec"]["template"]["spec"]["enableServiceLinks"] is False, dep["metadata"]["name"]
