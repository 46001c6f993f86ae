"""``build_service``: the ClusterIP Service of an InferenceService's v2 endpoint."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import (
    metadata,
    pool_selector_labels,
    selector_labels,
    with_applied_hash,
)

from kubeinfer.contract.activator import GRPC_PORT_NAME
from kubeinfer.contract.activator import RUNTIME_PORT_NAME as PORT_NAME


def build_service(isvc: api.InferenceService, *, selector: bool = True) -> dict[str, Any]:
    """A ClusterIP Service ``<isvc>`` selecting the runtime pods: REST on port 8080 (name ``http``) and
    gRPC on ``spec.server.grpcPort`` (name ``grpc``, default 8081; ``appProtocol: kubernetes.io/h2c``).

    ``selector=False`` (the service routes to the activator): no ``spec.selector``, so that server-side
    apply drops the one the operator set and the EndpointSlice controller leaves the Service's endpoints
    to the operator's activator EndpointSlice (``builders.endpointslice``).

    A pooled InferenceService (``spec.pool``) selects its pool's pods (:func:`pool_selector_labels`):
    ``NAME.ns.svc:8080/v2/models/MODEL/infer`` reaches the pool, which loads the model on demand."""
    spec: dict[str, Any] = {"type": "ClusterIP"}
    if selector:
        pool = isvc.spec.pool
        spec["selector"] = pool_selector_labels(pool) if pool is not None else selector_labels(isvc)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, isvc.name),
        "spec": {
            **spec,
            "ports": [
                {"name": PORT_NAME, "port": api.RUNTIME_PORT, "targetPort": PORT_NAME, "protocol": "TCP"},
                {
                    "name": GRPC_PORT_NAME,
                    "port": isvc.spec.server.grpc_port,
                    "targetPort": GRPC_PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
            ],
        },
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
