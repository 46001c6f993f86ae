"""Scale to zero and back on the real node: the chart's activator holds the requests of a service at zero
while its first replica starts, and no request is lost.

The model is Triton's ``simple`` add/sub as ONNX (a tiny graph: a cold start here is the runtime's and
the kubelet's, not a model's load), served from a file server on the node. The service has
``minReplicas: 0`` with a 2 s idle window on 5 s signal windows; the session's operator decides every
5 s. Three such services are made together (so they go idle together, and each case but the first finds
its service already at zero); each case waits for its service to reach zero (Deployment at 0 replicas,
its pods gone, the Service without a selector and the operator's EndpointSlice listing the activator's
pods), then sends its requests through the Service's ClusterIP as a client of the cluster would:

1. 0 -> 1 with 1 REST request, 10 gRPC calls, then 100 requests (50 REST, 50 gRPC) held together (the
   activator's per-service bound): every one answered with the right sums, none refused;
2. requests sent the moment the autoscaler records the scale to zero (the last replica draining): every
   one answered;
3. an activator pod killed while it holds requests: each client gets an answer or a clean connection
   error within its timeout, never a hang; the other activator pod keeps serving; a service at zero
   is then routed to the replacement pod too;
4. a service whose replica cannot be scheduled: a held request is answered 504 (REST) and
   DEADLINE_EXCEEDED (gRPC) after the service's ``coldStartTimeout``, naming the stage, and the service
   is ``Ready=False`` naming the cause.

After each cold start the ``ScaledFromZero`` Event is on the InferenceService and the Service points at
the runtime's pod again (its selector back, the operator's EndpointSlice gone): a warm service has no
extra hop.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_tiny import simple_onnx
from hack.podnetwork import NODE_IP
from kubeinfer.contract.activator import (
    ACTIVATOR_COMPONENT,
    COMPONENT_LABEL,
    ENDPOINTSLICE_MANAGED_BY,
    ISVC_LABEL,
)
from tests.e2e.conftest import OPERATOR_NAMESPACE, isvc_condition, wait_isvc
from tests.support.cluster import Cluster, wait_until
from tests.support.storage import FileServer

pytestmark = [pytest.mark.timeout(900), pytest.mark.quiet_node]

NAME = "zero"
#: The services of the module: the 1 REST request then the drain; the 10 gRPC calls then the activator
#: killed; the 100 requests then a call after the activator's pod was replaced.
SERVICES = (NAME, "zero-grpc", "zero-both")
STUCK = "stuck"
ELEMENTS = 16
#: Seconds a client waits for an answer: past a cold start's worst case on this node.
CLIENT_TIMEOUT_S = 120.0
#: How long to wait for the service to reach zero: the 5 s window of the signals, the 2 s idle
#: window, a 5 s tick and the pod's termination (about 15 s in all on this node), with a wide margin.
TO_ZERO_S = 150.0


@dataclass
class Zero:
    ns: str
    name: str  # the InferenceService and its model
    http: str  # ClusterIP:port of the REST port
    grpc: str  # ClusterIP:port of the gRPC port


def _isvc(name: str, url: str, sha256: str, *, cpu: str = "250m", cold_start: str = "90s") -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": name,
                "uri": url,
                "allowInsecureHttp": True,
                "sha256": sha256,
                "format": "onnx",
            },
            "resources": {"gpus": 0, "cpu": cpu, "memory": "1Gi"},
            "runtime": {"device": "cpu"},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "maxReplicas": 1,
                # Short windows: each case waits for zero, and the rate over the window reads 0 only
                # one window after the last request.
                "window": "5s",
                "scaleToZero": {"idleAfter": "2s", "coldStartTimeout": cold_start},
            },
        },
    }


def _address(cluster: Cluster, ns: str, name: str, port_name: str) -> str:
    svc = cluster.get_json("service", name, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == port_name)
    return f"{svc['spec']['clusterIP']}:{port}"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    served = tmp_path_factory.mktemp("zero") / "http"
    served.mkdir()
    path = simple_onnx(served / "simple.onnx", ELEMENTS)
    server = FileServer(served, host=NODE_IP).start()
    try:
        yield server.url("simple.onnx"), hashlib.sha256(path.read_bytes()).hexdigest()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def services(
    cluster: Cluster, operator_release: str, model_file: tuple[str, str]
) -> Iterator[dict[str, Zero]]:
    ns = f"e2e-zero-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    try:
        cluster.apply([_isvc(name, *model_file) for name in SERVICES], "-n", ns)
        for name in SERVICES:
            wait_isvc(cluster, ns, name, "True", timeout=300)
        yield {
            name: Zero(ns, name, _address(cluster, ns, name, "http"), _address(cluster, ns, name, "grpc"))
            for name in SERVICES
        }
        cluster.kubectl(
            "delete", "inferenceservice", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=130
        )
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ----- the state of the service


def _slices(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "endpointslices.discovery.k8s.io", "-n", ns, "-l", f"kubernetes.io/service-name={name}"
    )["items"]
    return items


def _activator_ips(cluster: Cluster) -> set[str]:
    pods = cluster.get_json(
        "pods", "-n", OPERATOR_NAMESPACE, "-l", f"{COMPONENT_LABEL}={ACTIVATOR_COMPONENT}"
    )
    return {
        p["status"]["podIP"]
        for p in pods["items"]
        if p["status"].get("podIP")
        and not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    }


def _routed_to_activator(cluster: Cluster, ns: str, name: str) -> bool:
    """The Service has no selector and the operator's EndpointSlice lists every Ready activator pod."""
    svc = cluster.get_json("service", name, "-n", ns)
    if svc["spec"].get("selector"):
        return False
    ours = [
        s
        for s in _slices(cluster, ns, name)
        if s["metadata"].get("labels", {}).get("endpointslice.kubernetes.io/managed-by")
        == ENDPOINTSLICE_MANAGED_BY
    ]
    addresses = {a for s in ours for e in s.get("endpoints") or [] for a in e["addresses"]}
    return bool(ours) and addresses == _activator_ips(cluster) and bool(addresses)


def _routed_to_pods(cluster: Cluster, ns: str, name: str) -> bool:
    """The Service selects the runtime pods again and no EndpointSlice of the operator is left."""
    svc = cluster.get_json("service", name, "-n", ns)
    managers = {
        s["metadata"].get("labels", {}).get("endpointslice.kubernetes.io/managed-by")
        for s in _slices(cluster, ns, name)
    }
    return bool(svc["spec"].get("selector")) and ENDPOINTSLICE_MANAGED_BY not in managers


def _accepts(address: str) -> bool:
    """Whether a TCP connection to ``address`` (``ip:port``) is accepted within 2 s."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2.0).close()
    except OSError:
        return False
    return True


def _all_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    """The runtime pods of ``name``, terminating ones included."""
    pods: list[dict[str, Any]] = cluster.get_json("pods", "-n", ns, "-l", f"{ISVC_LABEL}={name}")["items"]
    return pods


def _replicas(cluster: Cluster, ns: str, name: str) -> int:
    return int(cluster.get_json("deployment", name, "-n", ns)["spec"].get("replicas", 1))


def _diagnosis(cluster: Cluster, ns: str, name: str) -> str:
    """What the operator says of the service: its status and its log lines about it."""
    status = cluster.get_json("inferenceservice", name, "-n", ns).get("status", {})
    logs = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, "deploy/kubeinfer", "--tail=400", check=False)
    lines = [line for line in logs.stdout.splitlines() if f"{ns}/{name}" in line or "activator" in line]
    return f"status: {status}\noperator:\n" + "\n".join(lines[-25:])


def wait_at_zero(cluster: Cluster, z: Zero) -> None:
    """Until the service is at zero: no replica asked for, no pod left, the Service on the activator."""
    try:
        wait_until(
            lambda: (
                _replicas(cluster, z.ns, z.name) == 0
                and not _all_pods(cluster, z.ns, z.name)  # a terminating pod still answers what reaches it
                and _routed_to_activator(cluster, z.ns, z.name)
            ),
            timeout=TO_ZERO_S,
            interval=1.0,
            message=f"{z.ns}/{z.name} at zero, routed to the activator",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, z.ns, z.name)}") from None
    assert isvc_condition(cluster, z.ns, z.name)["status"] == "True"  # healthy at zero (kstatus: Current)


def wait_warm(cluster: Cluster, z: Zero) -> None:
    wait_until(
        lambda: _routed_to_pods(cluster, z.ns, z.name), timeout=60, interval=0.5, message="routed to the pods"
    )


def _scaled_from_zero_events(cluster: Cluster, ns: str, name: str) -> int:
    events = cluster.get_json("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return sum(int(e.get("count") or 1) for e in events if e.get("reason") == "ScaledFromZero")


# ----- the clients


def _operands(i: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(ELEMENTS, dtype=np.int32).reshape(1, ELEMENTS) + i
    return a, np.full((1, ELEMENTS), i % 7, dtype=np.int32)


def rest_add_sub(name: str, address: str, i: int) -> str:
    """One add/sub through the Service over REST (JSON). Returns "ok", or what went wrong."""
    a, b = _operands(i)
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, ELEMENTS], "data": a.ravel().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, ELEMENTS], "data": b.ravel().tolist()},
        ]
    }
    try:
        r = httpx.post(f"http://{address}/v2/models/{name}/infer", json=body, timeout=CLIENT_TIMEOUT_S)
    except httpx.TimeoutException:
        return "hang"
    except httpx.TransportError as exc:
        return f"connection error: {type(exc).__name__}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    ok = out["OUTPUT0"] == (a + b).ravel().tolist() and out["OUTPUT1"] == (a - b).ravel().tolist()
    return "ok" if ok else f"wrong answer {out}"


def grpc_add_sub(name: str, address: str, i: int) -> str:
    """One add/sub through the Service over gRPC (the model named in the call routes it at the
    activator). Returns "ok", or what went wrong."""
    a, b = _operands(i)
    inputs = []
    for tensor, array in (("INPUT0", a), ("INPUT1", b)):
        inp = grpcclient.InferInput(tensor, list(array.shape), "INT32")
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    client = grpcclient.InferenceServerClient(address)
    try:
        result = client.infer(name, inputs, client_timeout=CLIENT_TIMEOUT_S)
    except InferenceServerException as exc:
        status = str(exc.status() or "")
        if "DEADLINE_EXCEEDED" in status and "Deadline Exceeded" in str(exc.message()):
            return "hang"  # the client's own deadline, not the activator's answer
        if "UNAVAILABLE" in status:
            return f"connection error: {exc.message()}"
        return f"{status}: {exc.message()}"
    finally:
        client.close()
    ok = np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(
        result.as_numpy("OUTPUT1"), a - b
    )
    return "ok" if ok else "wrong answer"


def send(z: Zero, rest: int, grpc: int, offset: int = 0) -> list[str]:
    """``rest`` REST requests and ``grpc`` gRPC calls at once, each on its own connection; their outcomes."""
    calls = [(rest_add_sub, z.http)] * rest + [(grpc_add_sub, z.grpc)] * grpc
    with cf.ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(fn, z.name, address, offset + i) for i, (fn, address) in enumerate(calls)]
        return [f.result() for f in futures]


# ----- the cases


@pytest.mark.parametrize(
    ("name", "rest", "grpc"), [(SERVICES[0], 1, 0), (SERVICES[1], 0, 10), (SERVICES[2], 50, 50)],
    ids=["1-rest", "10-grpc", "100-both"],
)  # fmt: skip
def test_requests_held_at_zero_are_all_answered_once_a_replica_starts(
    cluster: Cluster, services: dict[str, Zero], name: str, rest: int, grpc: int
) -> None:
    zero = services[name]
    wait_at_zero(cluster, zero)
    events = _scaled_from_zero_events(cluster, zero.ns, zero.name)
    started = time.monotonic()
    outcomes = send(zero, rest, grpc)
    took = time.monotonic() - started
    assert outcomes == ["ok"] * (rest + grpc), outcomes
    assert took > 1.0, took  # held while a replica started, not answered by one still there
    print(
        f"{rest} REST + {grpc} gRPC held at zero: all answered in {took:.1f} s (first replica's cold start)"
    )
    assert _scaled_from_zero_events(cluster, zero.ns, zero.name) > events
    wait_warm(cluster, zero)


def test_a_request_arriving_while_the_last_replica_drains_is_answered(
    cluster: Cluster, services: dict[str, Zero]
) -> None:
    zero = services[NAME]
    # warm, then idle: watch for the autoscaler's record of a scale to zero made after the warm request and
    # send at once. The record is compared with the moment the warm request was answered, not with the value
    # read after it: the service may have been about to idle from an earlier case's request, and a record
    # written between the answer and that read would be taken as the old one (then nothing changes it again).
    # One in the same second counts (a record has whole seconds; operator and test share the node's clock).
    assert send(zero, 1, 0) == ["ok"]
    answered = datetime.now(UTC).replace(microsecond=0)

    def recorded() -> bool:
        at = cluster.get_json("inferenceservice", NAME, "-n", zero.ns).get("status", {}).get("scaledToZeroAt")
        return at is not None and datetime.fromisoformat(at) >= answered

    try:
        wait_until(recorded, timeout=TO_ZERO_S, interval=0.2, message="a scale to zero recorded")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, zero.ns, zero.name)}") from None
    outcomes = send(zero, 5, 5, offset=100)
    assert outcomes == ["ok"] * 10, outcomes


def test_an_activator_pod_killed_while_holding_never_leaves_a_client_hanging(
    cluster: Cluster, services: dict[str, Zero]
) -> None:
    zero = services[SERVICES[1]]
    wait_at_zero(cluster, zero)
    victim = sorted(_activator_ips(cluster))[0]
    pods = cluster.get_json(
        "pods", "-n", OPERATOR_NAMESPACE, "-l", f"{COMPONENT_LABEL}={ACTIVATOR_COMPONENT}"
    )
    victim_pod = next(p["metadata"]["name"] for p in pods["items"] if p["status"].get("podIP") == victim)
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(send, zero, 10, 10, 200)
        time.sleep(1.0)  # the requests are held (a cold start takes seconds)
        cluster.kubectl("delete", "pod", victim_pod, "-n", OPERATOR_NAMESPACE, "--grace-period=0", "--force")
        outcomes = pending.result(timeout=CLIENT_TIMEOUT_S + 30)
    assert "hang" not in outcomes, outcomes
    assert all(o == "ok" or o.startswith("connection error") for o in outcomes), outcomes
    assert outcomes.count("ok") >= 1, outcomes  # those on the other activator pod are answered
    # the activator's Deployment replaces the pod, and a Service at zero follows the new addresses (the
    # one that went idle first, rather than waiting for this one to idle again)
    wait_until(
        lambda: len(_activator_ips(cluster)) == 2, timeout=120, interval=1.0, message="2 activator pods"
    )
    other = services[SERVICES[2]]
    wait_at_zero(cluster, other)
    assert send(other, 1, 1, offset=300) == ["ok", "ok"]


def test_a_replica_that_cannot_start_gets_504s_naming_the_stage(
    cluster: Cluster, services: dict[str, Zero], model_file: tuple[str, str]
) -> None:
    zero = services[NAME]
    cluster.apply([_isvc(STUCK, *model_file, cpu="64", cold_start="8s")], "-n", zero.ns)
    wait_isvc(cluster, zero.ns, STUCK, "False", reason="Unschedulable", timeout=120)
    wait_until(
        lambda: _routed_to_activator(cluster, zero.ns, STUCK),
        timeout=60,
        interval=1.0,
        message="stuck routed",
    )
    http, grpc = _address(cluster, zero.ns, STUCK, "http"), _address(cluster, zero.ns, STUCK, "grpc")
    # kube-proxy programs the new Service's ClusterIP after the API has it (until then the node refuses
    # the connection): the subject here is the activator's answer, so its clock starts once both accept
    since = time.monotonic()
    wait_until(
        lambda: _accepts(http) and _accepts(grpc), timeout=30, interval=0.2, message="the ClusterIP accepts"
    )
    print(f"stuck's ClusterIP accepted connections {time.monotonic() - since:.1f} s after its routing")
    started = time.monotonic()
    r = httpx.post(f"http://{http}/v2/models/{STUCK}/infer", json={"inputs": []}, timeout=CLIENT_TIMEOUT_S)
    assert r.status_code == 504, r.text
    assert "Unschedulable" in r.json()["error"], r.text
    assert 7.0 <= time.monotonic() - started <= 30.0
    client = grpcclient.InferenceServerClient(grpc)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(STUCK, client_timeout=CLIENT_TIMEOUT_S)
    finally:
        client.close()
    assert "DEADLINE_EXCEEDED" in str(caught.value.status()), caught.value
    assert "Unschedulable" in str(caught.value.message()), caught.value
    cluster.kubectl(
        "delete", "inferenceservice", STUCK, "-n", zero.ns, "--wait=true", "--timeout=60s", timeout=70
    )
