"""Pure planning logic of the reconciler: compare desired with current, compute status. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from kubeinfer.operator import api
from kubeinfer.operator.build.common import APPLIED_HASH_ANNOTATION, selector_string
from kubeinfer.runtime.config import CONFIG_FILE

Action = Literal["create", "update", "revert", "none"]


def _quantity_equal(a: str, b: str) -> bool:
    try:
        from kubernetes.utils.quantity import parse_quantity

        return bool(parse_quantity(a) == parse_quantity(b))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ImportError):
        return False


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def is_subset(desired: Any, current: Any) -> bool:
    """True when every field set in ``desired`` has the same value in ``current``.

    Fields the API server adds (defaults, status, other managers' fields) are ignored. Equal up to:
    a missing field equals an empty list/map/``None``; quantity strings compare by value (``"1000m"``
    == ``"1"``); list elements compare position by position (same length required).
    """
    if isinstance(desired, Mapping):
        if _empty(current) and not desired:
            return True
        if not isinstance(current, Mapping):
            return False
        return all(is_subset(v, current.get(k)) if k in current else _empty(v) for k, v in desired.items())
    if isinstance(desired, list):
        if _empty(current) and not desired:
            return True
        if not isinstance(current, list) or len(current) != len(desired):
            return False
        return all(is_subset(d, c) for d, c in zip(desired, current, strict=True))
    if desired == current:
        return True
    if isinstance(desired, str) and isinstance(current, str):
        return _quantity_equal(desired, current)
    return False


def applied_hash(obj: Mapping[str, Any] | None) -> str | None:
    """The :data:`APPLIED_HASH_ANNOTATION` of an object, or ``None``."""
    if not obj:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(APPLIED_HASH_ANNOTATION)
    return str(value) if value is not None else None


def plan_apply(desired: Mapping[str, Any], current: Mapping[str, Any] | None) -> Action:
    """What to do with one owned object.

    ``create`` when absent; ``update`` when the desired object changed since the last apply (its
    applied-hash differs); ``revert`` when someone edited a field the operator sets (drift); else
    ``none`` (no request at all).
    """
    if current is None:
        return "create"
    if applied_hash(desired) != applied_hash(current):
        return "update"
    if not is_subset(desired, current):
        return "revert"
    return "none"


def replicas_managers(deployment: Mapping[str, Any]) -> set[str]:
    """Field managers that own ``spec.replicas`` of a Deployment (from ``metadata.managedFields``)."""
    owners: set[str] = set()
    for entry in (deployment.get("metadata") or {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if "f:replicas" in (fields.get("f:spec") or {}):
            owners.add(str(entry.get("manager", "")))
    return owners


def desired_replicas(isvc: api.InferenceService, deployment: Mapping[str, Any] | None) -> int | None:
    """``spec.replicas`` for the applied Deployment, or ``None`` to leave it out.

    Autoscaling off: ``spec.replicas``. On: ``minReplicas`` when creating; afterwards the current
    value clamped to ``[minReplicas, maxReplicas]`` — left out (``None``) when another manager (the
    autoscaler, ``kubectl scale``) owns it and it is within bounds, so the operator never fights the
    autoscaler; included while the operator is its only owner (so it is not dropped to the default).
    """
    spec = isvc.spec
    if not spec.autoscaling.enabled:
        fixed: int = spec.replicas
        return fixed
    lo: int = spec.autoscaling.min_replicas
    hi: int = spec.autoscaling.max_replicas
    if deployment is None:
        return lo
    current = int((deployment.get("spec") or {}).get("replicas", 1))
    if current < lo or current > hi:
        return min(max(current, lo), hi)
    if replicas_managers(deployment) - {api.FIELD_MANAGER}:
        return None
    return current


@dataclass(frozen=True)
class ReadyState:
    """The Ready condition to report: status ``True``/``False``/``Unknown``, reason, message."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def conditions_of(obj: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """``status.conditions`` of an object by type."""
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in conds if isinstance(c, Mapping)}


#: Container waiting reasons that will not resolve by themselves (bad image, bad config, crash loop).
BAD_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


#: Characters kept of a crashed container's termination message (its end: the cause is usually last).
TERMINATION_MESSAGE_CHARS = 300


def last_termination(container_status: Mapping[str, Any]) -> str | None:
    """``last exit code N (Reason): <message tail>`` from ``lastState.terminated`` of a container status.

    The message is whitespace-trimmed and cut to its last :data:`TERMINATION_MESSAGE_CHARS`
    characters (prefixed ``...`` when cut); with ``terminationMessagePolicy: FallbackToLogsOnError``
    it is the tail of the crashed container's log. ``None`` when the container has not terminated
    before (or the record carries neither exit code nor message).
    """
    terminated = (container_status.get("lastState") or {}).get("terminated") or {}
    code = terminated.get("exitCode")
    text = str(terminated.get("message") or "").strip()
    if code is None and not text:
        return None
    if len(text) > TERMINATION_MESSAGE_CHARS:
        text = "..." + text[-TERMINATION_MESSAGE_CHARS:].lstrip()
    head = f"last exit code {code}" if code is not None else "last termination"
    if terminated.get("reason"):
        head += f" ({terminated['reason']})"
    return f"{head}: {text}" if text else head


def pod_problem(pods: Sequence[Mapping[str, Any]]) -> ReadyState | None:
    """The first lasting problem among an InferenceService's pods, as a ``Ready=False`` state.

    A container waiting with one of :data:`BAD_WAITING_REASONS` (its reason and message carried
    over, e.g. ``ImagePullBackOff``; when the container terminated before, as in
    ``CrashLoopBackOff``, its last exit code and termination message tail are appended, see
    :func:`last_termination`), or a pod the scheduler cannot place (``Unschedulable``, e.g. no node
    with the requested GPU). ``None`` when no pod shows such a problem.
    """
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        status = pod.get("status") or {}
        pod_name = (pod.get("metadata") or {}).get("name")
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BAD_WAITING_REASONS:
                detail = waiting.get("message") or waiting["reason"]
                message = f"pod {pod_name} container {cs.get('name')}: {detail}"
                crash = last_termination(cs)
                if crash is not None:
                    message = f"{message}; {crash}"
                return ReadyState("False", str(waiting["reason"]), message)
        for cond in status.get("conditions") or []:
            unschedulable = cond.get("reason") == "Unschedulable" and cond.get("status") == "False"
            if cond.get("type") == "PodScheduled" and unschedulable:
                message = f"pod {pod_name}: {cond.get('message', '')}"
                asks = scheduling_asks(pod)
                if asks:
                    message = f"{message} (the pod asks for {asks})"
                return ReadyState("False", "Unschedulable", message)
    return None


#: Resources every node has: not worth naming when a pod cannot be placed.
COMMON_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def scheduling_asks(pod: Mapping[str, Any]) -> str:
    """What a pod asks of a node beyond CPU and memory, for an ``Unschedulable`` message:
    extended resources its containers request (``nvidia.com/gpu: 1``) and its nodeSelector
    (``nvidia.com/gpu.product=...``). The scheduler names only the first filter a node fails
    ("didn't match Pod's node affinity/selector"), not the GPU it would have failed next.
    "" when there is nothing beyond CPU and memory.
    """
    spec = pod.get("spec") or {}
    extended: dict[str, str] = {}
    for c in spec.get("containers") or []:
        for res, qty in ((c.get("resources") or {}).get("requests") or {}).items():
            if res not in COMMON_RESOURCES:
                extended[str(res)] = str(qty)
    parts = [f"{r}: {q}" for r, q in sorted(extended.items())]
    selector = spec.get("nodeSelector") or {}
    if selector:
        parts.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in sorted(selector.items())))
    return "; ".join(parts)


#: Annotation of a Deployment and of its ReplicaSets: the rollout revision (the new ReplicaSet has the
#: Deployment's).
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
#: Label of a ReplicaSet's pods: the hash of the pod template it runs.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"


@dataclass(frozen=True)
class Rollout:
    """Where a Deployment's rollout stands, in the Deployment's own counts.

    ``desired``: ``spec.replicas``; ``replicas``: pods of every ReplicaSet (old and surge ones
    included, as ``status.replicas``); ``updated``: pods of the current template; ``ready``: ready
    pods (any template); ``available``: ready for ``minReadySeconds``; ``updated_ready``: ready pods
    of the current template (the new ReplicaSet's ``readyReplicas``; without it, derived: all ready
    pods when no old pod is left, else the ready pods beyond the old ones, a lower bound);
    ``observed``: the Deployment controller has seen the current template (``observedGeneration``);
    ``new_hash``: the new ReplicaSet's ``pod-template-hash`` (``None`` if unknown).
    """

    desired: int
    replicas: int = 0
    updated: int = 0
    ready: int = 0
    available: int = 0
    updated_ready: int = 0
    observed: bool = False
    new_hash: str | None = None

    @property
    def complete(self) -> bool:
        """Serving the current template with every desired replica and nothing else: observed,
        ``updated == replicas == available == desired`` and every updated pod ready."""
        counts = (self.updated, self.replicas, self.available, self.updated_ready)
        return self.observed and all(c == self.desired for c in counts)

    def summary(self) -> str:
        """``updated-ready/desired``, e.g. ``1/2`` (the Replicas printer column)."""
        return f"{self.updated_ready}/{self.desired}"

    def message(self) -> str:
        """The counts in words: ``1/2 replicas updated and ready (2 updated, 2 ready, 3 pods)``."""
        text = (
            f"{self.summary()} replicas updated and ready "
            f"({self.updated} updated, {self.ready} ready, {self.replicas} pods)"
        )
        return (
            text if self.observed else f"{text}; the Deployment controller has not seen the new template yet"
        )


def _int(mapping: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = mapping.get(key)
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default


def new_replicaset(
    deployment: Mapping[str, Any], replicasets: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The Deployment's new ReplicaSet among ``replicasets``: the one with its revision annotation."""
    revision = ((deployment.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    if revision is None:
        return None
    for rs in replicasets:
        if ((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION) == revision:
            return rs
    return None


def rollout_of(
    deployment: Mapping[str, Any], replicasets: Sequence[Mapping[str, Any]] | None = None
) -> Rollout:
    """The :class:`Rollout` of ``deployment`` (as stored); ``replicasets``: its ReplicaSets when
    listed (for ``updated_ready`` and ``new_hash``)."""
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    meta = deployment.get("metadata") or {}
    replicas, updated, ready = (
        _int(status, "replicas"),
        _int(status, "updatedReplicas"),
        _int(status, "readyReplicas"),
    )
    updated_ready = min(ready, updated) if replicas <= updated else max(0, ready - (replicas - updated))
    new_rs = new_replicaset(deployment, replicasets or [])
    new_hash: str | None = None
    if new_rs is not None:
        updated_ready = _int(new_rs.get("status") or {}, "readyReplicas")
        new_hash = ((new_rs.get("metadata") or {}).get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL)
    return Rollout(
        desired=_int(spec, "replicas", 1),
        replicas=replicas,
        updated=updated,
        ready=ready,
        available=_int(status, "availableReplicas"),
        updated_ready=updated_ready,
        observed=_int(status, "observedGeneration") >= _int(meta, "generation"),
        new_hash=new_hash,
    )


def _new_pods(pods: Sequence[Mapping[str, Any]], new_hash: str | None) -> list[Mapping[str, Any]]:
    """The pods of the new ReplicaSet (all pods when it is not known)."""
    if new_hash is None:
        return list(pods)
    return [
        p
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == new_hash
    ]


@dataclass(frozen=True)
class Health:
    """The conditions the operator derives (see README "Status and conditions").

    ``ready``: serving the current generation with every desired replica; ``serving``: at least one
    ready pod serves traffic (old or new version); ``reconciling``/``stalled``: kstatus's
    abnormal-true conditions, present only while true (``None`` = removed): a rollout (or creation)
    in flight, and a fault that will not resolve by itself; ``rollout``: the Deployment's counts.
    """

    ready: ReadyState
    serving: ReadyState = ReadyState("False", "NoReadyReplicas", "no ready replica serves")
    reconciling: ReadyState | None = None
    stalled: ReadyState | None = None
    rollout: Rollout | None = None


def serving_state(rollout: Rollout | None) -> ReadyState:
    """``Serving``: True while at least one pod is ready (the Service routes to it)."""
    if rollout is None or rollout.ready == 0:
        return ReadyState("False", "NoReadyReplicas", "no ready replica serves")
    return ReadyState(
        "True",
        "ReadyReplicas",
        f"{rollout.ready} ready replica(s) serve, {rollout.updated_ready} of the current version",
    )


def _deployment_fault(deployment: Mapping[str, Any]) -> ReadyState | None:
    """The Deployment's own failure conditions: ``ReplicaFailure`` True, ``Progressing`` False."""
    conds = conditions_of(deployment)
    failure = conds.get("ReplicaFailure")
    if failure is not None and failure.get("status") == "True":
        return ReadyState(
            "False", str(failure.get("reason") or "ReplicaFailure"), str(failure.get("message") or "")
        )
    progressing = conds.get("Progressing")
    if progressing is not None and progressing.get("status") == "False":
        return ReadyState(
            "False", str(progressing.get("reason") or "ProgressFailed"), str(progressing.get("message") or "")
        )
    return None


def _operator_fault(missing_pvcs: list[str], error: str | None, namespace: str) -> ReadyState | None:
    if error is not None:
        return ReadyState("False", "ReconcileFailed", error)
    if missing_pvcs:
        names = ", ".join(missing_pvcs)
        return ReadyState(
            "False",
            "PersistentVolumeClaimNotFound",
            f"PersistentVolumeClaim {names} not found in {namespace}",
        )
    return None


def health(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
    replicasets: Sequence[Mapping[str, Any]] | None = None,
) -> Health:
    """The conditions of an InferenceService, from what only the operator can see and the Deployment.

    Faults first (``Ready=False`` with their reason, ``Stalled=True``): an apply error; a missing
    PersistentVolumeClaim; the Deployment's ``ReplicaFailure`` (True) or ``Progressing`` (False,
    e.g. ProgressDeadlineExceeded); while the rollout is not complete, a lasting problem of the new
    ReplicaSet's pods (:func:`pod_problem`: bad image, crash loop, unschedulable). Else, while the
    rollout is not complete (:attr:`Rollout.complete`), ``Ready=False Progressing`` and
    ``Reconciling=True`` with the counts; else ``Ready=True`` (the reason of the Deployment's
    ``Available`` condition carried over). ``Serving`` follows the ready pods in every case.
    """
    rollout = rollout_of(deployment, replicasets) if deployment is not None else None
    serving = serving_state(rollout)
    fault = _operator_fault(missing_pvcs, error, namespace)
    if fault is None and deployment is None:
        creating = ReadyState("False", "Creating", "waiting for the Deployment to be created")
        return Health(creating, serving, reconciling=ReadyState("True", "Creating", creating.message))
    if fault is None and deployment is not None and rollout is not None:
        fault = _deployment_fault(deployment)
        if fault is None and not rollout.complete and pods:
            fault = pod_problem(_new_pods(pods, rollout.new_hash))
    if fault is not None:
        return Health(
            fault, serving, stalled=ReadyState("True", fault.reason, fault.message), rollout=rollout
        )
    assert deployment is not None and rollout is not None
    if not rollout.complete:
        progressing = ReadyState("False", "Progressing", rollout.message())
        reconciling = ReadyState("True", "RolloutInProgress", rollout.message())
        return Health(progressing, serving, reconciling=reconciling, rollout=rollout)
    available = conditions_of(deployment).get("Available") or {}
    reason = str(available.get("reason") or "RolloutComplete")
    message = f"{rollout.summary()} replicas ready"
    return Health(ReadyState("True", reason, message), serving, rollout=rollout)


def ready_state(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> ReadyState:
    """The ``Ready`` condition alone (:func:`health`)."""
    return health(deployment, missing_pvcs=missing_pvcs, error=error, namespace=namespace, pods=pods).ready


def conditions_for(
    current_status: Mapping[str, Any], state: Health, now: str, generation: int, *, autoscaling: bool
) -> list[dict[str, Any]]:
    """``status.conditions``: Ready (first), Serving, Reconciling and Stalled (removed when false)
    set from ``state``; AutoscalingActive (the autoscaler's) kept while autoscaling is on, removed when
    it is off; every condition the operator sets carries ``generation``."""
    conds = ready_conditions(current_status, state.ready, now, generation)
    s = state.serving
    conds = api.set_condition(conds, api.CONDITION_SERVING, s.status, s.reason, s.message, now, generation)
    for type_, value in (
        (api.CONDITION_RECONCILING, state.reconciling),
        (api.CONDITION_STALLED, state.stalled),
    ):
        if value is None:
            conds = api.remove_condition(conds, type_)
        else:
            conds = api.set_condition(
                conds, type_, value.status, value.reason, value.message, now, generation
            )
    if not autoscaling:
        conds = api.remove_condition(conds, api.CONDITION_AUTOSCALING_ACTIVE)
    return conds


def fault_conditions(
    current_status: Mapping[str, Any], ready: ReadyState, now: str, generation: int
) -> list[dict[str, Any]]:
    """``status.conditions`` for a fault found before the Deployment is looked at (an invalid spec):
    Ready and ``Stalled=True`` with its reason, Reconciling removed, the other types kept."""
    conds = ready_conditions(current_status, ready, now, generation)
    conds = api.remove_condition(conds, api.CONDITION_RECONCILING)
    return api.set_condition(
        conds, api.CONDITION_STALLED, "True", ready.reason, ready.message, now, generation
    )


def desired_status(
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    state: Health,
    current_status: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """The status fields the operator owns (camelCase), given the current status (for transitions).

    Conditions from :func:`conditions_for` (``now``: RFC 3339; a condition keeps its
    ``lastTransitionTime`` unless its status changes). Counts mirror the Deployment's
    (``replicas`` counts old and surge pods too; ``updatedReplicas``, ``readyReplicas``);
    ``updatedReady`` is ``updated-ready/desired`` (the Replicas printer column). ``batchTimeout``:
    with autoscaling off the spec's maxQueueDelay; with it on, only filled in when the autoscaler has
    not set one yet (the value in force, so the printer column is never empty). With autoscaling off,
    the autoscaler's ``observed`` is removed (``None`` in a merge patch deletes the field).
    """
    dstatus = (deployment or {}).get("status") or {}
    autoscaling = isvc.spec.autoscaling.enabled
    rollout = state.rollout or Rollout(desired=plan_desired(isvc))
    out: dict[str, Any] = {
        "observedGeneration": isvc.generation,
        "conditions": conditions_for(current_status, state, now, isvc.generation, autoscaling=autoscaling),
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": int(dstatus.get("readyReplicas") or 0),
        "updatedReplicas": int(dstatus.get("updatedReplicas") or 0),
        "updatedReady": rollout.summary(),
        "selector": selector_string(isvc),
        "url": api.service_url(isvc.name, isvc.namespace),
    }
    if not autoscaling:
        out["observed"] = None
    if not autoscaling or not current_status.get("batchTimeout"):
        out["batchTimeout"] = api.format_duration(
            isvc.spec.batch_timeout_in_force(current_status.get("batchTimeout"))
        )
    return out


def plan_desired(isvc: api.InferenceService) -> int:
    """Replicas the InferenceService asks for before its Deployment exists."""
    spec = isvc.spec
    return spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas


#: Ready=False reasons of a healthy start-up or rollout: no Event (the rollout's own Events say it).
EXPECTED_NOT_READY_REASONS = frozenset({"Creating", "Progressing"})

#: An Event to post: ``(type, reason, message)``; type ``Normal`` or ``Warning``.
Event = tuple[str, str, str]


def _batch_timeout_of(configmap: Mapping[str, Any] | None) -> float | None:
    """``batching.max_queue_delay_seconds`` of a runtime ConfigMap (``None`` if absent or unreadable)."""
    text = ((configmap or {}).get("data") or {}).get(CONFIG_FILE)
    try:
        value = (yaml.safe_load(text or "") or {}).get("batching", {}).get("max_queue_delay_seconds")
        return float(value) if value is not None else None
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        return None


def update_events(
    desired: Mapping[str, Any], current: Mapping[str, Any] | None, isvc: api.InferenceService
) -> list[Event]:
    """Normal Events for an update of an owned object from ``current`` to ``desired``: a Deployment
    whose pod template changes ``RolloutStarted``; one whose replicas alone change ``Scaled``
    (``spec.replicas`` with autoscaling off or clamped into its bounds; the autoscaler posts its own
    ``Autoscaled``); a ConfigMap whose batch timeout changes, with autoscaling off,
    ``BatchTimeoutChanged`` (the runtime reloads it without a restart)."""
    if current is None:
        return []
    if desired.get("kind") == "Deployment":
        want, have = desired.get("spec") or {}, current.get("spec") or {}
        if not is_subset(want.get("template") or {}, have.get("template") or {}):
            return [
                ("Normal", "RolloutStarted", f"rolling out a new pod template (generation {isvc.generation})")
            ]
        if "replicas" in want and want["replicas"] != have.get("replicas"):
            return [("Normal", "Scaled", f"replicas {have.get('replicas')} → {want['replicas']}")]
    if desired.get("kind") == "ConfigMap" and not isvc.spec.autoscaling.enabled:
        old, new = _batch_timeout_of(current), _batch_timeout_of(desired)
        if old is not None and new is not None and old != new:
            message = f"batch timeout {api.format_duration(old)} → {api.format_duration(new)}"
            return [("Normal", "BatchTimeoutChanged", message)]
    return []


def transition_events(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[Event]:
    """The Events for the change of ``status.conditions`` from ``before`` to ``after``.

    Normal for expected transitions: ``RolloutFinished`` when Ready turns true as a rollout
    (Reconciling) ends, else the Ready reason when Ready turns true (e.g. a fault cleared); the
    start of a rollout or a scale is the apply's Event (:func:`update_events`). Warning only for
    faults: Ready turning false, or changing reason while false, with a reason not in
    :data:`EXPECTED_NOT_READY_REASONS`. Nothing when the conditions did not change in status or
    reason (a new message alone, e.g. new counts).
    """
    old, new = (
        conditions_of({"status": {"conditions": before}}),
        conditions_of({"status": {"conditions": after}}),
    )

    def key(conds: Mapping[str, Mapping[str, Any]], type_: str) -> tuple[str, str]:
        c = conds.get(type_) or {}
        return str(c.get("status", "")), str(c.get("reason", ""))

    events: list[Event] = []
    rec_before, rec_after = key(old, api.CONDITION_RECONCILING)[0], key(new, api.CONDITION_RECONCILING)[0]
    ready = new.get(api.CONDITION_READY)
    if ready is None or key(old, api.CONDITION_READY) == key(new, api.CONDITION_READY):
        return events
    status, reason, message = (
        str(ready.get("status")),
        str(ready.get("reason")),
        str(ready.get("message", "")),
    )
    if status == "True":
        finished = rec_before == "True" and rec_after != "True"
        events.append(("Normal", "RolloutFinished" if finished else reason, f"Ready=True: {message}"))
    elif reason not in EXPECTED_NOT_READY_REASONS:
        events.append(("Warning", reason, f"Ready={status}: {message}"))
    return events


def status_patch(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch of ``status``: the desired fields whose value differs (empty = no write)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


#: Reason of ``Ready=False`` while the API server keeps failing the operator's requests.
API_SERVER_ERROR_REASON = "ApiServerError"
#: Consecutive failed reconciles (transient API errors: 5xx, 429, conflicts, network) of one
#: InferenceService before ``Ready=False ApiServerError`` is written (3 × the 5 s retry ≈ 15–35 s:
#: long enough to ride out an API server restart, short enough for a user to see the cause).
API_ERROR_THRESHOLD = 3
#: Upper bound of the retry back-off, seconds.
RETRY_DELAY_MAX_SECONDS = 60.0


def retry_delay(
    failures: int, *, base: float, cap: float = RETRY_DELAY_MAX_SECONDS, retry_after: float = 0.0
) -> float:
    """Seconds to wait before retrying after the ``failures``-th consecutive failure (≥ 1).

    Exponential back-off ``base · 2^(failures-1)`` capped at ``cap``, never less than the server's
    ``Retry-After`` (``retry_after`` seconds). E.g. base 5 s: 5, 10, 20, 40, 60, 60, … s.
    """
    exponent = min(max(failures, 1) - 1, 30)
    return max(retry_after, min(cap, base * 2.0**exponent))


def api_error_state(
    current_status: Mapping[str, Any], failures: int, error: str, *, threshold: int = API_ERROR_THRESHOLD
) -> ReadyState | None:
    """The ``Ready=False ApiServerError`` state to write after a failed reconcile, or ``None``.

    ``failures``: consecutive failed reconciles of this InferenceService, this one included;
    ``error``: the API error's message (cut to 1000 characters). ``None`` (write nothing) below
    ``threshold`` and when the current Ready condition already has reason ``ApiServerError``: the
    condition is written once, on the transition (status is patched only on change); the next
    successful reconcile replaces it with the state computed from the owned objects.
    """
    if failures < threshold:
        return None
    ready = conditions_of({"status": current_status}).get(api.CONDITION_READY)
    if (
        ready is not None
        and ready.get("status") == "False"
        and ready.get("reason") == API_SERVER_ERROR_REASON
    ):
        return None
    message = f"{failures} consecutive reconciles failed; retrying with back-off: {error[:1000]}"
    return ReadyState("False", API_SERVER_ERROR_REASON, message)


def ready_conditions(
    current_status: Mapping[str, Any], ready: ReadyState, now: str, generation: int
) -> list[dict[str, Any]]:
    """``status.conditions`` with the Ready condition set to ``ready`` (first), the other types kept
    as they are (:func:`api.set_condition`: ``lastTransitionTime``, ``now`` when it changes, is kept
    unless the status changes)."""
    conds = [c for c in current_status.get("conditions") or [] if isinstance(c, Mapping)]
    out = api.set_condition(
        conds, api.CONDITION_READY, ready.status, ready.reason, ready.message, now, generation
    )
    return sorted(out, key=lambda c: c.get("type") != api.CONDITION_READY)
