"""``build_networkpolicy``: who may connect to an InferenceService's pods (``spec.server.allowFrom``, and
the operator's default-deny setting)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import metadata, selector_labels, with_applied_hash

from kubeinfer.contract.activator import ACTIVATOR_COMPONENT, COMPONENT_LABEL

#: The label the API server puts on every namespace (Kubernetes >= 1.21): its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def scraper_peer(namespace: str, pod_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``NetworkPolicyPeer`` of a Prometheus running in ``namespace``: its pods labelled
    ``pod_labels`` (every pod of that namespace when empty)."""
    peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(sorted(pod_labels.items()))}
    return peer


def activator_peer(namespace: str) -> dict[str, Any]:
    """The ``NetworkPolicyPeer`` of the activator's pods: those labelled ``COMPONENT_LABEL:
    ACTIVATOR_COMPONENT`` in ``namespace`` (the namespace of the activator's Service)."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": {COMPONENT_LABEL: ACTIVATOR_COMPONENT}},
    }


def build_networkpolicy(
    isvc: api.InferenceService,
    scrapers: Sequence[Mapping[str, Any]] = (),
    default_deny: bool = False,
    activator: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """A ``networking.k8s.io/v1`` NetworkPolicy ``<isvc>`` selecting the runtime pods, or ``None`` when
    ``spec.server.allowFrom`` is unset and ``default_deny`` is off (no policy: every pod may connect).

    Ingress only (egress is left alone), from two kinds of peers:

    - ``spec.server.allowFrom``, in its order, to the REST port (8080) and the gRPC port
      (``spec.server.grpcPort``);
    - ``scrapers`` (the operator's Prometheus, see :func:`scraper_peer`) to the REST port only, where the
      runtime serves ``/metrics``, so that the autoscaler keeps its signals. The port also serves the
      v2 routes: ``spec.server.auth`` is what guards those against a scraper.

    - ``activator`` (the activator's pods, see :func:`activator_peer`; ``None``: no activator installed)
      to the REST and gRPC ports, where it forwards the requests it held or received while the
      Service pointed at it.

    ``default_deny`` (the operator's ``network_policy_default_deny`` setting) makes the policy exist
    without ``allowFrom`` too: then it admits the ``scrapers`` (and the ``activator``) only, and with
    none of them no pod at all. The kubelet's probes come from the node, which NetworkPolicy always
    admits.
    """
    server = isvc.spec.server
    if server.allow_from is None and not default_deny:
        return None
    rest = {"protocol": "TCP", "port": api.RUNTIME_PORT}
    grpc = {"protocol": "TCP", "port": server.grpc_port}
    ingress: list[dict[str, Any]] = []
    if server.allow_from is not None:
        ingress.append({"from": [peer.to_k8s() for peer in server.allow_from], "ports": [rest, grpc]})
    if scrapers:
        ingress.append({"from": [copy.deepcopy(dict(peer)) for peer in scrapers], "ports": [dict(rest)]})
    if activator is not None:
        ingress.append({"from": [copy.deepcopy(dict(activator))], "ports": [dict(rest), dict(grpc)]})
    obj: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, isvc.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(isvc)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
