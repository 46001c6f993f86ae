"""Pure planning logic of the reconciler: compare desired with current, compute status. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubeinfer.operator import api
from kubeinfer.operator.build.common import APPLIED_HASH_ANNOTATION, selector_string

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


def ready_state(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> ReadyState:
    """Readiness of an InferenceService, from what only the operator can see and the Deployment.

    Order: an apply/spec error; a missing PersistentVolumeClaim; the Deployment's ``ReplicaFailure``
    (True), ``Progressing`` (False, e.g. ProgressDeadlineExceeded); then, while the Deployment is not
    Available, a lasting pod problem (:func:`pod_problem`: bad image, crash loop, unschedulable);
    then ``Available`` (reason and message of the Deployment's condition carried over).
    """
    if error is not None:
        return ReadyState("False", "ReconcileFailed", error)
    if missing_pvcs:
        names = ", ".join(missing_pvcs)
        return ReadyState(
            "False",
            "PersistentVolumeClaimNotFound",
            f"PersistentVolumeClaim {names} not found in {namespace}",
        )
    if deployment is None:
        return ReadyState("False", "Creating", "waiting for the Deployment to be created")
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
    available = conds.get("Available")
    if (available is None or available.get("status") != "True") and pods:
        problem = pod_problem(pods)
        if problem is not None:
            return problem
    if available is None:
        return ReadyState("False", "Progressing", "waiting for the Deployment to report availability")
    status = "True" if available.get("status") == "True" else "False"
    reason = str(available.get("reason") or ("Available" if status == "True" else "Unavailable"))
    dstatus = deployment.get("status") or {}
    message = str(available.get("message") or "")
    if status == "True":
        message = f"{dstatus.get('readyReplicas', 0)}/{dstatus.get('replicas', 0)} replicas ready"
    return ReadyState(status, reason, message)  # type: ignore[arg-type]


def desired_status(
    isvc: api.InferenceService,
    deployment: Mapping[str, Any] | None,
    ready: ReadyState,
    current_status: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """The status fields the operator owns (camelCase), given the current status (for transitions).

    The Ready condition keeps its ``lastTransitionTime`` unless its status changes (``now``: RFC
    3339). Other condition types (the autoscaler's) are kept as they are. ``batchTimeout``: with
    autoscaling off the spec's maxQueueDelay; with it on, only filled in when the autoscaler has not
    set one yet (the value in force, so the printer column is never empty).
    """
    dstatus = (deployment or {}).get("status") or {}
    out: dict[str, Any] = {
        "observedGeneration": isvc.generation,
        "conditions": ready_conditions(current_status, ready, now, isvc.generation),
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": int(dstatus.get("readyReplicas") or 0),
        "selector": selector_string(isvc),
        "url": api.service_url(isvc.name, isvc.namespace),
    }
    if not isvc.spec.autoscaling.enabled or not current_status.get("batchTimeout"):
        out["batchTimeout"] = api.format_duration(
            isvc.spec.batch_timeout_in_force(current_status.get("batchTimeout"))
        )
    return out


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
