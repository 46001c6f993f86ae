"""Kubernetes objects -> what the activator knows of a target (pure: no I/O, no clock).

``kube.KubernetesTargets`` keeps the InferenceServices, their Services and their pods as the API server
sends them (plain JSON objects) and turns them into target state with these functions:

- **Which targets**: every InferenceService is one (``namespace/name``), resolved by its name like its
  Service's DNS names, and by the ClusterIP of the Service in its namespace that carries its pod label
  (:data:`~kubeinfer.contract.activator.ISVC_LABEL`; a headless Service has none).
- **Endpoints** (:func:`ready_endpoints`): its pods (selected by the same label) that are Running, Ready,
  not being deleted and have an IP, sorted by pod name; the REST port is the container port named
  ``http`` (:data:`~kubeinfer.contract.activator.RUNTIME_PORT_NAME`, else 8080), the gRPC port the one
  named ``grpc`` (else ``spec.server.grpcPort``, else 8081): the pod's own ports, which stay right for an
  old pod while a rollout changes the spec. :func:`pick` takes them in turn (round-robin).
- **Stage** (:func:`stage_words`): where the replica is, for the 504 of a request held too long.
- **gRPC ports** (:func:`slice_target_port`, :func:`port_targets`): the operator's EndpointSlice of a
  Service at zero names the activator gRPC port of that service (``kubeinfer.contract.activator``): the
  activator listens there for that target alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubeinfer.activator.targets import Endpoint, TargetState

from kubeinfer.contract.activator import (
    DEMAND_ANNOTATION,
    ENDPOINTSLICE_MANAGED_BY,
    GRPC_PORT_NAME,
    ISVC_LABEL,
    RUNTIME_GRPC_PORT,
    RUNTIME_PORT,
    RUNTIME_PORT_NAME,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
    demand_value,
    is_target_grpc_port,
)
from kubeinfer.contract.durations import parse_duration

__all__ = [
    "NO_REPLICA",
    "TargetView",
    "cluster_ip",
    "cold_start_timeout",
    "demand_patch",
    "isvc_grpc_port",
    "key_of",
    "pick",
    "pod_endpoint",
    "pod_is_ready",
    "port_targets",
    "ready_endpoints",
    "slice_target_port",
    "stage_words",
    "target_key_of_labelled",
    "target_view",
]

#: The stage of a target without a pod.
NO_REPLICA = "no replica yet (scaled to zero)"

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def key_of(obj: Obj) -> str:
    """``namespace/name`` of an object."""
    meta = _meta(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def target_key_of_labelled(obj: Obj) -> str | None:
    """The target a pod or Service belongs to by its pod label: ``namespace/<label value>``, or None
    without the label."""
    meta = _meta(obj)
    owner = (meta.get("labels") or {}).get(ISVC_LABEL)
    return f"{meta.get('namespace') or 'default'}/{owner}" if owner else None


def cluster_ip(service: Obj | None) -> str | None:
    """A Service's ClusterIP, or None (no Service, headless ``None``, not allocated)."""
    if service is None:
        return None
    ip = (service.get("spec") or {}).get("clusterIP")
    return str(ip) if ip and ip != "None" else None


def isvc_grpc_port(isvc: Obj) -> int:
    """``spec.server.grpcPort`` of an InferenceService (default 8081)."""
    port = ((isvc.get("spec") or {}).get("server") or {}).get("grpcPort")
    return int(port) if isinstance(port, int) and not isinstance(port, bool) else RUNTIME_GRPC_PORT


def cold_start_timeout(isvc: Obj) -> float | None:
    """``spec.autoscaling.scaleToZero.coldStartTimeout`` of an InferenceService in seconds, or None when
    the spec sets none (no ``scaleToZero``: the activator's ``--cold-start-timeout`` applies; with it
    the API server fills in its default) or an unreadable one (the API server refuses it, so only an
    object written around it has one)."""
    spec = ((isvc.get("spec") or {}).get("autoscaling") or {}).get("scaleToZero") or {}
    text = spec.get("coldStartTimeout") if isinstance(spec, Mapping) else None
    try:
        return parse_duration(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            found: Obj = cond
            return found
    return None


def pod_is_ready(pod: Obj) -> bool:
    """Running, its ``Ready`` condition True, an IP, and not being deleted."""
    status = pod.get("status") or {}
    ready = _condition(pod, "Ready")
    return (
        status.get("phase") == "Running"
        and bool(status.get("podIP"))
        and ready is not None
        and ready.get("status") == "True"
        and not _meta(pod).get("deletionTimestamp")
    )


def _named_port(pod: Obj, name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def pod_endpoint(pod: Obj, grpc_port: int = RUNTIME_GRPC_PORT) -> Endpoint | None:
    """A Ready pod's endpoint (see the module docstring for its ports); None when it is not Ready.
    ``grpc_port``: the gRPC port when the pod names none (the InferenceService's ``spec.server.grpcPort``)."""
    if not pod_is_ready(pod):
        return None
    return Endpoint(
        host=str((pod.get("status") or {})["podIP"]),
        http_port=_named_port(pod, RUNTIME_PORT_NAME) or RUNTIME_PORT,
        grpc_port=_named_port(pod, GRPC_PORT_NAME) or grpc_port,
    )


def _by_name(pods: Iterable[Obj]) -> list[Obj]:
    return sorted(pods, key=lambda p: str(_meta(p).get("name") or ""))


def ready_endpoints(pods: Iterable[Obj], grpc_port: int = RUNTIME_GRPC_PORT) -> tuple[Endpoint, ...]:
    """The endpoints of the Ready pods among ``pods``, by pod name (:func:`pod_endpoint`)."""
    out = [pod_endpoint(p, grpc_port) for p in _by_name(pods)]
    return tuple(e for e in out if e is not None)


def pick(endpoints: Sequence[Endpoint], turn: int) -> Endpoint | None:
    """Round-robin: the endpoint for the ``turn``-th call (0, 1, 2 ...); None when there is none."""
    return endpoints[turn % len(endpoints)] if endpoints else None


def _words(reason: object, message: object) -> str:
    reason, message = str(reason or "").strip(), str(message or "").strip()
    if reason and message:
        return message if message.startswith(reason) else f"{reason}: {message}"
    return reason or message


def _pod_words(pod: Obj) -> str:
    """Where one pod that is not Ready is: not scheduled, a container waiting, an init container
    running (the model's fetch), or Running but not Ready."""
    name = _meta(pod).get("name")
    if _meta(pod).get("deletionTimestamp"):
        return f"pod {name} is terminating"
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        return f"pod {name} not scheduled: {_words(scheduled.get('reason'), scheduled.get('message'))}"
    status = pod.get("status") or {}
    for key, kind in (("initContainerStatuses", "init container"), ("containerStatuses", "container")):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting")
            if waiting and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
                words = _words(waiting.get("reason"), waiting.get("message"))
                return f"pod {name}: {kind} {cs.get('name')} waiting: {words}"
            if key == "initContainerStatuses" and "running" in state:
                return f"pod {name}: init container {cs.get('name')} running"
    return f"pod {name}: {status.get('phase') or 'Pending'}, not Ready"


def stage_words(isvc: Obj, pods: Sequence[Obj]) -> str:
    """Where a target's replica is, for the 504 of a request held past its deadline.

    The InferenceService's ``Ready`` condition, when it is not True, as ``reason: message`` (the
    operator's diagnosis, e.g. ``Unschedulable: pod p: 0/1 nodes are available: ...``); else, of its first
    pod (by name) that is not Ready, what keeps it (:func:`_pod_words`). :data:`NO_REPLICA` comes first
    when it has no pod. "ready" when a pod is Ready.
    """
    if any(pod_is_ready(p) for p in pods):
        return "ready"
    parts = [] if pods else [NO_REPLICA]
    ready = _condition(isvc, "Ready")
    condition = _words(ready.get("reason"), ready.get("message")) if ready else ""
    if ready is not None and ready.get("status") != "True" and condition:
        parts.append(condition)
    elif pods:
        parts.append(_pod_words(_by_name(pods)[0]))
    return "; ".join(parts) or NO_REPLICA


@dataclass(frozen=True)
class TargetView:
    """A target as the activator sees it: its ``state`` (``endpoint``: the first Ready pod's) and every
    Ready pod's endpoint (``endpoints``, by pod name)."""

    state: TargetState
    endpoints: tuple[Endpoint, ...]


def target_view(isvc: Obj, service: Obj | None, pods: Sequence[Obj]) -> TargetView:
    """The view of an InferenceService from it, its Service (or None) and its pods."""
    meta = _meta(isvc)
    endpoints = ready_endpoints(pods, isvc_grpc_port(isvc))
    state = TargetState(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or "default"),
        cluster_ip=cluster_ip(service),
        endpoint=endpoints[0] if endpoints else None,
        stage=stage_words(isvc, pods),
        cold_start_timeout_s=cold_start_timeout(isvc),
    )
    return TargetView(state, endpoints)


def demand_patch(when: datetime) -> dict[str, Any]:
    """The merge patch of an InferenceService through which the activator asks for a replica: the demand
    annotation set to ``when`` (timezone-aware; see ``kubeinfer.contract.activator``). Raises
    ``ValueError`` for a naive ``when``."""
    return {"metadata": {"annotations": {DEMAND_ANNOTATION: demand_value(when)}}}


def slice_target_port(piece: Obj) -> tuple[str, int] | None:
    """The target and its own activator gRPC port that an EndpointSlice names: ``(namespace/<its
    kubernetes.io/service-name>, its port named grpc)`` for a slice managed by the operator
    (:data:`~kubeinfer.contract.activator.ENDPOINTSLICE_MANAGED_BY`) whose ``grpc`` port is a per-target
    one (:func:`~kubeinfer.contract.activator.is_target_grpc_port`); None for any other slice (one on the
    shared port included)."""
    labels = _meta(piece).get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    if labels.get(SLICE_MANAGED_BY_LABEL) != ENDPOINTSLICE_MANAGED_BY or not service:
        return None
    for port in piece.get("ports") or []:
        if isinstance(port, Mapping) and port.get("name") == GRPC_PORT_NAME:
            number = port.get("port")
            if is_target_grpc_port(number):
                return f"{_meta(piece).get('namespace') or 'default'}/{service}", number
            return None
    return None


def port_targets(slices: Iterable[Obj]) -> dict[int, str]:
    """Port -> target over ``slices`` (:func:`slice_target_port`), by port. A port that two slices name
    goes to the smaller target (``namespace/name``), as the operator keeps it for that one and moves the
    other."""
    found: dict[int, str] = {}
    for piece in slices:
        named = slice_target_port(piece)
        if named is not None:
            target, port = named
            found[port] = min(target, found.get(port, target))
    return dict(sorted(found.items()))
