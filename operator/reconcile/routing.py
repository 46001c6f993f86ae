"""Where an InferenceService's Service sends its requests: to the runtime pods (its selector), or to the
activator (no selector; the operator's EndpointSlice lists the activator's Ready addresses). Pure: no I/O.

The activator holds a request while no replica is Ready and forwards it once one is; a warm service has
no extra hop. So a service routes to the activator exactly while scale to zero is in force
(:func:`replicas.replica_floor` 0) and either

- its Deployment has no Ready replica (``status.readyReplicas`` 0 or absent): a service at zero, a new
  one, one woken by a demand whose pod is still starting; or
- a scale to zero is decided (``status.scaledToZeroAt`` newer than the activator's demand,
  :func:`replicas.demand_is_newer`) while the Deployment asks for at most one replica: the last replica
  drains, and a request arriving meanwhile must reach the activator, not a pod about to stop. The
  autoscaler has the reconciler apply this before it scales to 0 (``autoscale.loop``, ``on_zero``).

Otherwise it routes to its pods. One exception keeps a serving service reachable: while the activator
has no Ready address, a service with a Ready replica stays on its pods (the autoscaler then does not
take it to zero: nothing would hold its requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.reconcile.replicas import demand_is_newer, replica_floor

from kubeinfer.contract.activator import DEMAND_ANNOTATION


def ready_replicas(deployment: Mapping[str, Any] | None) -> int:
    """``status.readyReplicas`` of ``deployment`` (0 when absent, or no Deployment)."""
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)


def zero_decided(body: Mapping[str, Any]) -> bool:
    """Whether the InferenceService ``body`` (as stored) records a scale to zero that no demand of the
    activator followed: ``status.scaledToZeroAt`` set and the demand annotation absent or older
    (:func:`replicas.demand_is_newer`)."""
    since = (body.get("status") or {}).get("scaledToZeroAt")
    if not isinstance(since, str) or not since:
        return False
    demand = ((body.get("metadata") or {}).get("annotations") or {}).get(DEMAND_ANNOTATION)
    return not demand_is_newer(demand if isinstance(demand, str) else None, since)


def routes_to_activator(
    body: Mapping[str, Any],
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    *,
    activator: bool,
    activator_ready: bool = True,
) -> bool:
    """Whether the Service of ``isvc`` routes to the activator (see the module docstring).

    ``body``: the InferenceService as stored (its demand annotation and ``status.scaledToZeroAt``);
    ``deployment``: its Deployment as last seen (``None``: not created yet); ``activator``: the operator
    is told the activator is installed; ``activator_ready``: the activator has a Ready address."""
    if replica_floor(isvc, activator=activator) != 0:
        return False
    ready = ready_replicas(deployment)
    if ready > 0 and not activator_ready:
        return False
    if ready == 0:
        return True
    asked = int(((deployment or {}).get("spec") or {}).get("replicas", 1))
    return asked <= 1 and zero_decided(body)


def route_words(to_activator: bool) -> str:
    """Where the Service routes, in the words of the ScaleToZero condition's message."""
    return "the Service routes to the activator" if to_activator else "the Service routes to the pods"
