"""``build_activator_endpointslice``: the EndpointSlice that points an InferenceService's Service at the
activator while the service is at zero, and what the operator reads of the activator's own slices.

A Service without ``spec.selector`` gets no EndpointSlice from the EndpointSlice controller: its
endpoints are whatever slices carry its name in ``kubernetes.io/service-name``. While an InferenceService
routes to the activator its Service has no selector and this slice lists the activator's Ready
addresses, on the activator's ports under the Service's port names, so that kube-proxy sends the
Service's traffic to the activator: REST on the activator's one REST port, gRPC on the port the operator
allocated to the service (``reconcile.grpcports``; the activator listens on it for that service alone,
see ``kubeinfer.contract.activator``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import metadata, with_applied_hash

from kubeinfer.contract.activator import (
    ACTIVATOR_GRPC_PORT,
    ACTIVATOR_PORT,
    ENDPOINTSLICE_MANAGED_BY,
    GRPC_PORT_NAME,
    RUNTIME_PORT_NAME,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
)

#: ``SLICE_MANAGED_BY_LABEL`` of the slices the EndpointSlice controller makes for a Service with a
#: selector.
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"


def activator_slice_name(name: str) -> str:
    """The name of the activator EndpointSlice of the InferenceService ``name``: ``<name>-activator``."""
    return f"{name}-activator"


def controller_slices_selector(service: str) -> str:
    """The label selector of the EndpointSlices the EndpointSlice controller made for ``service``."""
    return f"{SERVICE_NAME_LABEL}={service},{SLICE_MANAGED_BY_LABEL}={SLICE_CONTROLLER}"


def address_type(addresses: Sequence[str]) -> str:
    """``IPv6`` when every address of ``addresses`` is an IPv6 address, else ``IPv4`` (also for none)."""
    return "IPv6" if addresses and all(":" in a for a in addresses) else "IPv4"


def build_activator_endpointslice(
    isvc: api.InferenceService, addresses: Sequence[str], grpc_port: int = ACTIVATOR_GRPC_PORT
) -> dict[str, Any]:
    """A ``discovery.k8s.io/v1`` EndpointSlice ``<isvc>-activator`` of the Service ``<isvc>``: one Ready
    endpoint per address of ``addresses`` (the activator's Ready pods, see :func:`ready_addresses`; none
    is an empty slice), ports ``http`` -> ``ACTIVATOR_PORT`` and ``grpc`` -> ``grpc_port`` (the Service's
    port names; ``grpc_port``: the service's own activator gRPC port, see ``reconcile.grpcports``, or
    ``ACTIVATOR_GRPC_PORT``, the shared one), managed by :data:`ENDPOINTSLICE_MANAGED_BY`, owned by the
    InferenceService.

    One address family per slice (:func:`address_type`): with IPv4 addresses among ``addresses`` the
    IPv6 ones are left out (a Service has the cluster's primary family unless it asks for two)."""
    family = address_type(addresses)
    chosen = sorted({a for a in addresses if (":" in a) == (family == "IPv6")})
    meta = metadata(isvc, activator_slice_name(isvc.name))
    meta["labels"] = {
        **meta["labels"],
        SERVICE_NAME_LABEL: isvc.name,
        SLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGED_BY,
    }
    obj: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": family,
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in chosen],
        "ports": [
            {"name": RUNTIME_PORT_NAME, "port": ACTIVATOR_PORT, "protocol": "TCP"},
            {
                "name": GRPC_PORT_NAME,
                "port": grpc_port,
                "protocol": "TCP",
                "appProtocol": "kubernetes.io/h2c",
            },
        ],
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied


def ready_addresses(slices: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The addresses of the Ready endpoints of ``slices`` (EndpointSlices as the API server serves
    them), sorted, each once. An endpoint whose ``conditions.ready`` is absent counts as Ready (the
    API's reading of an unknown state); one that is not ready (a terminating one is not) does not. FQDN
    slices are skipped."""
    found: set[str] = set()
    for piece in slices:
        if piece.get("addressType") not in ("IPv4", "IPv6"):
            continue
        for endpoint in piece.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready")
            if ready is False:
                continue
            found.update(str(a) for a in endpoint.get("addresses") or [])
    return tuple(sorted(found))


def slice_grpc_port(piece: Mapping[str, Any] | None) -> int | None:
    """The number of the port named ``grpc`` of the EndpointSlice ``piece`` (``None``: no slice, no such
    port, or not an integer)."""
    for port in (piece or {}).get("ports") or []:
        if not isinstance(port, Mapping) or port.get("name") != GRPC_PORT_NAME:
            continue
        number = port.get("port")
        return number if isinstance(number, int) and not isinstance(number, bool) else None
    return None
