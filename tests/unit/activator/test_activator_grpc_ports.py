"""A gRPC port per target at zero, the activator's side: which target and port an operator's
EndpointSlice names (activator/kubestate.py, pure), KubernetesTargets keeping port -> target from the
watched slices, and GrpcFront.sync opening, moving and closing real listeners on this machine (the calls
through them against a real runtime and the real API server: tests/integration/activator/
test_activator_kube.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import grpc
import pytest
from kubeinfer.activator import kubestate
from kubeinfer.activator.cli import _KubePorts
from kubeinfer.activator.gate import Gate
from kubeinfer.activator.grpc_proxy import GrpcFront
from kubeinfer.activator.kube import ISVCS, KINDS, SLICES, KubernetesTargets
from kubeinfer.activator.targets import InMemoryTargets, TargetState
from tritonclient.grpc import service_pb2

from kubeinfer.contract.activator import (
    ACTIVATOR_GRPC_PORT,
    ENDPOINTSLICE_MANAGED_BY,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
)
from kubeinfer.shared.hold import HoldLimits
from tests.unit.activator.test_activator_kubestate import isvc


def piece(
    service: str = "simple",
    ns: str = "ml",
    port: object = 21000,
    *,
    name: str | None = None,
    manager: str = ENDPOINTSLICE_MANAGED_BY,
) -> dict[str, Any]:
    """An EndpointSlice as the operator writes it for the Service ``service`` at zero."""
    return {
        "metadata": {
            "name": name or f"{service}-activator",
            "namespace": ns,
            "resourceVersion": "4",
            "labels": {SERVICE_NAME_LABEL: service, SLICE_MANAGED_BY_LABEL: manager},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080}, {"name": "grpc", "port": port}],
    }


def test_a_slice_names_its_services_target_and_its_own_port() -> None:
    assert kubestate.slice_target_port(piece()) == ("ml/simple", 21000)
    # the shared port, a port outside the range, another manager, no Service, no grpc port: nothing
    assert kubestate.slice_target_port(piece(port=ACTIVATOR_GRPC_PORT)) is None
    assert kubestate.slice_target_port(piece(port=40000)) is None
    assert kubestate.slice_target_port(piece(port="21000")) is None
    assert kubestate.slice_target_port(piece(manager="endpointslice-controller.k8s.io")) is None
    assert kubestate.slice_target_port(piece(service="")) is None
    assert kubestate.slice_target_port({**piece(), "ports": [{"name": "http", "port": 21000}]}) is None


def test_port_targets_one_port_one_target_the_smaller_when_two_slices_name_it() -> None:
    slices = [piece("b", port=21001), piece("a", port=21000), piece("c", port=21001), piece(port=8081)]
    assert kubestate.port_targets(slices) == {21000: "ml/a", 21001: "ml/b"}
    assert kubestate.port_targets([]) == {}


def test_kubernetes_targets_keep_port_to_target_from_the_slice_watch() -> None:
    t = KubernetesTargets(object())  # type: ignore[arg-type]
    assert SLICES in KINDS and SLICES.label_selector == f"{SLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY}"
    assert SLICES.url("ml") == "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices"
    t._apply(ISVCS, {"type": "ADDED", "object": isvc()})
    assert t.grpc_ports == {} and not t.ports_changed.is_set()
    t._apply(SLICES, {"type": "ADDED", "object": piece()})
    assert t.grpc_ports == {21000: "ml/simple"} and t.ports_changed.is_set()
    t.ports_changed.clear()
    t._apply(SLICES, {"type": "MODIFIED", "object": piece()})  # its addresses changed, say: no news
    assert not t.ports_changed.is_set()
    t._apply(SLICES, {"type": "MODIFIED", "object": piece(port=21005)})
    assert t.grpc_ports == {21005: "ml/simple"} and t.ports_changed.is_set()
    t._apply(SLICES, {"type": "DELETED", "object": piece(port=21005)})
    assert t.grpc_ports == {}
    assert t.states()[0].key == "ml/simple"  # a slice never makes or changes a target


class Lister:
    """``call_api`` answering a list of ``items`` for every path."""

    def __init__(self, items: dict[str, list[dict[str, Any]]]) -> None:
        self.items = items

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        kind = path.rsplit("/", 1)[-1]
        return {"metadata": {"resourceVersion": "9"}, "items": self.items.get(kind, [])}


async def test_synced_waits_for_the_slices_listed_too() -> None:
    t = KubernetesTargets(Lister({"endpointslices": [piece()]}), namespaces=["ml"])  # type: ignore[arg-type]
    for kind in KINDS:
        assert not t.synced.is_set()
        await t._list(kind, "ml")
    assert t.synced.is_set() and t.grpc_ports == {21000: "ml/simple"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def model_ready(port: int) -> grpc.StatusCode:
    """The status of a ``ModelReady`` call on ``port`` (1 s deadline)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelReady")
        try:
            await call(service_pb2.ModelReadyRequest(name="simple").SerializeToString(), timeout=1)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.timeout(30)
async def test_sync_opens_moves_and_closes_the_per_target_listeners(caplog: pytest.LogCaptureFixture) -> None:
    table = InMemoryTargets()
    table.sync([TargetState("a", "ml", stage="pod a-0 starting"), TargetState("b", "ml", stage="pending")])
    front = GrpcFront(Gate(table, HoldLimits(cold_start_timeout_s=0.2)), "127.0.0.1")
    one, two = free_port(), free_port()
    caplog.set_level(logging.INFO, logger="kubeinfer.activator")
    try:
        assert await front.sync({one: "ml/a", two: "ml/nobody"}, 0) == {}
        assert front.ports == {"ml/a": one, "ml/nobody": two}
        # held for its own target (past the budget: DEADLINE_EXCEEDED); an unknown target: NOT_FOUND
        assert await model_ready(one) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await model_ready(two) == grpc.StatusCode.NOT_FOUND
        shared = await front.listen(0, None)  # not sync's: left alone
        assert await front.sync({one: "ml/b"}, 0) == {}  # two closed, one opened again for b
        assert front.target_of(one) == "ml/b" and front.ports == {"ml/b": one, None: shared}
        await asyncio.sleep(0.1)
        assert await model_ready(two) == grpc.StatusCode.UNAVAILABLE  # nothing listens
        # a port in use here: reported, the others served
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            failed = await front.sync({one: "ml/b", busy: "ml/a"}, 0)
            assert list(failed) == [busy] and front.target_of(one) == "ml/b"
        assert await front.sync({}, 0) == {} and front.ports == {None: shared}
    finally:
        await front.stop(0)
    assert front.ports == {}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"grpc listening on 127.0.0.1:{one} for ml/a" in logged
    assert f"grpc port {one} now for ml/b (was for ml/a)" in logged and f"grpc port {two} closed" in logged


class Ports:
    """What ``_KubePorts`` reads of ``KubernetesTargets``."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.ports_changed = asyncio.Event()
        self.grpc_ports: dict[int, str] = {}


@pytest.mark.timeout(30)
async def test_the_cli_follows_the_ports_once_listed_and_is_ready_after_opening_them() -> None:
    kube = Ports()
    front = GrpcFront(Gate(InMemoryTargets(), HoldLimits()), "127.0.0.1")
    ports = _KubePorts(kube, front, 0)  # type: ignore[arg-type]
    task = asyncio.create_task(ports.run())
    one, two = free_port(), free_port()
    try:
        kube.grpc_ports = {one: "ml/a"}
        kube.ports_changed.set()
        await asyncio.sleep(0.05)
        assert not ports.applied.is_set() and front.ports == {}  # not before every kind is listed
        kube.synced.set()
        await asyncio.wait_for(ports.applied.wait(), 5)
        assert front.ports == {"ml/a": one}
        kube.grpc_ports = {two: "ml/b"}
        kube.ports_changed.set()
        for _ in range(100):
            if front.ports == {"ml/b": two}:
                break
            await asyncio.sleep(0.02)
        assert front.ports == {"ml/b": two}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await front.stop(0)
