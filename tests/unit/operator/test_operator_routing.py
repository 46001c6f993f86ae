"""Where a Service at zero routes: the pure rule (reconcile/routing.py), the objects it builds (the Service
without selector, the activator EndpointSlice, the activator's NetworkPolicy peer), the settings that
name the activator's Service, and the reconciler's side of a switch (the EndpointSlice controller's slices
deleted at the activator; the activator slice kept until the controller's slice lists a Ready pod), the
controllers re-reconciling the routed services when the activator's addresses change, and the handlers
reading those addresses from their index. The real API server and controller-manager are in
tests/integration/operator/test_operator_routing.py."""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Mapping
from typing import Any

import kopf
import pydantic
import pytest
from kubeinfer.operator import api, conditions, handlers, k8s
from kubeinfer.operator.builders import (
    activator_peer,
    build_activator_endpointslice,
    build_networkpolicy,
    build_service,
    ready_addresses,
    scraper_peer,
    slice_grpc_port,
)
from kubeinfer.operator.builders.endpointslice import controller_slices_selector
from kubeinfer.operator.controllers import Controllers
from kubeinfer.operator.reconcile.reconciler import Reconciler
from kubeinfer.operator.reconcile.routing import routes_to_activator, zero_decided
from kubeinfer.operator.settings import Settings

from kubeinfer.contract.activator import (
    ACTIVATOR_GRPC_PORT,
    ACTIVATOR_PORT,
    DEMAND_ANNOTATION,
    ENDPOINTSLICE_MANAGED_BY,
    ISVC_LABEL,
)

ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 3}
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def body(
    autoscaling: Mapping[str, Any] = ZERO, *, demand: str | None = None, since: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "m",
        "namespace": "ns",
        "uid": "u",
        "generation": 1,
        "resourceVersion": "5",
        "labels": {"team": "a"},
    }
    if demand is not None:
        meta["annotations"] = {DEMAND_ANNOTATION: demand}
    spec = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, "autoscaling": dict(autoscaling)}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": meta,
        "spec": spec,
        "status": {"scaledToZeroAt": since} if since else {},
    }


def isvc_of(b: Mapping[str, Any]) -> api.InferenceService:
    return api.InferenceService.from_body(b)


def deployment(replicas: int, ready: int) -> dict[str, Any]:
    return {"kind": "Deployment", "spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


@pytest.mark.parametrize(
    ("case", "autoscaling", "dep", "demand", "since", "activator", "activator_ready", "expected"),
    [
        ("a new service (no Deployment yet)", ZERO, None, None, None, True, True, True),
        ("at zero", ZERO, deployment(0, 0), None, T0, True, True, True),
        ("woken, its pod starting", ZERO, deployment(1, 0), T1, T0, True, True, True),
        ("woken, its pod Ready", ZERO, deployment(1, 1), T1, T0, True, True, False),
        ("draining: zero decided at 1 replica", ZERO, deployment(1, 1), None, T1, True, True, True),
        ("draining, older demand", ZERO, deployment(1, 1), T0, T1, True, True, True),
        ("zero decided, but 2 replicas asked", ZERO, deployment(2, 2), None, T1, True, True, False),
        ("warm, never at zero", ZERO, deployment(1, 1), None, None, True, True, False),
        ("no activator setting", ZERO, deployment(1, 0), None, None, False, True, False),
        ("minReplicas 1", {**ZERO, "minReplicas": 1}, deployment(1, 0), None, None, True, True, False),
        ("no Ready activator, pod Ready", ZERO, deployment(1, 1), None, T1, True, False, False),
        ("no Ready activator, no pod Ready", ZERO, deployment(0, 0), None, T0, True, False, True),
    ],
)
def test_the_routing_rule(
    case: str,
    autoscaling: dict[str, Any],
    dep: dict[str, Any] | None,
    demand: str | None,
    since: str | None,
    activator: bool,
    activator_ready: bool,
    expected: bool,
) -> None:
    b = body(autoscaling, demand=demand, since=since)
    got = routes_to_activator(b, isvc_of(b), dep, activator=activator, activator_ready=activator_ready)
    assert got is expected, case


def test_a_zero_is_decided_until_a_demand_at_or_after_it() -> None:
    assert not zero_decided(body())
    assert zero_decided(body(since=T1))
    assert zero_decided(body(since=T1, demand=T0))
    assert not zero_decided(body(since=T1, demand=T1))  # the same second: the demand wins
    assert zero_decided(body(since=T1, demand="not a time"))


def test_the_service_at_the_activator_has_no_selector_and_the_same_ports() -> None:
    isvc = isvc_of(body())
    warm, cold = build_service(isvc), build_service(isvc, selector=False)
    assert warm["spec"]["selector"] == {
        "app.kubernetes.io/name": "kubeinfer-runtime",
        "app.kubernetes.io/instance": "m",
        ISVC_LABEL: "m",
    }
    assert "selector" not in cold["spec"]
    assert cold["spec"]["ports"] == warm["spec"]["ports"]
    hash_key = "kubeinfer.io/applied-hash"
    assert cold["metadata"]["annotations"][hash_key] != warm["metadata"]["annotations"][hash_key]


def test_the_activator_endpointslice() -> None:
    isvc = isvc_of(body())
    piece = build_activator_endpointslice(isvc, ("10.0.0.9", "10.0.0.7", "10.0.0.9"))
    assert (piece["apiVersion"], piece["kind"]) == ("discovery.k8s.io/v1", "EndpointSlice")
    meta = piece["metadata"]
    assert (meta["name"], meta["namespace"]) == ("m-activator", "ns")
    assert meta["labels"]["kubernetes.io/service-name"] == "m"
    assert meta["labels"]["endpointslice.kubernetes.io/managed-by"] == ENDPOINTSLICE_MANAGED_BY
    assert meta["labels"][ISVC_LABEL] == "m" and meta["labels"]["app.kubernetes.io/managed-by"] == "kubeinfer"
    assert meta["ownerReferences"][0]["kind"] == api.KIND and meta["ownerReferences"][0]["uid"] == "u"
    for value in meta["labels"].values():  # what the API server accepts as a label value
        assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value) and len(value) <= 63, value
    assert piece["addressType"] == "IPv4"
    assert piece["endpoints"] == [
        {"addresses": ["10.0.0.7"], "conditions": {"ready": True}},
        {"addresses": ["10.0.0.9"], "conditions": {"ready": True}},
    ]
    # the Service's port names, the activator's port numbers: gRPC the shared port unless given its own
    service_ports = {p["name"] for p in build_service(isvc)["spec"]["ports"]}
    assert {p["name"]: p["port"] for p in piece["ports"]} == {
        "http": ACTIVATOR_PORT,
        "grpc": ACTIVATOR_GRPC_PORT,
    }
    assert {p["name"] for p in piece["ports"]} == service_ports
    own = build_activator_endpointslice(isvc, ("10.0.0.9", "10.0.0.7", "10.0.0.9"), 21234)
    assert {p["name"]: p["port"] for p in own["ports"]} == {"http": ACTIVATOR_PORT, "grpc": 21234}
    assert slice_grpc_port(own) == 21234 and slice_grpc_port(piece) == ACTIVATOR_GRPC_PORT
    assert own["metadata"]["annotations"] != piece["metadata"]["annotations"]  # another applied hash
    assert slice_grpc_port(None) is None and slice_grpc_port({"ports": [{"name": "http", "port": 1}]}) is None
    assert build_activator_endpointslice(isvc, ())["endpoints"] == []
    six = build_activator_endpointslice(isvc, ("fd00::2",))
    assert six["addressType"] == "IPv6" and six["endpoints"][0]["addresses"] == ["fd00::2"]
    mixed = build_activator_endpointslice(isvc, ("fd00::2", "10.0.0.7"))
    assert mixed["addressType"] == "IPv4" and [e["addresses"] for e in mixed["endpoints"]] == [["10.0.0.7"]]


def test_ready_addresses_of_the_activator_slices() -> None:
    slices = [
        {
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.3"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {}},  # unknown reads as Ready
                {"addresses": ["10.0.0.4"], "conditions": {"ready": False, "terminating": True}},
            ],
        },
        {"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.3"], "conditions": {"ready": True}}]},
        {"addressType": "FQDN", "endpoints": [{"addresses": ["a.example"], "conditions": {"ready": True}}]},
        {"addressType": "IPv4", "endpoints": None},
    ]
    assert ready_addresses(slices) == ("10.0.0.2", "10.0.0.3")
    assert ready_addresses([]) == ()


def test_the_network_policy_admits_the_activator_wherever_it_exists() -> None:
    isvc = isvc_of(body())
    peer = activator_peer("kubeinfer-system")
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeinfer-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "activator"}},
    }
    assert build_networkpolicy(isvc, activator=peer) is None  # no policy: every pod may connect
    scrapers = (scraper_peer("monitoring"),)
    policy = build_networkpolicy(isvc, scrapers, default_deny=True, activator=peer)
    assert policy is not None
    rule = policy["spec"]["ingress"][-1]
    assert rule == {
        "from": [peer],
        "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 8081}],
    }
    without = build_networkpolicy(isvc, scrapers, default_deny=True)
    assert without is not None and len(without["spec"]["ingress"]) == len(policy["spec"]["ingress"]) - 1


def test_the_activator_setting_needs_its_service() -> None:
    s = Settings.from_env({})
    assert s.activator_service == "" and s.activator_namespace() == ""
    with pytest.raises(
        pydantic.ValidationError, match="KUBEINFER_ACTIVATOR_ENABLED=true needs KUBEINFER_ACTIVATOR_SERVICE"
    ):
        Settings.from_env({"KUBEINFER_ACTIVATOR_ENABLED": "true"})
    env = {"KUBEINFER_ACTIVATOR_ENABLED": "true", "KUBEINFER_ACTIVATOR_SERVICE": "kubeinfer-system/activator"}
    s = Settings.from_env(env)
    assert (s.activator_namespace(), s.activator_name()) == ("kubeinfer-system", "activator")
    with pytest.raises(pydantic.ValidationError, match="activator_service"):
        Settings.from_env({**env, "KUBEINFER_ACTIVATOR_SERVICE": "activator"})  # no namespace
    # a flag completes what the environment needs
    flagged = Settings.from_args(
        ["--activator-service", "ops/activator"], env={"KUBEINFER_ACTIVATOR_ENABLED": "true"}
    )
    assert flagged.activator_service == "ops/activator"
    # the operator watches the activator's slices only in the namespaces it handles
    with pytest.raises(pydantic.ValidationError, match=r"'kubeinfer-system'.*KUBEINFER_NAMESPACES"):
        Settings.from_env({**env, "KUBEINFER_NAMESPACES": "team-a"})
    assert Settings.from_env({**env, "KUBEINFER_NAMESPACES": "team-a,kubeinfer-system"}).activator_enabled


class FakeKube:
    """In memory: applies stored with a new resourceVersion (and the ``statuses`` of their kind, as the
    API server answers an apply with the object's status); the EndpointSlice controller's slices of the
    Service (``controller_slices``) listed and deleted; status merge patches kept."""

    def __init__(self, isvc: dict[str, Any]) -> None:
        self.isvc = isvc
        self.rv = 10
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.lists: list[str] = []
        self.controller_slices: list[dict[str, Any]] = []
        self.statuses: dict[str, dict[str, Any]] = {}

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        if obj["kind"] in self.statuses:
            stored["status"] = copy.deepcopy(self.statuses[obj["kind"]])
        self.applied.append(stored)
        return stored

    async def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.isvc) if "/inferenceservices/" in path else None

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        if path.endswith("/endpointslices"):
            self.lists.append(str(label_selector))
            return copy.deepcopy(self.controller_slices)
        return []

    async def delete(self, path: str) -> bool:
        self.deleted.append(path)
        return True

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        self.isvc.setdefault("status", {}).update(copy.deepcopy(patch["status"]))
        self.isvc["metadata"]["resourceVersion"] = self._next_rv()
        return copy.deepcopy(self.isvc)

    async def post_event(
        self, involved: Mapping[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        pass

    record_event = k8s.Kube.record_event
    retry_on_conflict = k8s.Kube.retry_on_conflict


def controller_slice(ready: bool) -> dict[str, Any]:
    endpoint = {"addresses": ["10.244.0.5"], "conditions": {"ready": ready}}
    return {"metadata": {"name": "m-abcde"}, "addressType": "IPv4", "endpoints": [endpoint]}


def applied(kube: FakeKube, kind: str) -> dict[str, Any]:
    return next(o for o in reversed(kube.applied) if o["kind"] == kind)


def scale_to_zero_message(kube: FakeKube) -> str:
    conds = kube.isvc["status"]["conditions"]
    found: str = next(c for c in conds if c["type"] == conditions.CONDITION_SCALE_TO_ZERO)["message"]
    return found


@pytest.mark.timeout(10)
async def test_at_zero_the_service_goes_to_the_activator_and_the_controllers_slices_go() -> None:
    b = body(since=T0)
    kube = FakeKube(copy.deepcopy(b))
    kube.controller_slices = [controller_slice(ready=False)]
    rec = Reconciler(kube=kube, clock=lambda: T1, activator=True, activator_addresses=("10.0.0.7",))  # type: ignore[arg-type]
    dep = deployment(0, 0)
    await rec.reconcile(b, lambda kind, ns, name: dep if kind == "Deployment" else None)
    assert "selector" not in applied(kube, "Service")["spec"]
    piece = applied(kube, "EndpointSlice")
    assert piece["metadata"]["name"] == "m-activator" and piece["endpoints"][0]["addresses"] == ["10.0.0.7"]
    assert kube.lists == [controller_slices_selector("m")]
    assert kube.deleted == ["/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/m-abcde"]
    assert rec.routes[("ns", "m")] is True
    assert scale_to_zero_message(kube).endswith("the Service routes to the activator")


@pytest.mark.timeout(10)
async def test_back_at_the_pods_the_activator_slice_goes_once_the_controllers_slice_is_ready() -> None:
    b = body(since=T0, demand=T1)
    kube = FakeKube(copy.deepcopy(b))
    kube.controller_slices = [controller_slice(ready=False)]
    kube.statuses["Deployment"] = {"readyReplicas": 1}
    rec = Reconciler(kube=kube, clock=lambda: T1, activator=True, activator_addresses=("10.0.0.7",))  # type: ignore[arg-type]
    ours = build_activator_endpointslice(isvc_of(b), ("10.0.0.7",))
    ours["metadata"]["resourceVersion"] = "3"
    objects = {"Deployment": deployment(1, 1), "EndpointSlice": ours}

    def lookup(kind: str, ns: str, name: str) -> Mapping[str, Any] | None:
        return objects.get(kind)

    await rec.reconcile(b, lookup)
    assert applied(kube, "Service")["spec"]["selector"][ISVC_LABEL] == "m"
    assert not any(o["kind"] == "EndpointSlice" for o in kube.applied)
    # the controller's slice lists no Ready pod yet: the activator's stays, and a retry is due
    assert kube.deleted == [] and rec.routes[("ns", "m")] is False
    assert ("ns", "m") in rec._retries
    assert scale_to_zero_message(kube).endswith("the Service routes to the pods")
    rec._retries.pop(("ns", "m")).cancel()
    kube.controller_slices = [controller_slice(ready=True)]
    await rec.reconcile(b, lookup)
    assert kube.deleted == ["/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/m-activator"]
    assert ("ns", "m") not in rec._retries
    await rec.close()


@pytest.mark.timeout(10)
async def test_new_activator_addresses_reach_every_routed_service() -> None:
    settings = Settings.from_env(
        {
            "KUBEINFER_ACTIVATOR_ENABLED": "true",
            "KUBEINFER_ACTIVATOR_SERVICE": "ops/activator",
            "KUBEINFER_PEERING": "",
        }
    )
    controllers = Controllers.create(FakeKube(body()), settings)  # type: ignore[arg-type]
    assert controllers.reconciler.activator_peer == activator_peer("ops")
    rec = controllers.reconciler
    warm, cold = body(), body()
    warm["metadata"]["name"] = "warm"
    rec.bodies = {("ns", "warm"): warm, ("ns", "m"): cold}
    rec.routes = {("ns", "warm"): False, ("ns", "m"): True}
    seen: list[str] = []

    async def reconcile(b: Mapping[str, Any], lookup: Any, *, latest: bool = False) -> None:
        seen.append(b["metadata"]["name"])

    rec.reconcile = reconcile  # type: ignore[method-assign]
    nothing = lambda kind, ns, name: None  # noqa: E731
    # the first Ready address: every service that asks for scale to zero (a draining one may move)
    await controllers.activator_seen(("10.0.0.7",), nothing)
    assert sorted(seen) == ["m", "warm"] and rec.activator_addresses == ("10.0.0.7",)
    seen.clear()
    held = {21000: [("ns", "m")]}
    await controllers.activator_seen(("10.0.0.7",), nothing, grpc_ports=held)  # no change: nothing
    assert seen == [] and rec.held_grpc_ports is held  # but the reconciler reads the index of ports
    await controllers.activator_seen(("10.0.0.7", "10.0.0.8"), nothing)  # a change: the routed ones
    assert seen == ["m"]


@pytest.mark.timeout(10)
async def test_the_handlers_tell_the_controllers_the_indexed_activator_addresses() -> None:
    settings = Settings.from_env(
        {"KUBEINFER_ACTIVATOR_ENABLED": "true", "KUBEINFER_ACTIVATOR_SERVICE": "ops/activator"}
    )
    registry = kopf.OperatorRegistry()
    handlers.register(settings, registry)
    indexes = {h.id for h in registry._indexing.get_all_handlers()}
    assert {handlers.ACTIVATOR_INDEX, handlers.GRPC_PORTS_INDEX, "kubeinfer_endpointslices"} <= indexes
    off = kopf.OperatorRegistry()
    handlers.register(Settings.from_env({}), off)
    assert handlers.ACTIVATOR_INDEX not in {h.id for h in off._indexing.get_all_handlers()}

    piece = {"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.8"], "conditions": {"ready": True}}]}
    entry = handlers._index_activator_slice("activator-x", kopf.Body(piece))
    assert entry == {"activator-x": ("10.0.0.8",)}
    index = {"activator-x": [("10.0.0.8",)], "activator-y": [("10.0.0.2", "10.0.0.8")]}
    assert handlers._activator_addresses(index) == ("10.0.0.2", "10.0.0.8")

    told: list[tuple[tuple[str, ...], Any]] = []

    class Seen:
        async def activator_seen(self, addresses: tuple[str, ...], lookup: Any, grpc_ports: Any) -> None:
            told.append((addresses, grpc_ports))

    memo = {handlers.CONTROLLERS_MEMO_KEY: Seen()}
    held = {21000: [("ns", "m")]}
    kwargs = {handlers.ACTIVATOR_INDEX: index, handlers.GRPC_PORTS_INDEX: held}
    await handlers.activator_slice_event(memo, **kwargs)  # type: ignore[arg-type]
    assert told == [(("10.0.0.2", "10.0.0.8"), held)]
    await asyncio.sleep(0)


@pytest.mark.timeout(10)
async def test_the_autoscalers_hook_has_the_reconciler_route_first() -> None:
    """Before a scale to 0 the autoscaler awaits ``on_zero``: the controllers reconcile the stored object
    and answer whether its Service now routes to the activator."""
    settings = Settings.from_env(
        {"KUBEINFER_ACTIVATOR_ENABLED": "true", "KUBEINFER_ACTIVATOR_SERVICE": "ops/activator"}
    )
    controllers = Controllers.create(FakeKube(body()), settings)  # type: ignore[arg-type]
    stored = body(since=T1)
    answers: list[bool] = []
    reconciled: list[Mapping[str, Any]] = []

    async def tick(b: Mapping[str, Any], dep: Any, *, on_zero: Any = None) -> None:
        answers.append(await on_zero(stored))

    routes = iter((True, False))

    async def reconcile(b: Mapping[str, Any], lookup: Any, *, latest: bool = False) -> None:
        reconciled.append(b)
        controllers.reconciler.routes[("ns", "m")] = next(routes)

    controllers.autoscaler.tick = tick  # type: ignore[method-assign]
    controllers.reconciler.reconcile = reconcile  # type: ignore[method-assign]
    for _ in range(2):
        await controllers.autoscale(body(), lambda kind, ns, name: None)
    assert answers == [True, False] and reconciled == [stored, stored]
