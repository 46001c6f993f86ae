"""The activator gRPC port of each Service at zero: the pure allocator (reconcile/grpcports.py), the
reconciler's use of it (the port in the activator EndpointSlice, kept across reconciles and restarts,
released when the slice goes, never one port for two services even when two reconciles run at once, the
shared port when none is free) and the handlers' index of the ports the operator's slices hold. The real
API server: tests/integration/operator/test_operator_scale_to_zero.py."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf
import pytest
from kubeinfer.operator import handlers
from kubeinfer.operator.builders import build_activator_endpointslice, slice_grpc_port
from kubeinfer.operator.reconcile.grpcports import GrpcPorts, preferred_port
from kubeinfer.operator.reconcile.reconciler import Reconciler

from kubeinfer.contract.activator import (
    ACTIVATOR_GRPC_PORT,
    ACTIVATOR_GRPC_PORTS_COUNT,
    ACTIVATOR_GRPC_PORTS_FIRST,
    is_target_grpc_port,
)
from tests.unit.operator.test_operator_routing import (
    T0,
    T1,
    FakeKube,
    applied,
    body,
    controller_slice,
    deployment,
    isvc_of,
)

FIRST, COUNT = ACTIVATOR_GRPC_PORTS_FIRST, ACTIVATOR_GRPC_PORTS_COUNT
A, B, C = ("ns", "a"), ("ns", "b"), ("other", "a")


def test_the_contracts_range_is_clear_of_the_shared_nodeport_and_ephemeral_ports() -> None:
    ports = range(FIRST, FIRST + COUNT)
    assert ACTIVATOR_GRPC_PORT not in ports and ports[0] > 1024 and ports[-1] < 30000  # NodePorts from 30000
    assert is_target_grpc_port(FIRST) and is_target_grpc_port(FIRST + COUNT - 1)
    assert not any(is_target_grpc_port(p) for p in (FIRST - 1, FIRST + COUNT, ACTIVATOR_GRPC_PORT, True))
    assert not is_target_grpc_port(str(FIRST))


def test_the_preferred_port_is_a_stable_hash_of_namespace_and_name() -> None:
    assert preferred_port(A) == preferred_port(("ns", "a")) == 25612  # any process, any Python
    assert len({preferred_port(("ns", f"m{i}")) for i in range(50)}) > 45  # spread over the range
    assert preferred_port(A) != preferred_port(C)
    assert all(is_target_grpc_port(preferred_port(("ns", f"m{i}"))) for i in range(200))
    assert preferred_port(A, first=100, count=1) == 100
    with pytest.raises(ValueError, match="empty"):
        preferred_port(A, count=0)


def test_a_service_gets_its_preferred_port_then_keeps_what_it_has() -> None:
    ports = GrpcPorts()
    got = ports.allocate(A, None, {})
    assert got == preferred_port(A) and ports.port_of(A) == got
    assert ports.allocate(A, 21000, {}) == got  # this process's allocation wins over a slice being edited
    # a restarted operator: the slice's port, whatever the hash says
    restarted = GrpcPorts()
    assert restarted.allocate(A, 21000, {21000: [A]}) == 21000
    # the shared port (a slice written before this allocator, or while every port was taken) moves
    assert GrpcPorts().allocate(A, ACTIVATOR_GRPC_PORT, {}) == preferred_port(A)


def test_ports_held_by_other_slices_or_other_allocations_are_skipped_wrapping_round() -> None:
    first, count = 100, 4
    start = preferred_port(A, first, count)
    after = [first + (start - first + i) % count for i in range(count)]  # its probe order
    ports = GrpcPorts(first, count)
    assert ports.allocate(B, after[0], {}) == after[0]  # B's slice names A's preferred port
    held = {after[1]: [C]}  # another namespace's slice holds the next
    assert ports.allocate(A, None, held) == after[2]
    assert ports.allocate(("ns", "d"), after[0], held) not in (after[0], after[1], after[2])
    assert ports.allocate(("ns", "e"), None, held) is None  # all four taken: nothing recorded
    assert ports.port_of(("ns", "e")) is None and len(ports.allocated()) == 3
    ports.release(B)
    assert ports.port_of(B) is None and ports.allocate(("ns", "e"), None, held) == after[0]
    ports.release(("ns", "nobody"))  # nothing to forget: nothing happens


def test_two_slices_naming_one_port_the_smaller_service_keeps_it() -> None:
    held = {21000: [A, B]}
    assert GrpcPorts().allocate(A, 21000, held) == 21000
    moved = GrpcPorts().allocate(B, 21000, held)
    assert moved is not None and moved != 21000
    # whichever reconciles first in one process, the same outcome
    ports = GrpcPorts()
    assert ports.allocate(B, 21000, held) != 21000 and ports.allocate(A, 21000, held) == 21000
    ports = GrpcPorts()
    assert ports.allocate(A, 21000, held) == 21000 and ports.allocate(B, 21000, held) != 21000


def test_the_index_of_the_operators_slices_by_grpc_port() -> None:
    isvc = isvc_of(body())
    own = build_activator_endpointslice(isvc, ("10.0.0.7",), 21234)
    labels = own["metadata"]["labels"]
    assert handlers._index_grpc_port("ns", labels, kopf.Body(own)) == {21234: ("ns", "m")}
    shared = build_activator_endpointslice(isvc, ("10.0.0.7",))
    assert handlers._index_grpc_port("ns", labels, kopf.Body(shared)) == {}
    assert handlers._index_grpc_port("ns", {}, kopf.Body(own)) == {}


def _lookup(objects: Mapping[str, Any]) -> Any:
    return lambda kind, ns, name: objects.get(kind)


@pytest.mark.timeout(10)
async def test_the_reconciler_puts_the_port_in_the_slice_and_releases_it_when_the_slice_goes() -> None:
    b = body(since=T0)
    kube = FakeKube(copy.deepcopy(b))
    rec = Reconciler(kube=kube, clock=lambda: T1, activator=True, activator_addresses=("10.0.0.7",))  # type: ignore[arg-type]
    at_zero = {"Deployment": deployment(0, 0)}
    await rec.reconcile(b, _lookup(at_zero))
    piece = applied(kube, "EndpointSlice")
    assert slice_grpc_port(piece) == preferred_port(("ns", "m")) == rec.grpc_ports.port_of(("ns", "m"))
    # a restarted operator keeps the port the existing slice names
    restarted = Reconciler(kube=kube, clock=lambda: T1, activator=True, activator_addresses=("10.0.0.7",))  # type: ignore[arg-type]
    mine = build_activator_endpointslice(isvc_of(b), ("10.0.0.7",), 21000)
    mine["metadata"]["resourceVersion"] = "3"
    kube.applied.clear()
    await restarted.reconcile(b, _lookup({**at_zero, "EndpointSlice": mine}))
    assert not [o for o in kube.applied if o["kind"] == "EndpointSlice"]  # the slice is as wanted
    assert restarted.grpc_ports.port_of(("ns", "m")) == 21000
    # back at the pods: the slice goes once the controller's slice lists a Ready pod, and so does the port
    woken = body(since=T0, demand=T1)
    woken["metadata"]["resourceVersion"] = "999"  # newer than the status the reconciles wrote
    kube.statuses["Deployment"] = {"readyReplicas": 1}
    kube.controller_slices = [controller_slice(ready=True)]
    ready = {**deployment(1, 1), "metadata": {"resourceVersion": "1000"}}  # newer than its own applies
    await restarted.reconcile(woken, _lookup({"Deployment": ready, "EndpointSlice": mine}))
    assert kube.deleted[-1].endswith("/endpointslices/m-activator")
    assert restarted.grpc_ports.port_of(("ns", "m")) is None
    # the InferenceService deleted: forgotten too
    rec.forget("ns", "m")
    assert rec.grpc_ports.allocated() == {}
    await rec.close()
    await restarted.close()


def _colliding(count: int) -> tuple[str, str]:
    """Two names in namespace ``ns`` whose preferred ports in a range of ``count`` are the same."""
    seen: dict[int, str] = {}
    for i in range(100):
        name = f"m{i}"
        port = preferred_port(("ns", name), FIRST, count)
        if port in seen:
            return seen[port], name
        seen[port] = name
    raise AssertionError("no collision")


@pytest.mark.timeout(10)
async def test_two_reconciles_at_once_never_get_one_port_and_none_left_is_the_shared_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = _colliding(2)
    bodies = []
    for name in (first, second, "third"):
        b = body(since=T0)
        b["metadata"]["name"] = name
        bodies.append(b)
    kube = FakeKube(copy.deepcopy(bodies[0]))
    rec = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        clock=lambda: T1,
        activator=True,
        activator_addresses=("10.0.0.7",),
        grpc_ports=GrpcPorts(FIRST, 2),
    )
    at_zero = _lookup({"Deployment": deployment(0, 0)})
    await asyncio.gather(*(rec.reconcile(b, at_zero) for b in bodies[:2]))
    pieces = {o["metadata"]["name"]: slice_grpc_port(o) for o in kube.applied if o["kind"] == "EndpointSlice"}
    assert sorted(pieces.values()) == [FIRST, FIRST + 1], pieces
    # the third finds none free: the shared port, logged once however often it reconciles
    with caplog.at_level(logging.WARNING, logger="kubeinfer.operator.reconcile.reconciler"):
        await rec.reconcile(bodies[2], at_zero)
        await rec.reconcile(bodies[2], at_zero)
    assert slice_grpc_port(applied(kube, "EndpointSlice")) == ACTIVATOR_GRPC_PORT
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "every activator gRPC port (2 from 20000)" in warnings[0], warnings
    # one is freed: the third gets it on its next reconcile
    rec.forget("ns", first)
    await rec.reconcile(bodies[2], at_zero)
    assert slice_grpc_port(applied(kube, "EndpointSlice")) == pieces[f"{first}-activator"]
    await rec.close()


@pytest.mark.timeout(10)
async def test_the_reconciler_skips_ports_other_slices_hold_as_watched() -> None:
    b = body(since=T0)
    kube = FakeKube(copy.deepcopy(b))
    preferred = preferred_port(("ns", "m"))
    rec = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        clock=lambda: T1,
        activator=True,
        activator_addresses=("10.0.0.7",),
        held_grpc_ports={preferred: [("elsewhere", "x")]},
    )
    await rec.reconcile(b, _lookup({"Deployment": deployment(0, 0)}))
    got = slice_grpc_port(applied(kube, "EndpointSlice"))
    assert got is not None and got != preferred and is_target_grpc_port(got)
    await rec.close()
