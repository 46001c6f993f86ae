"""Scale to zero, the operator's side, against the real API server: the 0 -> 1 transition on the
activator's demand annotation (the reconciler's), an older demand doing nothing, the status at zero,
``minReplicas: 0`` without the activator setting (accepted, kept at 1 replica, the condition saying why),
and the Service's routing: to the activator (no selector, the operator's EndpointSlice of the
activator's Ready addresses, on the service's own activator gRPC port) while no pod is Ready or a scale to
zero is decided, back to the pods once one is (the real EndpointSlice controller's slice of the pod, then
the activator slice deleted).

1 -> 0 needs the autoscaler's signals (Prometheus), which this tier does not have: the test writes what
the autoscaler writes when it scales to zero (``status.scaledToZeroAt`` first, then the Deployment's
scale subresource as ``kubeinfer-autoscaler``). No pod runs at this tier."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api, conditions, rfc3339
from kubeinfer.operator.reconcile.grpcports import preferred_port

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from kubeinfer.contract.activator import (
    DEMAND_ANNOTATION,
    ENDPOINTSLICE_MANAGED_BY,
    ISVC_LABEL,
    demand_value,
    is_target_grpc_port,
)
from tests.integration.operator.test_operator_rollout import argocd_health
from tests.support.cluster import Cluster, wait_until
from tests.support.kstatus import compute as kstatus

ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "scaleToZero": {"idleAfter": "1s"}}
#: The activator's Service (in the operator's namespace: it watches its EndpointSlices there).
ACTIVATOR = "kubeinfer-activator"


@pytest.fixture(scope="module")
def zero_operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """A ``kubeinfer-operator`` told that the activator is installed. Its resync is 300 s: what it does
    within the tests' waits comes from watch events (the annotation's change), not from a resync."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=300.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env={
            **TEST_ENV,
            "KUBEINFER_ACTIVATOR_ENABLED": "true",
            "KUBEINFER_ACTIVATOR_SERVICE": f"{op_namespace}/{ACTIVATOR}",
        },
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])


def _get(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cluster.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout)
    return obj


def _manifest(name: str, autoscaling: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
        "runtime": {"device": "cpu"},
        "autoscaling": autoscaling,
    }
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def _condition(cluster: Cluster, ns: str, name: str, type_: str) -> dict[str, Any] | None:
    conds = (_get(cluster, ns, "kisvc", name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def _replicas(cluster: Cluster, ns: str, name: str) -> int:
    return int(_get(cluster, ns, "deployment", name)["spec"].get("replicas", 1))


def _events(cluster: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = cluster.kubectl(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        f"involvedObject.name={name},reason={reason}",
        "-o",
        "json",
    ).stdout
    items: list[dict[str, Any]] = json.loads(found)["items"]
    return items


def _scale_to_zero_as_the_autoscaler(cluster: Cluster, ns: str, name: str, when: dt.datetime) -> str:
    """What the autoscaler writes when it takes a service to zero: the moment first, then the scale."""
    since = rfc3339.format_time(when)
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        f"--field-manager={api.AUTOSCALER_FIELD_MANAGER}",
        "-p",
        json.dumps({"status": {"scaledToZeroAt": since}}),
    )
    cluster.kubectl(
        "patch",
        "deployment",
        name,
        "-n",
        ns,
        "--subresource=scale",
        "--type=merge",
        f"--field-manager={api.AUTOSCALER_FIELD_MANAGER}",
        "-p",
        json.dumps({"spec": {"replicas": 0}}),
    )
    return since


def _demand(cluster: Cluster, ns: str, name: str, when: dt.datetime) -> None:
    """What the activator writes for a held request: a merge patch of the demand annotation."""
    patch = {"metadata": {"annotations": {DEMAND_ANNOTATION: demand_value(when)}}}
    cluster.kubectl("patch", "kisvc", name, "-n", ns, "--type=merge", "-p", json.dumps(patch))


def test_a_demand_newer_than_the_scale_to_zero_brings_one_replica_back(
    cluster: Cluster, op_namespace: str, zero_operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "zero"
    cluster.apply(_manifest(name, ZERO), "-n", ns)
    wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=30, message="Deployment at 1")
    enabled = wait_until(
        lambda: _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO),
        timeout=30,
        message="ScaleToZero",
    )
    assert (enabled["status"], enabled["reason"]) == ("True", conditions.SCALE_TO_ZERO_ENABLED)

    now = dt.datetime.now(dt.UTC)
    since = _scale_to_zero_as_the_autoscaler(cluster, ns, name, now)
    ready = wait_until(
        lambda: (
            (c := _condition(cluster, ns, name, conditions.CONDITION_READY))
            and c["reason"] == conditions.SCALED_TO_ZERO
            and c
        ),
        timeout=30,
        message="Ready=True ScaledToZero",
    )
    assert ready["status"] == "True" and "a request brings one back" in ready["message"]
    status = _get(cluster, ns, "kisvc", name)["status"]
    assert status["updatedReady"] == "0/0" and status["scaledToZeroAt"] == since
    assert _condition(cluster, ns, name, conditions.CONDITION_RECONCILING) is None
    assert _condition(cluster, ns, name, conditions.CONDITION_STALLED) is None
    # what Flux (kstatus, the real one) and Argo CD (the documented health check) read: healthy
    at_zero = _get(cluster, ns, "kisvc", name)
    assert kstatus(at_zero)[0] == "Current"
    assert argocd_health(at_zero)["status"] == "Healthy"

    # a demand older than the scale to zero (a request the last replica already answered): nothing
    _demand(cluster, ns, name, now - dt.timedelta(seconds=60))
    time.sleep(4.0)
    assert _replicas(cluster, ns, name) == 0
    assert _events(cluster, ns, name, conditions.SCALED_FROM_ZERO) == []

    # a held request's demand: the reconciler, the one writer, applies 1 at once (a watch event)
    asked = time.monotonic()
    _demand(cluster, ns, name, dt.datetime.now(dt.UTC))
    wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=15, message="Deployment back at 1")
    took = time.monotonic() - asked
    print(f"0 -> 1 took {took:.2f} s after the demand")
    assert took < 10.0, f"0 -> 1 took {took:.1f} s after the demand"
    (event,) = wait_until(
        lambda: _events(cluster, ns, name, conditions.SCALED_FROM_ZERO), timeout=15, message="Event"
    )
    assert event["type"] == "Normal" and "0 → 1" in event["message"] and since in event["message"]
    assert _events(cluster, ns, name, conditions.DRIFT_REVERTED) == []
    waking = wait_until(
        lambda: (
            (c := _condition(cluster, ns, name, conditions.CONDITION_READY))
            and c["reason"] != conditions.SCALED_TO_ZERO
            and c
        ),
        timeout=15,
        message="Ready leaves ScaledToZero",
    )
    assert (waking["status"], waking["reason"]) == ("False", conditions.PROGRESSING)

    # its first replica turns Ready: the ColdStart Event gives the pod's stages from the demand. No
    # kubelet at this tier: the status the kubelet would write is written here, on the pod the
    # Deployment made (the ReplicaSet controller counts it ready, the operator sees Serving turn true)
    (pod,) = wait_until(
        lambda: json.loads(
            cluster.kubectl("get", "pods", "-n", ns, "-l", f"{ISVC_LABEL}={name}", "-o", "json").stdout
        )["items"],
        timeout=15,
        message="the woken pod",
    )
    stamp = rfc3339.now()
    kubelet_status = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": stamp}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": "runtime",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "",
                "state": {"running": {"startedAt": stamp}},
            }
        ],
    }
    cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": kubelet_status}),
    )  # fmt: skip
    (cold,) = wait_until(
        lambda: _events(cluster, ns, name, conditions.COLD_START), timeout=30, message="ColdStart Event"
    )
    assert cold["type"] == "Normal" and cold["message"].startswith("first replica Ready ")
    assert f"(pod {pod['metadata']['name']}): pod created " in cold["message"], cold["message"]
    assert "after the demand at" in cold["message"] and "container started" in cold["message"]


def test_without_the_activator_min_replicas_zero_keeps_one_replica_and_says_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = f"kisvc-zero-off-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    try:
        with OperatorProcess(
            cluster.kubeconfig,
            namespaces=[ns],
            resync_seconds=300.0,
            log_dir=tmp_path,
            extra_env=dict(TEST_ENV),
        ) as proc:
            proc.wait_ready()
            name = "zero-off"
            cluster.apply(_manifest(name, ZERO), "-n", ns)  # accepted by the API server
            wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=30, message="Deployment at 1")
            off = wait_until(
                lambda: _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO),
                timeout=30,
                message="ScaleToZero",
            )
            assert (off["status"], off["reason"]) == ("False", conditions.SCALE_TO_ZERO_UNAVAILABLE)
            assert "activator" in off["message"]
            # a scale to zero (and a demand) changes nothing: the floor is 1 without the activator
            _scale_to_zero_as_the_autoscaler(cluster, ns, name, dt.datetime.now(dt.UTC))
            wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=15, message="put back at 1")
            assert _events(cluster, ns, name, conditions.SCALED_FROM_ZERO) == []
    finally:
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_the_api_server_refuses_min_replicas_zero_without_autoscaling(
    cluster: Cluster, op_namespace: str
) -> None:
    text = json.dumps(_manifest("zero-bad", {"minReplicas": 0}))
    result = cluster.kubectl("apply", "-n", op_namespace, "-f", "-", input=text, check=False)
    assert result.returncode != 0
    assert "minReplicas 0 needs spec.autoscaling.enabled" in result.stderr
    only = json.dumps(_manifest("zero-bad2", {"enabled": True, "scaleToZero": {}}))
    result = cluster.kubectl("apply", "-n", op_namespace, "-f", "-", input=only, check=False)
    assert result.returncode != 0
    assert "scaleToZero applies only with spec.autoscaling.minReplicas 0" in result.stderr


def _activator(ns: str, ready: dict[str, bool]) -> list[dict[str, Any]]:
    """The activator's Service (no selector: the test writes its EndpointSlice, as the EndpointSlice
    controller would for its pods) and that slice: an endpoint per address, Ready or not."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": ACTIVATOR, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 8080}, {"name": "grpc", "port": 8081}]},
    }
    piece = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{ACTIVATOR}-a1b2c",
            "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": ACTIVATOR,
                "endpointslice.kubernetes.io/managed-by": "tests.kubeinfer.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": r}} for a, r in ready.items()],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }
    return [service, piece]


def _slices(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("endpointslices", "-n", ns, "-l", selector)["items"]
    return items


def _grpc_port(cluster: Cluster, ns: str, name: str) -> int:
    """The port ``grpc`` of ``<name>-activator``."""
    piece = _get(cluster, ns, "endpointslice", f"{name}-activator")
    port: int = next(p["port"] for p in piece["ports"] if p["name"] == "grpc")
    return port


def _routing(cluster: Cluster, ns: str, name: str) -> tuple[bool, list[str] | None, list[dict[str, Any]]]:
    """(the Service has a selector, the addresses of ``<name>-activator`` or None when absent, the slices
    of the EndpointSlice controller for the Service)."""
    selector = "selector" in (_get(cluster, ns, "service", name).get("spec") or {})
    ours = _slices(cluster, ns, f"endpointslice.kubernetes.io/managed-by={ENDPOINTSLICE_MANAGED_BY}")
    mine = next((s for s in ours if s["metadata"]["name"] == f"{name}-activator"), None)
    addresses = None if mine is None else [a for e in mine.get("endpoints") or [] for a in e["addresses"]]
    controller = "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"
    return selector, addresses, _slices(cluster, ns, f"kubernetes.io/service-name={name},{controller}")


def _bind_and_mark_ready(cluster: Cluster, ns: str, pod: dict[str, Any], node: str, ip: str) -> None:
    """What the scheduler and a kubelet do for a runtime pod that loads: bind it to ``node``, then report
    it Running and Ready with ``ip`` (the EndpointSlice controller skips a pod without node or address)."""
    name = pod["metadata"]["name"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(binding))
    now = rfc3339.now()
    ready = {"status": "True", "lastTransitionTime": now}
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": t, **ready} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
    }
    cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_the_service_routes_to_the_activator_at_zero_and_to_the_pods_once_one_is_ready(
    cluster: Cluster, op_namespace: str, zero_operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "routed"
    node = f"routing-node-{secrets.token_hex(3)}"
    cluster.apply(_activator(ns, {"10.96.7.7": True, "10.96.7.8": False}))
    cluster.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
    try:
        # a new service has no Ready pod: its Service routes to the activator's Ready addresses
        cluster.apply(_manifest(name, ZERO), "-n", ns)
        wait_until(
            lambda: _routing(cluster, ns, name)[:2] == (False, ["10.96.7.7"]),
            timeout=30,
            message="Service without selector, the activator slice",
        )
        # its own activator gRPC port, the one its name hashes to (no other service of the operator has it)
        port = _grpc_port(cluster, ns, name)
        assert is_target_grpc_port(port) and port == preferred_port((ns, name))
        # the activator's addresses change: the service's slice follows
        cluster.apply(_activator(ns, {"10.96.7.7": True, "10.96.7.9": True}))
        wait_until(
            lambda: _routing(cluster, ns, name)[1] == ["10.96.7.7", "10.96.7.9"],
            timeout=15,
            message="the activator slice lists the new address",
        )

        # its pod turns Ready: the Service selects the pods again; the EndpointSlice controller lists the
        # pod, and only then does the activator slice go
        pods = wait_until(
            lambda: cluster.get_json("pods", "-n", ns, "-l", f"kubeinfer.io/inferenceservice={name}")[
                "items"
            ],
            timeout=30,
            message="the Deployment's pod",
        )
        _bind_and_mark_ready(cluster, ns, pods[0], node, "10.244.9.9")
        wait_until(
            lambda: (r := _routing(cluster, ns, name))[0] and r[1] is None,
            timeout=30,
            message="the selector back, the activator slice gone",
        )
        (controller,) = _routing(cluster, ns, name)[2]
        assert [e["addresses"] for e in controller["endpoints"] if e["conditions"].get("ready")] == [
            ["10.244.9.9"]
        ]
        enabled = _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO)
        assert enabled is not None and enabled["message"].endswith("the Service routes to the pods")

        # the autoscaler decides zero (status.scaledToZeroAt; its hook has the reconciler route first, a
        # watch event here): the last replica drains behind the activator, the controller's slice goes
        cluster.kubectl(
            "patch", "kisvc", name, "-n", ns, "--subresource=status", "--type=merge",
            f"--field-manager={api.AUTOSCALER_FIELD_MANAGER}",
            "-p", json.dumps({"status": {"scaledToZeroAt": rfc3339.now()}}),
        )  # fmt: skip
        wait_until(
            lambda: _routing(cluster, ns, name) == (False, ["10.96.7.7", "10.96.7.9"], []),
            timeout=30,
            message="the activator again, the controller's slice deleted",
        )
        assert _replicas(cluster, ns, name) == 1  # the scale itself is the autoscaler's
        assert _grpc_port(cluster, ns, name) == port  # released with the slice, allocated the same again
        moved = _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO)
        assert moved is not None and moved["message"].endswith("the Service routes to the activator")
    finally:
        cluster.kubectl(
            "delete", "pods", "-n", ns, "-l", f"kubeinfer.io/inferenceservice={name}",
            "--force", "--grace-period=0", check=False,
        )  # fmt: skip
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
