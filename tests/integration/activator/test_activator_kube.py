"""The activator with its targets from the real API server (``--targets-from kubernetes``), in front of a
real ``kubeinfer-runtime`` process.

The test writes what the operator and a kubelet would: an InferenceService (the CRD from crds/), its
Service and a pod carrying the contract's pod label. No node runs the pod: the test sets its status
through the status subresource (Running, Ready, ``podIP`` 127.0.0.1) and names its container ports
``http`` and ``grpc`` after the runtime's real ports (a runtime on this machine cannot hold 8080), which
the activator takes from the pod as it would from the operator's pods. The model is Triton's ``simple``
(ONNX), the client ``tritonclient``, with ``Host`` set to the Service's DNS name. Checked: a request held
while no pod is Ready, the demand annotation written to the InferenceService (read back from the API
server), the held request answered once the pod is Ready (and a gRPC call on the shared port then
forwarded at once); an operator-style EndpointSlice of a Service at zero naming a per-target gRPC port:
the activator listens there, a gRPC call on it is held for that target (named unlike the model the call
names) and answered once its pod is Ready, and the port closes once the slice goes; a target whose
InferenceService says ``Ready=False`` with a message gets, past its 1 s ``coldStartTimeout``, a 504 naming
that message; API faults injected in front of the real API server (``kubectl proxy`` behind a small
aiohttp proxy of the test: a watch answered with 410 Gone, a list with a 500) cost a new list and a retry,
one log line and no traceback. Waits are on the activator's status page and on the API server, never on
sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from aiohttp import web
from tritonclient.utils import InferenceServerException

from hack.devtools.activator_proc import ActivatorProcess
from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx
from kubeinfer.contract.activator import (
    ACTIVATOR_GRPC_PORTS_COUNT,
    ACTIVATOR_GRPC_PORTS_FIRST,
    API_VERSION,
    DEMAND_ANNOTATION,
    ENDPOINTSLICE_MANAGED_BY,
    ISVC_LABEL,
    KIND,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
)
from tests.integration.activator.test_activator_runtime import grpc_infer, inputs, simple_config
from tests.support.cluster import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

STUCK_MESSAGE = "pod stuck-0: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


@pytest.fixture(scope="module")
def ns(cluster: Cluster, crds: None) -> Iterator[str]:
    name = f"activator-kube-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    path = simple_onnx(tmp_path_factory.mktemp("simple") / "simple.onnx")
    with RuntimeProcess(simple_config(path), ready_timeout=120, die_with_parent=False) as rt:
        yield rt


def isvc(name: str, grpc_port: int, cold_start: str | None = None) -> dict[str, Any]:
    """An InferenceService; ``cold_start``: its ``scaleToZero.coldStartTimeout`` (the budget of its held
    requests; the API's default 2m otherwise)."""
    spec: dict[str, Any] = {
        "model": {"uri": "default", "format": "huggingface"},
        "server": {"grpcPort": grpc_port},
    }
    if cold_start is not None:
        scaling = {"enabled": True, "minReplicas": 0, "maxReplicas": 1}
        spec["autoscaling"] = {**scaling, "scaleToZero": {"coldStartTimeout": cold_start}}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {ISVC_LABEL: name}},
        "spec": {
            "selector": {ISVC_LABEL: name},
            "ports": [{"name": "http", "port": 8080, "targetPort": "http"}],
        },
    }


def pod(name: str, owner: str, rt: RuntimeProcess) -> dict[str, Any]:
    ports = [
        {"name": "http", "containerPort": rt.port, "protocol": "TCP"},
        {"name": "grpc", "containerPort": rt.grpc_port, "protocol": "TCP"},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ISVC_LABEL: owner}},
        "spec": {"containers": [{"name": "runtime", "image": "kubeinfer-runtime:test", "ports": ports}]},
    }


def patch_status(cluster: Cluster, ns: str, kind: str, name: str, status: dict[str, Any]) -> None:
    body = json.dumps({"status": status})
    cluster.kubectl("patch", kind, name, "-n", ns, "--subresource=status", "--type=merge", "-p", body)


def mark_ready(cluster: Cluster, ns: str, name: str) -> None:
    """What a kubelet reports for a runtime whose readiness probe passes, at 127.0.0.1."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": t, "status": "True", "lastTransitionTime": now} for t in ("PodScheduled", "Ready")]
    ip = {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
    patch_status(cluster, ns, "pod", name, {"phase": "Running", **ip, "conditions": conditions})


def target_status(act: ActivatorProcess, target: str) -> dict[str, Any]:
    found: dict[str, Any] = act.status()["targets"].get(target) or {}
    return found


async def rest_infer(client: httpaio.InferenceServerClient, host: str, seed: int) -> bool:
    tensors, total, diff = inputs(httpclient, seed)
    result = await client.infer("simple", tensors, headers={"Host": host})
    return bool((result.as_numpy("OUTPUT0") == total).all() and (result.as_numpy("OUTPUT1") == diff).all())


async def test_a_request_held_asks_for_a_replica_and_is_answered_once_the_pod_is_ready(
    cluster: Cluster, ns: str, runtime: RuntimeProcess
) -> None:
    cluster.apply(
        [isvc("simple", runtime.grpc_port), service("simple"), pod("simple-0", "simple", runtime)], "-n", ns
    )
    target = f"{ns}/simple"
    args = ["--namespaces", ns, "--cold-start-timeout", "60"]
    with ActivatorProcess(args=args, kubeconfig=cluster.kubeconfig, die_with_parent=False) as act:
        status = await asyncio.to_thread(act.wait_for, lambda s: target in s["targets"])
        assert not status["targets"][target]["ready"]
        assert status["targets"][target]["stage"] == "pod simple-0: Pending, not Ready"
        async with httpx.AsyncClient() as raw:  # listed: ready for traffic
            assert (await raw.get(f"http://{act.address}/activator/readyz")).status_code == 200
        rest = httpaio.InferenceServerClient(act.address)
        grpc_ = grpcaio.InferenceServerClient(act.grpc_address)
        try:
            asked = datetime.now(UTC).replace(microsecond=0)
            call = asyncio.create_task(rest_infer(rest, f"simple.{ns}.svc", 7))
            await asyncio.to_thread(act.wait_for, lambda s: s["targets"][target]["held"] == 1)
            annotations = await asyncio.to_thread(
                wait_until,
                lambda: cluster.get_json("kisvc", "simple", "-n", ns)["metadata"].get("annotations"),
                timeout=30,
                message="the demand annotation",
            )
            written = datetime.strptime(annotations[DEMAND_ANNOTATION], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=UTC
            )
            assert asked <= written <= datetime.now(UTC) + timedelta(seconds=1)
            assert target_status(act, target)["demands"] == 1 and not call.done()
            await asyncio.to_thread(mark_ready, cluster, ns, "simple-0")
            assert await asyncio.wait_for(call, timeout=60) is True
            # ready now: a gRPC call on the shared port (the target named by the model) goes straight through
            assert await grpc_infer(grpc_, 8) and target_status(act, target)["held"] == 0
            assert target_status(act, target)["ready"] and "Traceback" not in act.log_text()
        finally:
            await rest.close()
            await grpc_.close()


def free_target_port() -> int:
    """A port of the activator's per-target range that nothing on this machine listens on."""
    for port in random.sample(
        range(ACTIVATOR_GRPC_PORTS_FIRST, ACTIVATOR_GRPC_PORTS_FIRST + ACTIVATOR_GRPC_PORTS_COUNT), 50
    ):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in the activator's range")


def activator_slice(service: str, grpc_port: int) -> dict[str, Any]:
    """What the operator writes for the Service ``service`` at zero: the activator's address, its REST port
    and the service's own gRPC port."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-activator",
            "labels": {SERVICE_NAME_LABEL: service, SLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGED_BY},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.96.7.7"], "conditions": {"ready": True}}],  # no loopback here
        "ports": [
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "grpc", "port": grpc_port, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
        ],
    }


async def test_a_grpc_call_on_the_port_of_a_services_endpointslice_is_for_that_service(
    cluster: Cluster, ns: str, runtime: RuntimeProcess
) -> None:
    # "zeroed" serves the model "simple" like the target "simple" may: only the port names the target
    port = free_target_port()
    objects = [isvc("zeroed", runtime.grpc_port), service("zeroed"), pod("zeroed-0", "zeroed", runtime)]
    cluster.apply([*objects, activator_slice("zeroed", port)], "-n", ns)
    target = f"{ns}/zeroed"
    with ActivatorProcess(
        args=["--namespaces", ns], kubeconfig=cluster.kubeconfig, die_with_parent=False
    ) as act:
        await asyncio.to_thread(
            act.wait_for, lambda s: (s["targets"].get(target) or {}).get("grpc_port") == port
        )
        client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            call = asyncio.create_task(grpc_infer(client, 9))
            await asyncio.to_thread(act.wait_for, lambda s: s["targets"][target]["held"] == 1)
            await asyncio.to_thread(mark_ready, cluster, ns, "zeroed-0")
            assert await asyncio.wait_for(call, timeout=60) is True
        finally:
            await client.close()
        # back at its pods: the operator deletes the slice, the port closes
        await asyncio.to_thread(cluster.kubectl, "delete", "endpointslice", "zeroed-activator", "-n", ns)
        await asyncio.to_thread(act.wait_for, lambda s: s["targets"][target]["grpc_port"] is None)
        log = act.log_text()
        assert f"grpc listening on 127.0.0.1:{port} for {target}" in log and f"grpc port {port} closed" in log
        assert "Traceback" not in log


async def test_past_the_cold_start_budget_the_504_names_the_ready_condition(
    cluster: Cluster, ns: str, runtime: RuntimeProcess
) -> None:
    cluster.apply([isvc("stuck", runtime.grpc_port, cold_start="1s"), service("stuck")], "-n", ns)
    ready = {"type": "Ready", "status": "False", "reason": "Unschedulable", "message": STUCK_MESSAGE}
    ready["lastTransitionTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await asyncio.to_thread(patch_status, cluster, ns, "kisvc", "stuck", {"conditions": [ready]})
    target = f"{ns}/stuck"
    args = ["--namespaces", ns]
    with ActivatorProcess(args=args, kubeconfig=cluster.kubeconfig, die_with_parent=False) as act:
        await asyncio.to_thread(
            act.wait_for, lambda s: STUCK_MESSAGE in (s["targets"].get(target) or {}).get("stage", "")
        )
        rest = httpaio.InferenceServerClient(act.address)
        try:
            with pytest.raises(InferenceServerException) as late:
                await rest_infer(rest, f"stuck.{ns}.svc.cluster.local:8080", 1)
            assert late.value.status() == "504"
            assert f"no replica yet (scaled to zero); Unschedulable: {STUCK_MESSAGE}" in late.value.message()
        finally:
            await rest.close()
        assert "Traceback" not in act.log_text()


GONE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
        "message": "too old resource version: 1 (2)",
    },
}


class FaultProxy:
    """Plain HTTP in front of ``kubectl proxy`` (the real API server): answers the first pod watch with a
    410 ERROR event (as the API server does for an expired resourceVersion) and the first Service list with
    a 500, and forwards everything else, streamed; counts the pod lists."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.gone_left = 1
        self.fail_left = 1
        self.pod_lists = 0
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") == "true"
        if request.method == "GET" and request.path.endswith("/pods"):
            self.pod_lists += not watch
            if watch and self.gone_left:
                self.gone_left -= 1
                return web.Response(text=json.dumps(GONE) + "\n", content_type="application/json")
        if request.method == "GET" and request.path.endswith("/services") and not watch and self.fail_left:
            self.fail_left -= 1
            status = {"kind": "Status", "status": "Failure", "code": 500, "message": "injected"}
            return web.json_response(status, status=500)
        timeout = aiohttp.ClientTimeout(total=None)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k.lower() in ("accept", "content-type")},
            ) as up,
        ):
            out = web.StreamResponse(status=up.status)
            out.content_type = up.content_type
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


@contextlib.contextmanager
def kubectl_proxy(cluster: Cluster) -> Iterator[str]:
    """``kubectl proxy`` on a free port; yields its URL."""
    proc = subprocess.Popen(
        [
            str(cluster.kubectl_path),
            "proxy",
            "--port=0",
            "--address=127.0.0.1",
            "--kubeconfig",
            str(cluster.kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"Starting to serve on 127\.0\.0\.1:(\d+)", line)
        assert found, line
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.asynccontextmanager
async def fault_proxy(upstream: str) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(upstream)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)  # watches in flight: cut
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy.port = runner.addresses[0][1]
    try:
        yield proxy
    finally:
        await runner.cleanup()


def proxy_kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: p, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: p, user: {}}]\ncontexts: [{name: p, context: {cluster: p, user: p}}]\n"
        "current-context: p\n"
    )
    return path


async def test_a_410_on_a_watch_lists_again_and_a_failed_list_is_retried(
    cluster: Cluster, ns: str, runtime: RuntimeProcess, tmp_path: Path
) -> None:
    with kubectl_proxy(cluster) as upstream:
        async with fault_proxy(upstream) as faults:
            kubeconfig = proxy_kubeconfig(tmp_path / "faults.kubeconfig", faults.port)
            args = ["--namespaces", ns]
            act = ActivatorProcess(args=args, kubeconfig=kubeconfig, die_with_parent=False)
            await asyncio.to_thread(act.start)
            try:
                started = time.monotonic()
                while faults.pod_lists < 2 or faults.fail_left:  # the 410 made it list again
                    assert time.monotonic() - started < 30, (faults.pod_lists, act.log_text()[-2000:])
                    await asyncio.sleep(0.05)
                objects = [
                    isvc("flaky", runtime.grpc_port),
                    service("flaky"),
                    pod("flaky-0", "flaky", runtime),
                ]
                await asyncio.to_thread(cluster.apply, objects, "-n", ns)
                await asyncio.to_thread(mark_ready, cluster, ns, "flaky-0")
                target = f"{ns}/flaky"
                status = await asyncio.to_thread(
                    act.wait_for, lambda s: (s["targets"].get(target) or {}).get("ready")
                )
                assert status["targets"][target]["stage"] == "ready"
                rest = httpaio.InferenceServerClient(act.address)
                try:
                    assert await rest_infer(rest, f"flaky.{ns}", 3)
                finally:
                    await rest.close()
            finally:
                await asyncio.to_thread(act.stop)
            log = act.log_text()
            act._tmp.cleanup()
    assert "Traceback" not in log
    failures = [line for line in log.splitlines() if "retrying with backoff" in line]
    assert len(failures) == 1 and "services in" in failures[0] and "HTTP 500" in failures[0], log[-3000:]
