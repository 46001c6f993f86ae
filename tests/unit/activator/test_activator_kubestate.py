"""Kubernetes objects -> target state (activator/kubestate.py), and KubernetesTargets' handling of watch
events and demand patches with a stand-in for the API client (no API server: the integration tier has
the real one, tests/integration/activator/test_activator_kube.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from kubeinfer.activator import kubestate
from kubeinfer.activator.kube import ISVCS, PODS, SERVICES, KubernetesTargets, _Gone
from kubeinfer.activator.targets import Endpoint

from kubeinfer.contract.activator import DEMAND_ANNOTATION, ISVC_LABEL, demand_value

WHEN = datetime(2026, 12, 5, 17, 30, 0, 250_000, tzinfo=UTC)


def isvc(
    name: str = "simple", ns: str = "ml", *, ready: dict[str, str] | None = None, grpc: int | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": ns, "resourceVersion": "1"}, "spec": {}}
    if grpc is not None:
        obj["spec"]["server"] = {"grpcPort": grpc}
    if ready is not None:
        obj["status"] = {"conditions": [{"type": "Ready", **ready}]}
    return obj


def pod(
    name: str,
    *,
    owner: str = "simple",
    ns: str = "ml",
    ip: str | None = "10.0.0.5",
    phase: str = "Running",
    ready: bool = True,
    ports: dict[str, int] | None = None,
    **status: Any,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *status.pop("conditions", [])]
    container = {
        "name": "runtime",
        "ports": [{"name": k, "containerPort": v} for k, v in (ports or {}).items()],
    }
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {ISVC_LABEL: owner}, "resourceVersion": "2"},
        "spec": {"containers": [container]},
        "status": {"phase": phase, **({"podIP": ip} if ip else {}), "conditions": conditions, **status},
    }


def service(name: str = "simple", ns: str = "ml", ip: str = "10.96.0.12") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {ISVC_LABEL: name}, "resourceVersion": "3"},
        "spec": {"clusterIP": ip},
    }


# ----- endpoints


def test_a_ready_pods_endpoint_takes_its_named_ports_else_the_contracts_and_the_spec() -> None:
    assert kubestate.pod_endpoint(pod("a", ports={"http": 18080, "grpc": 18081})) == Endpoint(
        "10.0.0.5", 18080, 18081
    )
    # no named ports: REST 8080, gRPC from spec.server.grpcPort (handed in), else 8081
    assert kubestate.pod_endpoint(pod("a"), 9000) == Endpoint("10.0.0.5", 8080, 9000)
    assert kubestate.pod_endpoint(pod("a")) == Endpoint("10.0.0.5", 8080, 8081)
    assert kubestate.isvc_grpc_port(isvc(grpc=9000)) == 9000 and kubestate.isvc_grpc_port(isvc()) == 8081


@pytest.mark.parametrize(
    "p",
    [
        pod("a", ready=False),
        pod("a", phase="Pending"),
        pod("a", ip=None),
        {**pod("a"), "metadata": {**pod("a")["metadata"], "deletionTimestamp": "2026-12-05T17:00:00Z"}},
    ],
    ids=["not-ready", "pending", "no-ip", "terminating"],
)
def test_only_running_ready_pods_with_an_ip_not_being_deleted_are_endpoints(p: dict[str, Any]) -> None:
    assert kubestate.pod_endpoint(p) is None and kubestate.ready_endpoints([p]) == ()


def test_endpoints_are_by_pod_name_and_picked_in_turn() -> None:
    pods = [pod("b", ip="10.0.0.2"), pod("c", ready=False, ip="10.0.0.3"), pod("a", ip="10.0.0.1")]
    endpoints = kubestate.ready_endpoints(pods)
    assert [e.host for e in endpoints] == ["10.0.0.1", "10.0.0.2"]
    assert [kubestate.pick(endpoints, t).host for t in range(4)] == ["10.0.0.1", "10.0.0.2"] * 2  # type: ignore[union-attr]
    assert kubestate.pick((), 3) is None


# ----- stage words


def test_stage_names_the_ready_condition_the_operator_wrote() -> None:
    message = "pod simple-7d9-x: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    obj = isvc(ready={"status": "False", "reason": "Unschedulable", "message": message})
    pending = pod("simple-7d9-x", phase="Pending", ready=False, ip=None)
    assert kubestate.stage_words(obj, [pending]) == f"Unschedulable: {message}"


def test_stage_without_a_pod_says_scaled_to_zero_then_the_condition() -> None:
    assert kubestate.stage_words(isvc(), []) == kubestate.NO_REPLICA == "no replica yet (scaled to zero)"
    # Ready=True from before the scale to zero says nothing of the replica now
    assert kubestate.stage_words(
        isvc(ready={"status": "True", "reason": "MinimumReplicasAvailable"}), []
    ) == (kubestate.NO_REPLICA)
    obj = isvc(ready={"status": "False", "reason": "Progressing", "message": "0/1 replicas ready"})
    assert kubestate.stage_words(obj, []) == f"{kubestate.NO_REPLICA}; Progressing: 0/1 replicas ready"


@pytest.mark.parametrize(
    ("p", "words"),
    [
        (
            pod(
                "p",
                phase="Pending",
                ready=False,
                ip=None,
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes",
                    }
                ],
            ),
            "pod p not scheduled: Unschedulable: 0/1 nodes",
        ),
        (
            pod(
                "p",
                phase="Pending",
                ready=False,
                initContainerStatuses=[{"name": "fetch", "state": {"running": {}}}],
            ),
            "pod p: init container fetch running",
        ),
        (
            pod(
                "p",
                phase="Pending",
                ready=False,
                containerStatuses=[
                    {
                        "name": "runtime",
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}},
                    }
                ],
            ),
            "pod p: container runtime waiting: ImagePullBackOff: no such image",
        ),
        (pod("p", ready=False), "pod p: Running, not Ready"),
    ],
    ids=["unschedulable", "fetching", "image", "loading"],
)
def test_stage_of_a_pod_not_ready_when_the_condition_says_nothing(p: dict[str, Any], words: str) -> None:
    assert kubestate.stage_words(isvc(), [p]) == words
    assert kubestate.stage_words(isvc(), [p, pod("q")]) == "ready"


def test_a_target_view_resolves_by_the_services_cluster_ip() -> None:
    view = kubestate.target_view(isvc(grpc=9000), service(), [pod("a")])
    assert view.state.key == "ml/simple" and view.state.cluster_ip == "10.96.0.12"
    assert view.state.endpoint == Endpoint("10.0.0.5", 8080, 9000) and view.endpoints == (
        view.state.endpoint,
    )
    headless = {**service(), "spec": {"clusterIP": "None"}}
    assert kubestate.cluster_ip(headless) is None and kubestate.cluster_ip(None) is None


# ----- the demand annotation


def test_the_demand_patch_sets_the_contracts_annotation_to_an_rfc3339_utc_time() -> None:
    assert kubestate.demand_patch(WHEN) == {
        "metadata": {"annotations": {DEMAND_ANNOTATION: "2026-12-05T17:30:00Z"}}
    }
    assert demand_value(WHEN.astimezone(timezone(timedelta(hours=2)))) == "2026-12-05T17:30:00Z"
    with pytest.raises(ValueError):
        demand_value(datetime(2026, 12, 5, 17, 30))


# ----- KubernetesTargets with a stand-in client


class FakeApi:
    """Records ``call_api`` calls; raises ``fail`` while it is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail: Exception | None = None

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        self.calls.append((path, method, kwargs.get("body")))
        if self.fail is not None:
            raise self.fail
        return {}


def kube_targets(api: FakeApi | None = None) -> KubernetesTargets:
    return KubernetesTargets(api or FakeApi(), now=lambda: WHEN)  # type: ignore[arg-type]


def test_watch_events_make_a_target_ready_and_tell_the_listeners() -> None:
    t = kube_targets()
    heard: list[str] = []
    t.subscribe(heard.append)
    t._apply(ISVCS, {"type": "ADDED", "object": isvc()})
    t._apply(SERVICES, {"type": "ADDED", "object": service()})
    assert t.resolve("simple.ml.svc") == t.resolve("10.96.0.12:8080") == "ml/simple"
    assert t.endpoint("ml/simple") is None and t.stage("ml/simple") == kubestate.NO_REPLICA
    t._apply(PODS, {"type": "ADDED", "object": pod("a", ready=False)})
    assert t.stage("ml/simple") == "pod a: Running, not Ready"
    heard.clear()
    assert t._apply(PODS, {"type": "MODIFIED", "object": pod("a")}) == "2"
    assert heard == ["ml/simple"] and t.endpoint("ml/simple") == Endpoint("10.0.0.5", 8080, 8081)
    t._apply(PODS, {"type": "ADDED", "object": pod("b", ip="10.0.0.6")})
    assert {t.endpoint("ml/simple").host for _ in range(2)} == {"10.0.0.5", "10.0.0.6"}  # type: ignore[union-attr]
    # a pod relabelled away leaves the target; deleting the InferenceService forgets the target
    t._apply(PODS, {"type": "MODIFIED", "object": pod("b", owner="other", ip="10.0.0.6")})
    assert {t.endpoint("ml/simple").host for _ in range(2)} == {"10.0.0.5"}  # type: ignore[union-attr]
    t._apply(ISVCS, {"type": "DELETED", "object": isvc()})
    assert t.resolve("simple.ml") is None and t.endpoint("ml/simple") is None


def test_a_bookmark_moves_the_version_and_a_410_error_event_lists_again() -> None:
    t = kube_targets()
    assert t._apply(PODS, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "77"}}}) == "77"
    with pytest.raises(_Gone):
        t._apply(PODS, {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})


async def test_demand_patches_the_annotation_once_at_a_time_and_a_failure_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeApi()
    t = kube_targets(api)
    t.demand("ml/simple")
    t.demand("ml/simple")  # the patch in flight covers it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert api.calls == [
        (
            "/apis/kubeinfer.io/v1alpha1/namespaces/ml/inferenceservices/simple",
            "PATCH",
            {"metadata": {"annotations": {DEMAND_ANNOTATION: "2026-12-05T17:30:00Z"}}},
        )
    ]
    assert t.demands["ml/simple"] == 2 and t.patched["ml/simple"] == 1
    api.fail = ConnectionError("refused")
    with caplog.at_level(logging.INFO, logger="kubeinfer.activator.kube"):
        for _ in range(3):  # never raises into the caller; one line for the whole spell of failures
            t.demand("ml/simple")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        api.fail = None
        t.demand("ml/simple")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert len(api.calls) == 5 and t.patched["ml/simple"] == 2
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "not written" in m]) == 1 and "ConnectionError: refused" in lines[0]
    assert lines[-1] == "demand for ml/simple written again"


class FakeWatch:
    """A watch response streaming ``body`` in chunks of ``size`` bytes."""

    def __init__(self, body: bytes, size: int) -> None:
        self.status = 200
        self.content = self
        self._chunks = [body[i : i + size] for i in range(0, len(body), size)]
        self.released = False

    async def iter_any(self) -> Any:
        for chunk in self._chunks:
            yield chunk

    def release(self) -> None:
        self.released = True


async def test_a_watch_applies_events_split_across_chunks_and_larger_than_a_line_buffer() -> None:
    big = pod("a")
    big["metadata"]["annotations"] = {"note": "x" * 300_000}  # past aiohttp's 128 KiB readline limit
    lines = [
        {"type": "ADDED", "object": big},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    ]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in lines)
    response = FakeWatch(body, 4096)

    class Api(FakeApi):
        async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
            return response

    t = kube_targets(Api())
    t._apply(ISVCS, {"type": "ADDED", "object": isvc()})
    assert await t._watch_once(PODS, None, "1") == "9"
    assert t.endpoint("ml/simple") == Endpoint("10.0.0.5", 8080, 8081) and response.released


@pytest.mark.parametrize(
    ("scale_to_zero", "seconds"),
    [
        (None, None),  # no scaleToZero: the activator's --cold-start-timeout
        ({}, None),
        ({"coldStartTimeout": "45s"}, 45.0),
        ({"coldStartTimeout": "1m30s"}, 90.0),
        ({"coldStartTimeout": "soon"}, None),  # not a duration: the API server refuses it anyway
    ],
)
def test_the_cold_start_budget_is_the_specs_else_the_activators(
    scale_to_zero: dict[str, str] | None, seconds: float | None
) -> None:
    obj = isvc()
    if scale_to_zero is not None:
        obj["spec"]["autoscaling"] = {"minReplicas": 0, "scaleToZero": scale_to_zero}
    assert kubestate.cold_start_timeout(obj) == seconds
    assert kubestate.target_view(obj, None, []).state.cold_start_timeout_s == seconds
