"""The kinds an InferenceService owns, in one table: API resource, object name, builder, kopf index.

``OWNED`` drives the reconciler (what to build, apply, delete and forget), the handlers (one kopf
index and one watch per kind) and ``k8s`` (the resource paths, through :class:`k8s.Resource`).
Adding an owned kind is one row here and one builder in ``kubeinfer.operator.builders``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator import api, k8s
from kubeinfer.operator.builders import (
    activator_slice_name,
    build_activator_endpointslice,
    build_configmap,
    build_deployment,
    build_networkpolicy,
    build_pdb,
    build_service,
)

from kubeinfer.contract.activator import ACTIVATOR_GRPC_PORT


@dataclass(frozen=True)
class BuildInputs:
    """What the builders need beyond the InferenceService: the max queue delay in force (seconds),
    ``spec.replicas`` of the Deployment (``None`` = leave it to its other owner, see
    ``replicas.desired_replicas``), the NetworkPolicy peers of the operator's Prometheus
    (``scrapers``, admitted to the metrics port) and ``default_deny`` (every InferenceService gets a
    NetworkPolicy, even without ``spec.server.allowFrom``); the last two from the operator's settings.
    ``activator_addresses``: ``None`` when the Service routes to its pods (it selects them), else the
    activator's Ready addresses, which its EndpointSlice lists (``reconcile.routing``);
    ``activator_grpc_port``: the gRPC port that EndpointSlice names (the service's own, see
    ``reconcile.grpcports``; else the activator's shared one); ``activator_peer``: the NetworkPolicy
    peer of the activator's pods (``None``: no activator)."""

    max_queue_delay_seconds: float
    replicas: int | None
    scrapers: tuple[Mapping[str, Any], ...] = ()
    default_deny: bool = False
    activator_addresses: tuple[str, ...] | None = None
    activator_grpc_port: int = ACTIVATOR_GRPC_PORT
    activator_peer: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class OwnedKind:
    """One owned kind: its API ``resource``, the kopf ``index`` (handler id) holding the current
    objects, the object's name for an InferenceService name (``name_of``), ``build`` (the
    desired object, or ``None`` when the InferenceService should not have one: then an existing one
    is deleted) and ``unwanted`` (why ``build`` gives ``None``, for the deletion's Event)."""

    resource: k8s.Resource
    index: str
    name_of: Callable[[str], str]
    build: Callable[[api.InferenceService, BuildInputs], dict[str, Any] | None]
    unwanted: str = ""

    @property
    def kind(self) -> str:
        """The resource's kind (``Deployment``)."""
        return self.resource.kind


def _same_name(name: str) -> str:
    return name


#: Why a pooled InferenceService has no object of a kind (the deletion's Event).
_POOLED = "served by a ModelPool"


def _own(
    build: Callable[[api.InferenceService, BuildInputs], dict[str, Any] | None],
) -> Callable[[api.InferenceService, BuildInputs], dict[str, Any] | None]:
    """``build`` for an InferenceService with pods of its own; nothing for a pooled one (``spec.pool``):
    the pool's Deployment and ConfigMap serve it (``builders.pool``), and its pods are the pool's."""
    return lambda isvc, inputs: None if isvc.spec.pool is not None else build(isvc, inputs)


OWNED: tuple[OwnedKind, ...] = (
    OwnedKind(
        k8s.CONFIGMAP,
        "kubeinfer_configmaps",
        api.configmap_name,
        _own(lambda isvc, inputs: build_configmap(isvc, inputs.max_queue_delay_seconds)),
        _POOLED,
    ),
    OwnedKind(
        k8s.SERVICE,
        "kubeinfer_services",
        _same_name,
        lambda isvc, inputs: build_service(isvc, selector=inputs.activator_addresses is None),
    ),
    OwnedKind(
        k8s.ENDPOINT_SLICE,
        "kubeinfer_endpointslices",
        activator_slice_name,
        lambda isvc, inputs: (
            None
            if inputs.activator_addresses is None
            else build_activator_endpointslice(isvc, inputs.activator_addresses, inputs.activator_grpc_port)
        ),
        "the Service routes to the pods",
    ),
    OwnedKind(
        k8s.DEPLOYMENT,
        "kubeinfer_deployments",
        _same_name,
        _own(lambda isvc, inputs: build_deployment(isvc, replicas=inputs.replicas)),
        _POOLED,
    ),
    OwnedKind(
        k8s.POD_DISRUPTION_BUDGET,
        "kubeinfer_pdbs",
        _same_name,
        _own(lambda isvc, _: build_pdb(isvc)),
        "one replica",
    ),
    OwnedKind(
        k8s.NETWORK_POLICY,
        "kubeinfer_networkpolicies",
        _same_name,
        _own(
            lambda isvc, inputs: build_networkpolicy(
                isvc, inputs.scrapers, inputs.default_deny, inputs.activator_peer
            )
        ),
        "spec.server.allowFrom unset",
    ),
)

#: The owned kinds by kind name.
BY_KIND: dict[str, OwnedKind] = {o.kind: o for o in OWNED}
#: Kind names, in apply order.
OWNED_KINDS: tuple[str, ...] = tuple(BY_KIND)
