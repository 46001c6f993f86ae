"""How an InferenceService is doing: its pods' lasting problems, the Deployment's faults, and the
:class:`Health` the operator reports from them (Ready, Serving, Reconciling, Stalled). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.reconcile.rollout import Rollout, new_pods, rollout_of
from kubeinfer.operator.status import ConditionState, conditions_of

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


def pod_problem(pods: Sequence[Mapping[str, Any]]) -> ConditionState | None:
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
                return ConditionState("False", str(waiting["reason"]), message)
        for cond in status.get("conditions") or []:
            unschedulable = cond.get("reason") == "Unschedulable" and cond.get("status") == "False"
            if cond.get("type") == "PodScheduled" and unschedulable:
                message = f"pod {pod_name}: {cond.get('message', '')}"
                asks = scheduling_asks(pod)
                if asks:
                    message = f"{message} (the pod asks for {asks})"
                return ConditionState("False", "Unschedulable", message)
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


#: ``Serving=False`` while no pod is ready.
NOT_SERVING = ConditionState("False", "NoReadyReplicas", "no ready replica serves")


@dataclass(frozen=True)
class Health:
    """The conditions the operator derives (see README "Status and conditions").

    ``ready``: serving the current generation with every desired replica; ``serving``: at least one
    ready pod serves traffic (old or new version); ``reconciling``/``stalled``: kstatus's
    abnormal-true conditions, present only while true (``None`` = removed): a rollout (or creation)
    in flight, and a fault that will not resolve by itself; ``rollout``: the Deployment's counts.
    """

    ready: ConditionState
    serving: ConditionState = NOT_SERVING
    reconciling: ConditionState | None = None
    stalled: ConditionState | None = None
    rollout: Rollout | None = None


def serving_state(rollout: Rollout | None) -> ConditionState:
    """``Serving``: True while at least one pod is ready (the Service routes to it)."""
    if rollout is None or rollout.ready == 0:
        return NOT_SERVING
    return ConditionState(
        "True",
        "ReadyReplicas",
        f"{rollout.ready} ready replica(s) serve, {rollout.updated_ready} of the current version",
    )


def _deployment_fault(deployment: Mapping[str, Any]) -> ConditionState | None:
    """The Deployment's own failure conditions: ``ReplicaFailure`` True, ``Progressing`` False."""
    conds = conditions_of(deployment)
    failure = conds.get("ReplicaFailure")
    if failure is not None and failure.get("status") == "True":
        return ConditionState(
            "False", str(failure.get("reason") or "ReplicaFailure"), str(failure.get("message") or "")
        )
    progressing = conds.get("Progressing")
    if progressing is not None and progressing.get("status") == "False":
        return ConditionState(
            "False", str(progressing.get("reason") or "ProgressFailed"), str(progressing.get("message") or "")
        )
    return None


def _operator_fault(missing_pvcs: list[str], error: str | None, namespace: str) -> ConditionState | None:
    if error is not None:
        return ConditionState("False", "ReconcileFailed", error)
    if missing_pvcs:
        names = ", ".join(missing_pvcs)
        return ConditionState(
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
        creating = ConditionState("False", "Creating", "waiting for the Deployment to be created")
        return Health(creating, serving, reconciling=ConditionState("True", "Creating", creating.message))
    if fault is None and deployment is not None and rollout is not None:
        fault = _deployment_fault(deployment)
        if fault is None and not rollout.complete and pods:
            fault = pod_problem(new_pods(pods, rollout.new_hash))
    if fault is not None:
        return Health(
            fault, serving, stalled=ConditionState("True", fault.reason, fault.message), rollout=rollout
        )
    assert deployment is not None and rollout is not None
    if not rollout.complete:
        progressing = ConditionState("False", "Progressing", rollout.message())
        reconciling = ConditionState("True", "RolloutInProgress", rollout.message())
        return Health(progressing, serving, reconciling=reconciling, rollout=rollout)
    available = conditions_of(deployment).get("Available") or {}
    reason = str(available.get("reason") or "RolloutComplete")
    message = f"{rollout.summary()} replicas ready"
    return Health(ConditionState("True", reason, message), serving, rollout=rollout)


def ready_state(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> ConditionState:
    """The ``Ready`` condition alone (:func:`health`)."""
    return health(deployment, missing_pvcs=missing_pvcs, error=error, namespace=namespace, pods=pods).ready
