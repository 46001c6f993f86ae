"""Where a replica's cold start went, from its pod: the ``ColdStart`` Event an InferenceService woken from
zero posts when its first replica turns Ready (``Serving`` turns true after a demand newer than the scale to
zero). Pure: no I/O, no clock.

The stages come from the timestamps the API server keeps on the pod (whole seconds): its creation, the
``PodScheduled``, ``PodReadyToStartContainers`` (the sandbox and its network, where the kubelet reports it),
``Initialized`` (the init containers done: the model's fetch) and ``Ready`` conditions, and the runtime
container's ``startedAt``. Each is given in seconds from the origin: the activator's demand (the moment the
first request was held; :data:`kubeinfer.contract.activator.DEMAND_ANNOTATION`) when it is known and not
after the pod's creation, else the pod's creation. What happens inside the container (the model's load and
warmup) is the runtime's ``kubeinfer_cold_start_stage_seconds``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator import conditions
from kubeinfer.operator.builders.deployment import CONTAINER_NAME
from kubeinfer.operator.reconcile.replicas import demand_is_newer
from kubeinfer.operator.rfc3339 import format_time, parse_time
from kubeinfer.operator.status import conditions_of

from kubeinfer.contract.activator import DEMAND_ANNOTATION

#: The pod conditions read, in the order a start passes them, and the words of each stage.
POD_STAGES = (
    ("PodScheduled", "scheduled"),
    ("PodReadyToStartContainers", "sandbox ready"),
    ("Initialized", "initialized"),
)


@dataclass(frozen=True)
class ColdStartStages:
    """One replica's start: ``pod`` (its name), ``origin`` (``demand`` or ``pod creation``) and its time
    (RFC 3339), and ``stages``: ``(words, seconds from the origin)`` in the order they happened, the pod's
    creation first when the origin is the demand, Ready last."""

    pod: str
    origin: str
    origin_time: str
    stages: tuple[tuple[str, float], ...]

    @property
    def ready_seconds(self) -> float:
        """Seconds from the origin to Ready (the last stage)."""
        return self.stages[-1][1]

    def message(self) -> str:
        """The Event's words: ``first replica Ready 9 s after the demand at T (pod P): pod created 1 s,
        scheduled 1 s, ..., Ready 9 s``."""
        parts = ", ".join(f"{words} {seconds:.0f} s" for words, seconds in self.stages)
        return (
            f"first replica Ready {self.ready_seconds:.0f} s after the {self.origin} at {self.origin_time} "
            f"(pod {self.pod}): {parts} (from the pod's timestamps, whole seconds)"
        )


def _true_since(conds: Mapping[str, Mapping[str, Any]], type_: str) -> dt.datetime | None:
    cond = conds.get(type_)
    if cond is None or cond.get("status") != "True":
        return None
    return parse_time(cond.get("lastTransitionTime"))


def pod_stages(pod: Mapping[str, Any], demand: str | None = None) -> ColdStartStages | None:
    """The stages of ``pod``'s start (see the module docstring), in seconds from ``demand`` (the demand
    annotation's RFC 3339 value) when it is given, readable and not after the pod's creation, else from
    the pod's creation. A stage the pod does not report (an older kubelet's sandbox condition) is left
    out. ``None`` when the pod is not Ready or has no creation time."""
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    conds = conditions_of(pod)
    ready = _true_since(conds, conditions.CONDITION_READY)
    if created is None or ready is None:
        return None
    asked = parse_time(demand)
    by_demand = asked is not None and asked <= created
    origin, origin_words = (asked, "demand") if asked is not None and by_demand else (created, "pod creation")
    moments: list[tuple[str, dt.datetime]] = []
    if origin_words == "demand":
        moments.append(("pod created", created))
    for type_, words in POD_STAGES:
        since = _true_since(conds, type_)
        if since is not None:
            moments.append((words, since))
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        started = parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        if cs.get("name") == CONTAINER_NAME and started is not None:
            moments.append(("container started", started))
    moments.append(("Ready", ready))
    return ColdStartStages(
        pod=str(meta.get("name", "")),
        origin=origin_words,
        origin_time=format_time(origin),
        stages=tuple((words, max(0.0, (at - origin).total_seconds())) for words, at in moments),
    )


def first_ready(pods: Sequence[Mapping[str, Any]], since: str | None) -> Mapping[str, Any] | None:
    """The pod that turned Ready first among ``pods`` created at or after ``since`` (the scale to zero,
    RFC 3339; ``None``: any), not being deleted; ``None`` when none is Ready."""
    after = parse_time(since)
    best: tuple[dt.datetime, str, Mapping[str, Any]] | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        created = parse_time(meta.get("creationTimestamp"))
        ready = _true_since(conditions_of(pod), conditions.CONDITION_READY)
        if ready is None or created is None or meta.get("deletionTimestamp"):
            continue
        if after is not None and created < after:
            continue
        key = (ready, str(meta.get("name", "")), pod)
        if best is None or key[:2] < best[:2]:
            best = key
    return None if best is None else best[2]


def woken_demand(body: Mapping[str, Any]) -> str | None:
    """The demand annotation of an InferenceService (``body`` as stored) when it is newer than its scale to
    zero (``status.scaledToZeroAt``): the service was woken from zero by it; else ``None``."""
    demand = ((body.get("metadata") or {}).get("annotations") or {}).get(DEMAND_ANNOTATION)
    since = (body.get("status") or {}).get("scaledToZeroAt")
    if not isinstance(demand, str) or not demand_is_newer(demand, since if isinstance(since, str) else None):
        return None
    return demand


def cold_start_due(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], body: Mapping[str, Any]
) -> bool:
    """Whether a status change from the conditions ``before`` to ``after`` is a woken service's first
    replica turning Ready: ``Serving`` turned true, and the InferenceService (``body``) carries a demand
    newer than its scale to zero (:func:`woken_demand`)."""

    def serving(conds: Sequence[Mapping[str, Any]]) -> bool:
        found = conditions_of({"status": {"conditions": list(conds)}}).get(conditions.CONDITION_SERVING) or {}
        return found.get("status") == "True"

    return not serving(before) and serving(after) and woken_demand(body) is not None
