"""The model's faults in status (operator/reconcile/diagnosis.py): ModelFetchFailed (the fetch init
container failed, cannot start, or an OCI model image cannot be pulled), ModelLoadFailed, OOMKilled, each
with the container's own one-line termination message, never a log tail; and the same reason, message and
Stalled=True through every state a pod goes through while the fault lasts (crash, back-off, running
again), so that kstatus and Argo CD do not alternate Failed and InProgress."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubeinfer.operator.reconcile import diagnosis, report
from kubeinfer.operator.reconcile import events as reconcile_events

from tests.unit.operator.test_operator_health import deployment, replicaset

MODEL_IMAGE = "registry.example.com/models/bert:v1"
FETCH_CAUSE = "s3://models/bert: 403 AccessDenied"
LOAD_CAUSE = "model load failed: OSError: /mnt/models does not appear to have a file named config.json"


def _pod(
    *,
    init: list[dict[str, Any]] | None = None,
    runtime: dict[str, Any] | None = None,
    policy: str = "File",
    name: str = "m-new-1",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if init is not None:
        status["initContainerStatuses"] = init
    if runtime is not None:
        status["containerStatuses"] = [{"name": "runtime", "ready": False, "restartCount": 0, **runtime}]
    return {
        "metadata": {"name": name, "labels": {"pod-template-hash": "new"}},
        "spec": {
            "initContainers": [{"name": "fetch", "terminationMessagePolicy": "File"}],
            "containers": [
                {
                    "name": "runtime",
                    "terminationMessagePolicy": policy,
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                }
            ],
        },
        "status": status,
    }


def _fetch(state: dict[str, Any], *, last: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "fetch", "ready": False, "restartCount": restarts, "state": state}
    if last is not None:
        cs["lastState"] = {"terminated": last}
    return cs


def _failed(message: str, *, code: int = 1, reason: str = "Error", t: int = 10) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": reason,
        "message": message + "\n",
        "startedAt": f"2026-01-01T00:00:{t:02d}Z",
        "finishedAt": f"2026-01-01T00:00:{t + 2:02d}Z",
    }


DONE = {"terminated": {"exitCode": 0, "reason": "Completed"}}
RUNNING = {"running": {"startedAt": "2026-01-01T00:01:00Z"}}
BACK_OFF = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}}
INITIALIZING = {"waiting": {"reason": "PodInitializing"}}


def _health(pods: list[dict[str, Any]], model_image: str | None = None) -> diagnosis.Health:
    dep = deployment(replicas=1, updated=1, ready=0)
    return diagnosis.health(
        dep,
        missing_pvcs=[],
        error=None,
        namespace="ns",
        pods=pods,
        replicasets=[replicaset("2", "new", 0)],
        model_image=model_image,
    )


def test_fetch_init_container_failure_is_model_fetch_failed_with_its_cause() -> None:
    pod = _pod(init=[_fetch({"terminated": _failed(FETCH_CAUSE)})], runtime={"state": INITIALIZING})
    h = _health([pod])
    assert (h.ready.status, h.ready.reason) == ("False", "ModelFetchFailed")
    assert h.ready.message == f"pod m-new-1 init container fetch: {FETCH_CAUSE}"
    assert h.stalled is not None and (h.stalled.reason, h.stalled.message) == (
        "ModelFetchFailed",
        h.ready.message,
    )
    assert h.reconciling is None


def test_fetch_without_a_message_gives_the_exit_code() -> None:
    pod = _pod(init=[_fetch({"terminated": {"exitCode": 2, "reason": "Error"}})])
    assert _health([pod]).ready.message == "pod m-new-1 init container fetch: fetch failed, exit code 2"


def test_missing_secret_of_the_fetch_is_model_fetch_failed() -> None:
    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s3-creds" not found'}}
    h = _health([_pod(init=[_fetch(waiting)], runtime={"state": INITIALIZING})])
    assert (h.ready.reason, h.ready.message) == (
        "ModelFetchFailed",
        'pod m-new-1 init container fetch: secret "s3-creds" not found',
    )
    key = {
        "waiting": {
            "reason": "CreateContainerConfigError",
            "message": "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ns/s3-creds",
        }
    }
    assert "AWS_SECRET_ACCESS_KEY" in _health([_pod(init=[_fetch(key)])]).ready.message


@pytest.mark.parametrize(
    "state",
    [
        {
            "waiting": {
                "reason": "ErrImagePull",
                "message": f'failed to pull and unpack image "{MODEL_IMAGE}": failed to resolve reference '
                f'"{MODEL_IMAGE}": {MODEL_IMAGE}: not found',
            }
        },
        {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{MODEL_IMAGE}"'}},
    ],
    ids=["ErrImagePull", "ImagePullBackOff"],
)
def test_model_image_volume_that_cannot_be_pulled_is_model_fetch_failed(state: dict[str, Any]) -> None:
    h = _health([_pod(runtime={"state": state})], model_image=MODEL_IMAGE)
    assert h.ready.reason == "ModelFetchFailed"
    assert h.ready.message.startswith(f"pod m-new-1 container runtime: model image {MODEL_IMAGE}: ")
    assert h.stalled is not None and h.stalled.reason == "ModelFetchFailed"


def test_runtime_image_that_cannot_be_pulled_stays_an_image_problem() -> None:
    runtime_image = {
        "waiting": {
            "reason": "ErrImagePull",
            "message": 'failed to pull image "ghcr.io/kubeinfer/runtime:nope"',
        }
    }
    h = _health([_pod(runtime={"state": runtime_image})], model_image=MODEL_IMAGE)
    assert h.ready.reason == "ImagePullBackOff"  # ErrImagePull and ImagePullBackOff alternate: one reason
    assert diagnosis.names_image('Back-off pulling image "registry.example.com/models/bert:v2"', MODEL_IMAGE)
    assert not diagnosis.names_image('pulling image "registry.example.com/models/bert-large:v1"', MODEL_IMAGE)


def test_model_that_does_not_load_is_model_load_failed_with_the_runtime_message() -> None:
    pod = _pod(
        init=[_fetch(DONE)],
        runtime={"state": BACK_OFF, "restartCount": 1, "lastState": {"terminated": _failed(LOAD_CAUSE)}},
    )
    h = _health([pod])
    assert (h.ready.reason, h.ready.message) == (
        "ModelLoadFailed",
        f"pod m-new-1 container runtime: exit code 1 (Error): {LOAD_CAUSE}",
    )


def test_oom_killed_names_the_memory_limit() -> None:
    oom = {"exitCode": 137, "reason": "OOMKilled", "message": ""}
    h = _health([_pod(runtime={"state": BACK_OFF, "restartCount": 2, "lastState": {"terminated": oom}})])
    assert (h.ready.reason, h.ready.message) == (
        "OOMKilled",
        "pod m-new-1 container runtime: killed for memory, exit code 137 (memory limit 4Gi)",
    )
    fetch_oom = _pod(init=[_fetch({"terminated": oom})])
    assert _health([fetch_oom]).ready.reason == "OOMKilled"


def test_a_log_tail_never_reaches_status() -> None:
    """A pod of an older operator (FallbackToLogsOnError): its message is a log tail, and is dropped."""
    log_tail = "Traceback (most recent call last):\n  File x\nKeyError: 'secret-looking-value'"
    terminated = {"exitCode": 1, "reason": "Error", "message": log_tail}
    pod = _pod(
        runtime={"state": BACK_OFF, "lastState": {"terminated": terminated}}, policy="FallbackToLogsOnError"
    )
    h = _health([pod])
    assert h.ready.message == "pod m-new-1 container runtime: exit code 1 (Error)"
    assert "secret-looking-value" not in h.ready.message


def test_termination_message_is_one_line_and_bounded() -> None:
    long = "model load failed: ValueError: " + "y" * 5000 + "\nsecond line\x1b[31m"
    pod = _pod(runtime={"state": BACK_OFF, "lastState": {"terminated": _failed(long)}})
    message = _health([pod]).ready.message
    assert "\n" not in message and "\x1b" not in message and message.endswith("...")
    assert len(message) < 600


def test_a_ready_container_that_crashed_long_ago_is_no_fault() -> None:
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    pod = _pod(runtime={"state": RUNNING, "ready": True, "restartCount": 1, "lastState": {"terminated": oom}})
    assert diagnosis.pod_problem([pod]) is None
    succeeded = _pod(init=[_fetch(DONE, last=_failed(FETCH_CAUSE), restarts=1)], runtime={"state": RUNNING})
    assert diagnosis.pod_problem([succeeded]) is None  # the retried fetch succeeded: loading now


# --- stable while the fault lasts ------------------------------------------------------------------


def _fetch_cycle() -> Iterator[dict[str, Any]]:
    """The states a pod goes through while its fetch keeps failing with the same cause."""
    for n in range(3):
        failed = _failed(FETCH_CAUSE, t=10 * n)
        yield _pod(init=[_fetch({"terminated": failed}, restarts=n)], runtime={"state": INITIALIZING})
        yield _pod(init=[_fetch(BACK_OFF, last=failed, restarts=n)], runtime={"state": INITIALIZING})
        running = {"running": {"startedAt": f"2026-01-01T00:01:{n:02d}Z"}}
        yield _pod(init=[_fetch(running, last=failed, restarts=n + 1)], runtime={"state": INITIALIZING})


def _load_cycle() -> Iterator[dict[str, Any]]:
    """The states a pod goes through while its model keeps failing to load."""
    for n in range(3):
        failed = _failed(LOAD_CAUSE, t=10 * n)
        last = {"lastState": {"terminated": failed}} if n else {}
        yield _pod(init=[_fetch(DONE)], runtime={"state": {"terminated": failed}, "restartCount": n, **last})
        yield _pod(
            init=[_fetch(DONE)],
            runtime={"state": BACK_OFF, "restartCount": n, "lastState": {"terminated": failed}},
        )
        running = {"running": {"startedAt": f"2026-01-01T00:01:{n:02d}Z"}}
        yield _pod(
            init=[_fetch(DONE)],
            runtime={"state": running, "restartCount": n + 1, "lastState": {"terminated": failed}},
        )


def _oom_cycle() -> Iterator[dict[str, Any]]:
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    for n in range(3):
        yield _pod(runtime={"state": {"terminated": oom}, "restartCount": n})
        yield _pod(runtime={"state": BACK_OFF, "restartCount": n, "lastState": {"terminated": oom}})
        yield _pod(runtime={"state": RUNNING, "restartCount": n + 1, "lastState": {"terminated": oom}})


def _pull_cycle() -> Iterator[dict[str, Any]]:
    for _ in range(3):
        yield _pod(
            runtime={
                "state": {"waiting": {"reason": "ErrImagePull", "message": f'"{MODEL_IMAGE}": not found'}}
            }
        )
        yield _pod(
            runtime={
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{MODEL_IMAGE}"',
                    }
                }
            }
        )


@pytest.mark.parametrize(
    "cycle, reason, image",
    [
        (_fetch_cycle, "ModelFetchFailed", None),
        (_load_cycle, "ModelLoadFailed", None),
        (_oom_cycle, "OOMKilled", None),
        (_pull_cycle, "ModelFetchFailed", MODEL_IMAGE),
    ],
    ids=["fetch", "load", "oom", "image-volume"],
)
def test_reason_and_stalled_stay_put_through_the_restart_cycle(
    cycle: Any, reason: str, image: str | None
) -> None:
    """Each reconcile sees the pod in the next state; the conditions never flip, one Warning Event in all."""
    lupa = pytest.importorskip("lupa")
    del lupa
    from tests.unit.operator.test_operator_argocd_health import argocd

    conditions: list[dict[str, Any]] = []
    warnings: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str, str | None, str | None]] = set()
    messages: set[str] = set()
    for pod in cycle():
        h = _health([pod], model_image=image)
        before = copy.deepcopy(conditions)
        conditions = report.conditions_for({"conditions": before}, h, "T", 2, autoscaling=False)
        warnings += reconcile_events.transition_events(before, conditions)
        by_type = {c["type"]: c for c in conditions}
        seen.add(
            (
                by_type["Ready"]["reason"],
                by_type["Ready"]["status"],
                (by_type.get("Stalled") or {}).get("status"),
                (by_type.get("Reconciling") or {}).get("status"),
            )
        )
        messages.add(by_type["Ready"]["message"])
        health = argocd(
            {
                "metadata": {"name": "m", "generation": 2},
                "status": {"observedGeneration": 2, "conditions": conditions},
            }
        )
        assert health[0] == "Degraded", health
    assert seen == {(reason, "False", "True", None)}
    # no back-off time or restart count in the message: no status write per restart (the kubelet's own
    # messages of a failing pull and of its back-off alternate: at most those two)
    assert len(messages) == (2 if image else 1), messages
    assert [(t, r) for t, r, _ in warnings] == [("Warning", reason)]


def test_the_pods_cause_wins_over_the_progress_deadline() -> None:
    dep = deployment(replicas=1, updated=1, ready=0)
    dep["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "x"}
    ]
    pod = _pod(init=[_fetch({"terminated": _failed(FETCH_CAUSE)})])
    h = diagnosis.health(
        dep, missing_pvcs=[], error=None, namespace="ns", pods=[pod], replicasets=[replicaset("2", "new", 0)]
    )
    assert h.ready.reason == "ModelFetchFailed"
    assert (
        diagnosis.health(dep, missing_pvcs=[], error=None, namespace="ns").ready.reason
        == "ProgressDeadlineExceeded"
    )


# --- the Ready Event mentions the fetch --------------------------------------------------------------


def test_ready_event_mentions_what_the_fetch_took() -> None:
    fetched = {
        "terminated": {
            "exitCode": 0,
            "reason": "Completed",
            "message": "fetched 3 files, 87.2 MB in 4.1 s from s3://models/bert\n",
            "startedAt": "2026-01-01T00:00:01Z",
            "finishedAt": "2026-01-01T00:00:06Z",
        }
    }
    pod = _pod(init=[_fetch(fetched)], runtime={"state": RUNNING, "ready": True})
    done = diagnosis.health(
        deployment(replicas=1, updated=1, ready=1),
        missing_pvcs=[],
        error=None,
        namespace="ns",
        pods=[pod],
        replicasets=[replicaset("2", "new", 1)],
    )
    assert done.ready.status == "True"
    assert (
        done.note
        == "model fetched in 5 s (pod m-new-1): fetched 3 files, 87.2 MB in 4.1 s from s3://models/bert"
    )
    rolling = report.conditions_for({}, _health([_pod(init=[_fetch(RUNNING)])]), "T1", 2, autoscaling=False)
    ready = report.conditions_for({"conditions": rolling}, done, "T2", 2, autoscaling=False)
    assert reconcile_events.transition_events(rolling, ready, done.note) == [
        ("Normal", "RolloutFinished", f"Ready=True: 1/1 replicas ready; {done.note}")
    ]
    # the note is in the Event only: the condition reads the same with or without the pods listed
    without = diagnosis.health(
        deployment(replicas=1, updated=1, ready=1), missing_pvcs=[], error=None, namespace="ns"
    )
    assert without.note is None and without.ready == done.ready
    no_message = _pod(init=[_fetch({"terminated": {**fetched["terminated"], "message": ""}})])
    assert diagnosis.fetch_note([no_message]) == "model fetched in 5 s (pod m-new-1)"


def test_a_model_under_its_quality_gate_is_quantization_below_gate_with_the_figures() -> None:
    from kubeinfer.runtime.models.quantize import QuantizationBelowGate

    # the runtime's error type bears the reason's name: its termination message names it
    assert QuantizationBelowGate.__name__ == "QuantizationBelowGate"
    cause = (
        "model load failed: QuantizationBelowGate: quantization below the gate: mean cosine 0.981 < "
        "min_cosine 0.99 against fp32 on 200 gate texts"
    )
    pod = _pod(
        init=[_fetch(DONE)],
        runtime={"state": BACK_OFF, "restartCount": 1, "lastState": {"terminated": _failed(cause)}},
    )
    h = _health([pod])
    assert (h.ready.reason, h.ready.message) == (
        "QuantizationBelowGate",
        f"pod m-new-1 container runtime: exit code 1 (Error): {cause}",
    )
    assert h.stalled is not None and h.stalled.reason == "QuantizationBelowGate"
