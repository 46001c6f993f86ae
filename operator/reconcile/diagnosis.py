"""How an InferenceService is doing: its pods' lasting problems, the Deployment's faults, and the
:class:`Health` the operator reports from them (Ready, Serving, Reconciling, Stalled). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator import conditions
from kubeinfer.operator.builders.source import FETCH_CONTAINER, FETCH_CONTAINERS
from kubeinfer.operator.reconcile.rollout import Rollout, new_pods, rollout_of
from kubeinfer.operator.rfc3339 import parse_time
from kubeinfer.operator.status import ConditionState, conditions_of

#: Waiting reasons of an image that cannot be pulled (the kubelet's image manager). ErrImagePull and
#: ImagePullBackOff alternate while a pull keeps failing: all are reported as
#: :data:`conditions.IMAGE_PULL_BACK_OFF`, so the reason stays put while the fault lasts.
IMAGE_PULL_REASONS = frozenset(
    {
        "ErrImagePull",
        conditions.IMAGE_PULL_BACK_OFF,
        "RegistryUnavailable",
        "SignatureValidationFailed",
        "ErrImageNeverPull",
    }
)
#: Container waiting reasons that will not resolve by themselves (bad image, bad config, crash loop):
#: the image pull's, and those carried over as the Ready reason (:data:`conditions.KUBELET_WAITING_REASONS`).
BAD_WAITING_REASONS = IMAGE_PULL_REASONS | conditions.KUBELET_WAITING_REASONS
#: How the runtime's termination message of a model that does not load starts (runtime/server.py).
MODEL_LOAD_PREFIX = "model load failed"
#: Characters kept of a termination message or a kubelet message (its start: our one-line messages name
#: the cause first).
TERMINATION_MESSAGE_CHARS = 500


def one_line(text: str, limit: int = TERMINATION_MESSAGE_CHARS) -> str:
    """``text`` on one line (whitespace runs, newlines included, become one space; other control
    characters dropped), cut to ``limit`` characters (``...`` appended when cut)."""
    printable = "".join(c for c in str(text) if c.isprintable() or c.isspace())
    line = " ".join(printable.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def _spec_container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == name:
            found: Mapping[str, Any] = c
            return found
    return {}


def termination_text(pod: Mapping[str, Any], container: str, terminated: Mapping[str, Any]) -> str:
    """The termination message of ``container`` (one line, bounded, :func:`one_line`), ``""`` when there
    is none, or when the container's ``terminationMessagePolicy`` is not ``File`` (a pod of an older
    operator: ``FallbackToLogsOnError`` makes the message a log tail, which never goes into status or
    Events)."""
    policy = _spec_container(pod, container).get("terminationMessagePolicy")
    if policy not in (None, "File"):
        return ""
    return one_line(str(terminated.get("message") or ""))


def failed_termination(cs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's failed termination that still explains its state: ``state.terminated`` with a
    non-zero exit code; else, while the container is not ready and not terminated (in its back-off,
    created again, or briefly running again after a crash), ``lastState.terminated`` with a non-zero
    exit code. ``None`` when it has not failed, or is ready (a crash long ago is no lasting fault)."""
    state = cs.get("state") or {}
    current = state.get("terminated")
    if current is not None:
        return current if current.get("exitCode") not in (0, None) else None
    if cs.get("ready"):
        return None
    last = (cs.get("lastState") or {}).get("terminated")
    if last is not None and last.get("exitCode") not in (0, None):
        found: Mapping[str, Any] = last
        return found
    return None


def _memory_limit(pod: Mapping[str, Any], container: str) -> str:
    limits = (_spec_container(pod, container).get("resources") or {}).get("limits") or {}
    return f" (memory limit {limits['memory']})" if limits.get("memory") else ""


def _crash_state(
    pod: Mapping[str, Any], where: str, name: str, terminated: Mapping[str, Any]
) -> ConditionState:
    """The Ready=False state of a container that exited with an error: OOMKilled; a fetch init container's
    ModelFetchFailed; the runtime's ModelLoadFailed (its termination message says so), or
    QuantizationBelowGate when the load failed on the quality gate; else
    CrashLoopBackOff. The message names the pod and container, the exit code and the container's own
    one-line termination message; it stays the same through the restarts (no back-off time, no count)."""
    code = terminated.get("exitCode")
    text = termination_text(pod, name, terminated)
    if terminated.get("reason") == conditions.OOM_KILLED:  # the kubelet's word, reported as it is
        return ConditionState(
            "False",
            conditions.OOM_KILLED,
            f"{where}: killed for memory, exit code {code}{_memory_limit(pod, name)}"
            + (f": {text}" if text else ""),
        )
    if name in FETCH_CONTAINERS:
        return ConditionState(
            "False", conditions.MODEL_FETCH_FAILED, f"{where}: {text or f'fetch failed, exit code {code}'}"
        )
    detail = f"exit code {code}" + (f" ({terminated['reason']})" if terminated.get("reason") else "")
    reason = conditions.CRASH_LOOP_BACK_OFF
    if text.startswith(MODEL_LOAD_PREFIX):
        # the runtime's error type of a model under its quality gate bears the reason's name, and its
        # termination message names the type: "model load failed: QuantizationBelowGate: ..."
        below = text.startswith(f"{MODEL_LOAD_PREFIX}: {conditions.QUANTIZATION_BELOW_GATE}:")
        reason = conditions.QUANTIZATION_BELOW_GATE if below else conditions.MODEL_LOAD_FAILED
    return ConditionState("False", reason, f"{where}: {detail}" + (f": {text}" if text else ""))


def names_image(message: str, reference: str) -> bool:
    """Whether a kubelet message is about the image ``reference`` (``registry/repo:tag`` or
    ``@sha256:...``): it quotes the reference, or its repository followed by a tag or digest."""
    repository = reference.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return reference in message or f"{repository}:" in message or f"{repository}@" in message


def container_problem(
    pod: Mapping[str, Any], cs: Mapping[str, Any], *, init: bool, model_image: str | None = None
) -> ConditionState | None:
    """The lasting problem of one container of ``pod`` (``cs``: its status), ``None`` when it has none.

    - waiting to pull an image: ``ModelFetchFailed`` when the kubelet's message names the OCI model
      image ``model_image`` (an image volume that cannot be pulled is reported on the container that
      mounts it), else ``ImagePullBackOff``;
    - a fetch init container that cannot start (``CreateContainerConfigError``: a missing Secret or
      key of ``spec.model.credentials``): ``ModelFetchFailed`` with the kubelet's message;
    - a container that exited with an error, also while it waits in its back-off or runs again after the
      crash (:func:`failed_termination`): :func:`_crash_state`;
    - any other waiting reason in :data:`BAD_WAITING_REASONS` carried over with its message.
    """
    name = str(cs.get("name"))
    pod_name = (pod.get("metadata") or {}).get("name")
    where = f"pod {pod_name} {'init container' if init else 'container'} {name}"
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason, message = str(waiting.get("reason") or ""), one_line(str(waiting.get("message") or ""))
    if reason in IMAGE_PULL_REASONS:
        if model_image is not None and names_image(message, model_image):
            return ConditionState(
                "False",
                conditions.MODEL_FETCH_FAILED,
                f"{where}: model image {model_image}: {message or reason}",
            )
        return ConditionState("False", conditions.IMAGE_PULL_BACK_OFF, f"{where}: {message or reason}")
    if reason == conditions.CREATE_CONTAINER_CONFIG_ERROR and name in FETCH_CONTAINERS:
        return ConditionState("False", conditions.MODEL_FETCH_FAILED, f"{where}: {message or reason}")
    terminated = failed_termination(cs)
    if terminated is not None:
        return _crash_state(pod, where, name, terminated)
    if reason in BAD_WAITING_REASONS:
        return ConditionState("False", reason, f"{where}: {message or reason}")
    return None


def _unschedulable(pod: Mapping[str, Any]) -> ConditionState | None:
    pod_name = (pod.get("metadata") or {}).get("name")
    for cond in (pod.get("status") or {}).get("conditions") or []:
        # the scheduler's reason, reported as it is
        unschedulable = cond.get("reason") == conditions.UNSCHEDULABLE and cond.get("status") == "False"
        if cond.get("type") == conditions.POD_SCHEDULED and unschedulable:
            message = f"pod {pod_name}: {cond.get('message', '')}"
            asks = scheduling_asks(pod)
            if asks:
                message = f"{message} (the pod asks for {asks})"
            return ConditionState("False", conditions.UNSCHEDULABLE, message)
    return None


def pod_problem(pods: Sequence[Mapping[str, Any]], model_image: str | None = None) -> ConditionState | None:
    """The first lasting problem among an InferenceService's pods (by pod name), as a ``Ready=False``
    state: of its init containers first (they run first: a fetch that fails keeps the runtime from
    starting), then of its containers (:func:`container_problem`), or a pod the scheduler cannot place
    (``Unschedulable``, e.g. no node with the requested GPU). ``model_image``: the OCI model image
    (``oci://`` sources), whose pull failures are the model's fetch failures. ``None`` when no pod
    shows such a problem.

    The reason and message depend on the fault, not on where the container is in its restart cycle
    (just crashed, in its back-off, running again): they stay put while the fault lasts, and so does
    ``Stalled``.
    """
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        status = pod.get("status") or {}
        for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
            for cs in status.get(key) or []:
                problem = container_problem(pod, cs, init=init, model_image=model_image)
                if problem is not None:
                    return problem
        unschedulable = _unschedulable(pod)
        if unschedulable is not None:
            return unschedulable
    return None


def fetch_note(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """What the model's fetch took, for the Ready Event: ``model fetched in 4 s (pod P): <the fetch
    container's one-line message>``, from the first pod (by name) whose ``fetch`` init container
    finished with exit code 0 (seconds: its ``startedAt`` to ``finishedAt``). ``None`` when none did."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            done = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") != FETCH_CONTAINER or done.get("exitCode") != 0:
                continue
            started, finished = parse_time(done.get("startedAt")), parse_time(done.get("finishedAt"))
            took = f" in {(finished - started).total_seconds():.0f} s" if started and finished else ""
            text = termination_text(pod, FETCH_CONTAINER, done)
            name = (pod.get("metadata") or {}).get("name")
            return f"model fetched{took} (pod {name})" + (f": {text}" if text else "")
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


def stalled_state(ready: ConditionState) -> ConditionState | None:
    """``Stalled=True`` with the reason and message of ``ready`` when it is ``False`` with a reason that
    stalls (:func:`conditions.sets_stalled`: a fault that will not resolve by itself, not a step of a
    healthy start-up or rollout); ``None`` (no Stalled condition) otherwise."""
    if ready.status != "False" or not conditions.sets_stalled(ready.reason):
        return None
    return ConditionState("True", ready.reason, ready.message)


#: ``Serving=False`` while no pod is ready.
NOT_SERVING = ConditionState("False", conditions.NO_READY_REPLICAS, "no ready replica serves")


@dataclass(frozen=True)
class Health:
    """The conditions the operator derives (see README "Status and conditions").

    ``ready``: serving the current generation with every desired replica; ``serving``: at least one
    ready pod serves traffic (old or new version); ``reconciling``/``stalled``: kstatus's
    abnormal-true conditions, present only while true (``None`` = removed): a rollout (or creation)
    in flight, and a fault that will not resolve by itself; ``rollout``: the Deployment's counts;
    ``note``: words for the Event of Ready turning true (what the model's fetch took,
    :func:`fetch_note`), never part of a condition (so a resync that does not list pods keeps the
    conditions as they are).
    """

    ready: ConditionState
    serving: ConditionState = NOT_SERVING
    reconciling: ConditionState | None = None
    stalled: ConditionState | None = None
    rollout: Rollout | None = None
    note: str | None = None


def serving_state(rollout: Rollout | None) -> ConditionState:
    """``Serving``: True while at least one pod is ready (the Service routes to it)."""
    if rollout is None or rollout.ready == 0:
        return NOT_SERVING
    return ConditionState(
        "True",
        conditions.READY_REPLICAS,
        f"{rollout.ready} ready replica(s) serve, {rollout.updated_ready} of the current version",
    )


def _replica_failure(deployment: Mapping[str, Any]) -> ConditionState | None:
    """The Deployment's ``ReplicaFailure`` True (pods cannot be created: quota, admission)."""
    failure = conditions_of(deployment).get(conditions.DEPLOYMENT_REPLICA_FAILURE)
    if failure is not None and failure.get("status") == "True":
        return ConditionState(
            "False",
            str(failure.get("reason") or conditions.REPLICA_FAILURE),
            str(failure.get("message") or ""),
        )
    return None


def _progress_failure(deployment: Mapping[str, Any]) -> ConditionState | None:
    """The Deployment's ``Progressing`` False (e.g. ProgressDeadlineExceeded)."""
    progressing = conditions_of(deployment).get(conditions.DEPLOYMENT_PROGRESSING)
    if progressing is not None and progressing.get("status") == "False":
        return ConditionState(
            "False",
            str(progressing.get("reason") or conditions.PROGRESS_FAILED),
            str(progressing.get("message") or ""),
        )
    return None


def _operator_fault(missing_pvcs: list[str], error: str | None, namespace: str) -> ConditionState | None:
    if error is not None:
        return ConditionState("False", conditions.RECONCILE_FAILED, error)
    if missing_pvcs:
        names = ", ".join(missing_pvcs)
        return ConditionState(
            "False",
            conditions.PERSISTENT_VOLUME_CLAIM_NOT_FOUND,
            f"PersistentVolumeClaim {names} not found in {namespace}",
        )
    return None


def _deployment_fault(
    deployment: Mapping[str, Any],
    rollout: Rollout,
    pods: Sequence[Mapping[str, Any]] | None,
    model_image: str | None,
) -> ConditionState | None:
    """The Deployment's ``ReplicaFailure``; else, while the rollout is not complete, a lasting problem
    of the new ReplicaSet's pods (:func:`pod_problem`); else the Deployment's ``Progressing`` False.
    The pods' problem goes before ProgressDeadlineExceeded: it names the cause, and the reason does not
    change when the deadline passes."""
    fault = _replica_failure(deployment)
    if fault is None and not rollout.complete and pods:
        fault = pod_problem(new_pods(pods, rollout.new_hash), model_image)
    return fault or _progress_failure(deployment)


def health(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
    replicasets: Sequence[Mapping[str, Any]] | None = None,
    model_image: str | None = None,
    at_zero: str | None = None,
) -> Health:
    """The conditions of an InferenceService, from what only the operator can see and the Deployment.

    Faults first (``Ready=False`` with their reason, ``Stalled=True``: :func:`stalled_state`): an
    apply error; a missing PersistentVolumeClaim; the Deployment's ``ReplicaFailure`` (True); while
    the rollout is not complete, a lasting problem of the new ReplicaSet's pods (:func:`pod_problem`:
    the model's fetch or load, memory, bad image, crash loop, unschedulable; ``model_image``: an
    ``oci://`` model's image); the Deployment's ``Progressing`` (False, e.g. ProgressDeadlineExceeded).
    Else, while the rollout is not complete (:attr:`Rollout.complete`), ``Ready=False Progressing`` and
    ``Reconciling=True`` with the counts; else ``Ready=True`` (the reason of the Deployment's
    ``Available`` condition carried over; with ``pods``, :attr:`Health.note` says what the model's
    fetch took). ``Serving`` follows the ready pods in every case, but at zero: ``at_zero`` (the words
    of a service scaled to zero on purpose, ``None``: scale to zero is not in force) makes a Deployment
    without a fault whose ``spec.replicas`` is 0 ``Ready=True`` and ``Serving=False``, both with reason
    ``ScaledToZero`` and those words, nothing in flight (kstatus Current, Argo CD Healthy); a pod still
    going away does not make the scale-down read as a rollout.
    """
    rollout = rollout_of(deployment, replicasets) if deployment is not None else None
    serving = serving_state(rollout)
    fault = _operator_fault(missing_pvcs, error, namespace)
    if fault is None and deployment is None:
        creating = ConditionState("False", conditions.CREATING, "waiting for the Deployment to be created")
        reconciling = ConditionState("True", conditions.CREATING, creating.message)
        return Health(creating, serving, reconciling=reconciling, stalled=stalled_state(creating))
    if fault is None and deployment is not None and rollout is not None:
        fault = _deployment_fault(deployment, rollout, pods, model_image)
    if fault is not None:
        return Health(fault, serving, stalled=stalled_state(fault), rollout=rollout)
    assert deployment is not None and rollout is not None
    if not rollout.complete:
        progressing = ConditionState("False", conditions.PROGRESSING, rollout.message())
        reconciling = ConditionState("True", conditions.ROLLOUT_IN_PROGRESS, rollout.message())
        return Health(
            progressing, serving, reconciling=reconciling, stalled=stalled_state(progressing), rollout=rollout
        )
    if at_zero is not None and rollout.desired == 0:
        # scaled to zero on purpose: healthy (Ready=True, nothing in flight), not serving until a
        # request brings a replica back
        return Health(
            ConditionState("True", conditions.SCALED_TO_ZERO, at_zero),
            ConditionState("False", conditions.SCALED_TO_ZERO, at_zero),
            rollout=rollout,
        )
    available = conditions_of(deployment).get(conditions.DEPLOYMENT_AVAILABLE) or {}
    reason = str(available.get("reason") or conditions.ROLLOUT_COMPLETE)
    message = f"{rollout.summary()} replicas ready"
    note = fetch_note(new_pods(pods, rollout.new_hash)) if pods else None
    return Health(ConditionState("True", reason, message), serving, rollout=rollout, note=note)


def ready_state(
    deployment: Mapping[str, Any] | None,
    *,
    missing_pvcs: list[str],
    error: str | None,
    namespace: str,
    pods: Sequence[Mapping[str, Any]] | None = None,
    model_image: str | None = None,
) -> ConditionState:
    """The ``Ready`` condition alone (:func:`health`)."""
    return health(
        deployment,
        missing_pvcs=missing_pvcs,
        error=error,
        namespace=namespace,
        pods=pods,
        model_image=model_image,
    ).ready
