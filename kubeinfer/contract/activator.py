"""What the operator and the activator must agree on: the InferenceService's API names, the pod label that
selects its pods, the pods' port names and numbers, and the annotation through which the activator asks
for a replica.

The protocol of scale to zero: one writer per transition: 1 -> 0 the autoscaler; 0 -> 1 the reconciler,
on a demand annotation newer than the service's scale to zero. In full:

- **1 -> 0**: the autoscaler's decision (its policy's scale-to-zero rule), written as every replica count
  of the autoscaler is, through the Deployment's scale subresource, after it records the moment in
  ``status.scaledToZeroAt`` (so that no demand can fall between the two);
- **0 -> 1**: the reconciler, on a demand annotation (:data:`DEMAND_ANNOTATION`) newer than the service's
  scale to zero. The activator writes only that annotation (a merge patch of the InferenceService's
  metadata), never a replica count: it asks, the reconciler decides.
- **Routing**: the reconciler's, the one writer of the Service. With scale to zero in force the Service
  routes to the activator while its Deployment has no Ready replica (at zero, new, or woken with its pod
  starting), or while a scale to zero is decided (``status.scaledToZeroAt`` newer than the demand) and
  the Deployment asks for at most one replica (the last one draining); otherwise to its pods (and, while
  the activator has no Ready address, a service with a Ready replica stays on its pods). To the
  activator: the Service without ``spec.selector`` and an EndpointSlice ``<isvc>-activator``
  (:data:`ENDPOINTSLICE_MANAGED_BY`) of the activator's Ready addresses, ports named like the runtime's
  (:data:`RUNTIME_PORT_NAME` -> :data:`ACTIVATOR_PORT`, :data:`GRPC_PORT_NAME` -> the service's own
  activator gRPC port, see below). Back to the pods: the selector first, then that EndpointSlice goes
  once the EndpointSlice controller lists a Ready pod. For 1 -> 0 the autoscaler, after recording
  ``scaledToZeroAt``, has the reconciler apply the routing and scales to 0 only once the Service routes
  to the activator, so that no request reaches a stopping pod.
- **gRPC port per service**: a gRPC server cannot tell through which Service a call came (grpcio does
  not expose ``:authority``), so each InferenceService routed to the activator has a port of its own in
  ``[ACTIVATOR_GRPC_PORTS_FIRST, ACTIVATOR_GRPC_PORTS_FIRST + ACTIVATOR_GRPC_PORTS_COUNT)``
  (:func:`is_target_grpc_port`). The operator allocates it (one service per port among its
  EndpointSlices; a service keeps the port its slice has), the EndpointSlice ``<isvc>-activator``
  carries it as the port named :data:`GRPC_PORT_NAME`, and every activator replica, watching the
  EndpointSlices labelled ``endpointslice.kubernetes.io/managed-by:`` :data:`ENDPOINTSLICE_MANAGED_BY`,
  listens on it for that service (the one of the slice's ``kubernetes.io/service-name``). With every
  port of the range taken the slice names :data:`ACTIVATOR_GRPC_PORT`, the shared port, where a call is
  routed by the model it names. Two slices naming one port: the service with the smaller
  ``namespace/name`` has it (the operator moves the other).

The demand annotation's value is an RFC 3339 UTC timestamp in whole seconds like every ``metav1.Time``
(:func:`demand_value`): the time of the first request held since the activator last asked; asking again
writes a newer one. A demand in the same second as the scale to zero counts as newer (a tie favours the
held request: a replica too many for a moment, never a request lost).

Pure: standard library only, nothing of the operator, the runtime or the activator.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeGuard

__all__ = [
    "ACTIVATOR_COMPONENT",
    "ACTIVATOR_GRPC_PORT",
    "ACTIVATOR_GRPC_PORTS_COUNT",
    "ACTIVATOR_GRPC_PORTS_FIRST",
    "ACTIVATOR_PORT",
    "API_VERSION",
    "COLD_START_TIMEOUT_DEFAULT",
    "COMPONENT_LABEL",
    "DEMAND_ANNOTATION",
    "ENDPOINTSLICE_MANAGED_BY",
    "GROUP",
    "GRPC_PORT_NAME",
    "ISVC_LABEL",
    "KIND",
    "PLURAL",
    "RUNTIME_GRPC_PORT",
    "RUNTIME_PORT",
    "RUNTIME_PORT_NAME",
    "SERVICE_NAME_LABEL",
    "SLICE_MANAGED_BY_LABEL",
    "VERSION",
    "demand_value",
    "is_target_grpc_port",
]

#: The InferenceService's API group, version and names.
GROUP = "kubeinfer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"

#: The label carrying the InferenceService's name on its pods and owned objects (the Service included):
#: the activator selects an InferenceService's pods by it; Prometheus relabels it to ``inferenceservice``.
ISVC_LABEL = "kubeinfer.io/inferenceservice"
#: The InferenceService annotation through which the activator asks for a replica (value:
#: :func:`demand_value`).
DEMAND_ANNOTATION = "kubeinfer.io/activator-demand"

#: The runtime container's REST port (Open Inference Protocol v2 and ``/metrics``): number and name (the
#: Service's ``targetPort``, the probes, the activator's forward).
RUNTIME_PORT = 8080
RUNTIME_PORT_NAME = "http"
#: The runtime container's gRPC port: its default number (``spec.server.grpcPort``) and its name.
RUNTIME_GRPC_PORT = 8081
GRPC_PORT_NAME = "grpc"


#: ``spec.autoscaling.scaleToZero.coldStartTimeout`` when the spec leaves it out (a duration, see
#: ``kubeinfer.contract.durations``): the longest a request held for a replica waits. The operator's API
#: defaults to it; the activator applies it to a service that sets none.
COLD_START_TIMEOUT_DEFAULT = "2m"

#: The activator's pods carry ``COMPONENT_LABEL: ACTIVATOR_COMPONENT`` (the chart sets it): the runtime pods'
#: NetworkPolicy admits them, from the namespace of the activator's Service.
COMPONENT_LABEL = "app.kubernetes.io/component"
ACTIVATOR_COMPONENT = "activator"
#: The activator's REST port and its shared gRPC port (calls routed by the model they name), by number;
#: their names are the runtime's (``RUNTIME_PORT_NAME``, ``GRPC_PORT_NAME``), so that the Service of an
#: InferenceService at zero names the same ports whichever pods serve it.
ACTIVATOR_PORT = 8080
ACTIVATOR_GRPC_PORT = 8081
#: The activator's per-service gRPC ports: ``ACTIVATOR_GRPC_PORTS_COUNT`` ports from
#: ``ACTIVATOR_GRPC_PORTS_FIRST`` (20000-29999: above the well-known and most registered service ports,
#: below the NodePort range 30000-32767 and Linux's ephemeral ports from 32768). See the module docstring.
ACTIVATOR_GRPC_PORTS_FIRST = 20000
ACTIVATOR_GRPC_PORTS_COUNT = 10000
#: ``endpointslice.kubernetes.io/managed-by`` of the EndpointSlice the operator writes for the Service of an
#: InferenceService at zero (its addresses: the activator's Ready pods); the EndpointSlice controller
#: leaves slices of another manager alone. A label value (no ``/``), named like the controller's own
#: ``endpointslice-controller.k8s.io``.
ENDPOINTSLICE_MANAGED_BY = "operator.kubeinfer.io"
#: Kubernetes's labels of an EndpointSlice: its manager (the key of :data:`ENDPOINTSLICE_MANAGED_BY`) and
#: the Service it belongs to (kube-proxy reads it; the activator takes a slice's target from it).
SLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def demand_value(when: datetime) -> str:
    """The demand annotation's value for ``when`` (a timezone-aware time): RFC 3339 in UTC, whole
    seconds, ``Z`` (``2026-12-05T17:30:00Z``). Raises ``ValueError`` for a naive ``when``."""
    if when.tzinfo is None:
        raise ValueError("demand_value needs a timezone-aware time")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_target_grpc_port(port: object) -> TypeGuard[int]:
    """Whether ``port`` is one of the activator's per-service gRPC ports (an ``int``, not a ``bool``, in
    ``[ACTIVATOR_GRPC_PORTS_FIRST, ACTIVATOR_GRPC_PORTS_FIRST + ACTIVATOR_GRPC_PORTS_COUNT)``)."""
    return (
        isinstance(port, int)
        and not isinstance(port, bool)
        and ACTIVATOR_GRPC_PORTS_FIRST <= port < ACTIVATOR_GRPC_PORTS_FIRST + ACTIVATOR_GRPC_PORTS_COUNT
    )
